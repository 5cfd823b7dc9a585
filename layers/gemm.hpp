#pragma once
/// \file
/// The one matrix product every layer uses, and the process-wide choice of its engine.
///
/// Two engines are compiled in when OpenBLAS is found: Eigen's own kernels
/// (vectorised for the `NERVE_ARCH` the library is built for; AVX-512 with the
/// default `native` on these machines) and OpenBLAS's `cblas_?gemm`. The default
/// is the faster one measured on the build machine class (see docs/layers.md):
/// Eigen when the build targets AVX-512, OpenBLAS otherwise.

#include <cstdint>
#include <string_view>

namespace nerve::layers {

/// Which library runs the products.
enum class gemm_engine { eigen, openblas };

/// Selects the engine for every later product (process-wide). Throws if
/// `openblas` was not compiled in. Call before work starts, not while layers run.
void set_gemm_engine(gemm_engine engine);
/// The engine in use.
gemm_engine current_gemm_engine() noexcept;
/// True when OpenBLAS was found at build time.
bool has_openblas() noexcept;
/// `"eigen"` or `"openblas"`.
std::string_view to_string(gemm_engine engine) noexcept;

/// Threads one product may use (both engines; process-wide). Default 1: the
/// actor runtime's event loops own the cores, so a product does not start a
/// thread pool of its own unless asked. The direct executor and benchmarks set
/// it to the run's thread count. Eigen's threads come from OpenMP
/// (`Eigen::setNbThreads`), OpenBLAS's from `openblas_set_num_threads`.
/// Call before work starts, from one thread.
void set_gemm_threads(int threads);
/// The current product thread count.
int gemm_threads() noexcept;

/// Whether an operand is used as stored or transposed.
enum class trans : bool { no = false, yes = true };

/// `C = alpha · op(A) · op(B) + beta · C`, all row-major.
///
/// `op(A)` is `m × k`, `op(B)` is `k × n`, `C` is `m × n`; `lda`, `ldb`, `ldc` are
/// the row strides of the matrices as stored. With `beta = 1` the product
/// accumulates (gradient accumulation and bias fusion rely on it). Callable
/// from any thread; products on different threads do not share state.
template <class Scalar>
void gemm(trans ta, trans tb, std::int64_t m, std::int64_t n, std::int64_t k, Scalar alpha, const Scalar* a,
          std::int64_t lda, const Scalar* b, std::int64_t ldb, Scalar beta, Scalar* c, std::int64_t ldc);

}  // namespace nerve::layers

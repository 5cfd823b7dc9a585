#include "layers/gemm.hpp"

#include <Eigen/Core>

#include <algorithm>
#include <atomic>
#include <stdexcept>

#if NERVE_HAS_OPENBLAS
#include <cblas.h>
extern "C" void openblas_set_num_threads(int);
#endif

namespace nerve::layers {
namespace {

// Measured on the 2-core AMD EPYC (Zen 5) build machines, float 1024^3: Eigen
// with AVX-512 ~140 GFLOP/s on one thread vs OpenBLAS 0.3.21 ~105 (it does not
// know the CPU and runs its Haswell kernels); without AVX-512 they tie on
// AVX2 and OpenBLAS wins on plain SSE2 builds.
constexpr gemm_engine default_engine() {
#if defined(__AVX512F__) || !NERVE_HAS_OPENBLAS
  return gemm_engine::eigen;
#else
  return gemm_engine::openblas;
#endif
}

std::atomic<gemm_engine> engine_{default_engine()};
std::atomic<int> threads_{0};

int init_threads() {
  // First use: pin both engines to one thread so no pool competes with the
  // event loops until someone asks for more.
  int expected = 0;
  if (threads_.compare_exchange_strong(expected, 1)) {
    Eigen::setNbThreads(1);
#if NERVE_HAS_OPENBLAS
    openblas_set_num_threads(1);
#endif
  }
  return threads_.load();
}

template <class Scalar>
using row_major = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class Scalar>
using const_map = Eigen::Map<const row_major<Scalar>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <class Scalar>
using map = Eigen::Map<row_major<Scalar>, Eigen::Unaligned, Eigen::OuterStride<>>;

template <class Scalar, class A, class B>
void eigen_product(Scalar alpha, const A& a, const B& b, Scalar beta, map<Scalar>& c) {
  if (beta == Scalar(0)) {
    if (alpha == Scalar(1))
      c.noalias() = a * b;
    else
      c.noalias() = alpha * (a * b);
  } else {
    if (beta != Scalar(1)) c *= beta;
    if (alpha == Scalar(1))
      c.noalias() += a * b;
    else
      c.noalias() += alpha * (a * b);
  }
}

template <class Scalar>
void eigen_gemm(trans ta, trans tb, std::int64_t m, std::int64_t n, std::int64_t k, Scalar alpha, const Scalar* a,
                std::int64_t lda, const Scalar* b, std::int64_t ldb, Scalar beta, Scalar* c, std::int64_t ldc) {
  // Stored shapes: A is (ta ? k×m : m×k), B is (tb ? n×k : k×n).
  const_map<Scalar> A(a, ta == trans::yes ? k : m, ta == trans::yes ? m : k, Eigen::OuterStride<>(lda));
  const_map<Scalar> B(b, tb == trans::yes ? n : k, tb == trans::yes ? k : n, Eigen::OuterStride<>(ldb));
  map<Scalar> C(c, m, n, Eigen::OuterStride<>(ldc));
  if (ta == trans::no && tb == trans::no) eigen_product(alpha, A, B, beta, C);
  else if (ta == trans::no) eigen_product(alpha, A, B.transpose(), beta, C);
  else if (tb == trans::no) eigen_product(alpha, A.transpose(), B, beta, C);
  else eigen_product(alpha, A.transpose(), B.transpose(), beta, C);
}

}  // namespace

void set_gemm_engine(gemm_engine engine) {
#if !NERVE_HAS_OPENBLAS
  if (engine == gemm_engine::openblas) throw std::invalid_argument("gemm: this build has no OpenBLAS");
#endif
  engine_.store(engine);
}
gemm_engine current_gemm_engine() noexcept { return engine_.load(); }
bool has_openblas() noexcept { return NERVE_HAS_OPENBLAS != 0; }
std::string_view to_string(gemm_engine engine) noexcept { return engine == gemm_engine::eigen ? "eigen" : "openblas"; }

void set_gemm_threads(int threads) {
  threads = std::max(1, threads);
  threads_.store(threads);
  Eigen::setNbThreads(threads);
#if NERVE_HAS_OPENBLAS
  openblas_set_num_threads(threads);
#endif
}
int gemm_threads() noexcept { return init_threads(); }

template <class Scalar>
void gemm(trans ta, trans tb, std::int64_t m, std::int64_t n, std::int64_t k, Scalar alpha, const Scalar* a,
          std::int64_t lda, const Scalar* b, std::int64_t ldb, Scalar beta, Scalar* c, std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  init_threads();
  if (k == 0) {
    map<Scalar> C(c, m, n, Eigen::OuterStride<>(ldc));
    if (beta == Scalar(0)) C.setZero(); else C *= beta;
    return;
  }
#if NERVE_HAS_OPENBLAS
  if (engine_.load(std::memory_order_relaxed) == gemm_engine::openblas) {
    const auto TA = ta == trans::yes ? CblasTrans : CblasNoTrans;
    const auto TB = tb == trans::yes ? CblasTrans : CblasNoTrans;
    if constexpr (std::is_same_v<Scalar, float>)
      cblas_sgemm(CblasRowMajor, TA, TB, int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
    else
      cblas_dgemm(CblasRowMajor, TA, TB, int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
    return;
  }
#endif
  eigen_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

template void gemm<float>(trans, trans, std::int64_t, std::int64_t, std::int64_t, float, const float*, std::int64_t,
                          const float*, std::int64_t, float, float*, std::int64_t);
template void gemm<double>(trans, trans, std::int64_t, std::int64_t, std::int64_t, double, const double*,
                           std::int64_t, const double*, std::int64_t, double, double*, std::int64_t);

}  // namespace nerve::layers

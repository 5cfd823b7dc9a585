#pragma once
/// \file
/// The one check macro of the CUDA backend: a status other than success becomes
/// a `gpu::error` naming the call, file and line, and the CUDA (or cuBLAS)
/// error. Never aborts. Internal to the CUDA module: includes CUDA headers.
///
/// The module owns no error category and no `gpu::error` (cuda_module.hpp says
/// why): both come from the program through `host()`.

#include "gpu/detail/cuda_module.hpp"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

namespace nerve::gpu::detail::cuda {

/// What the program lent the module when it opened it (set before any other call).
const cuda_module_host& host() noexcept;

inline std::error_code to_error_code(cudaError_t e) noexcept {
  return {static_cast<int>(e), host().cuda_category()};
}
inline std::error_code to_error_code(cublasStatus_t s) noexcept {
  return {static_cast<int>(s), host().cublas_category()};
}

inline void check(cudaError_t e, const char* call, const char* file, int line) {
  if (e != cudaSuccess) host().throw_error(to_error_code(e), call, file, line);
}
inline void check(cublasStatus_t s, const char* call, const char* file, int line) {
  if (s != CUBLAS_STATUS_SUCCESS) host().throw_error(to_error_code(s), call, file, line);
}

}  // namespace nerve::gpu::detail::cuda

/// Checks a `cudaError_t` or `cublasStatus_t` expression; throws `nerve::gpu::error`.
#define NERVE_CUDA_CHECK(expr) ::nerve::gpu::detail::cuda::check((expr), #expr, __FILE__, __LINE__)

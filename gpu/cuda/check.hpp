#pragma once
/// \file
/// The one check macro of the CUDA backend: a status other than success becomes
/// a `gpu::error` naming the call, file and line, and the CUDA (or cuBLAS)
/// error. Never aborts. Internal: includes CUDA headers.

#include "gpu/status.hpp"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

namespace nerve::gpu::detail::cuda {

inline std::error_code to_error_code(cudaError_t e) noexcept { return {static_cast<int>(e), cuda_category()}; }
inline std::error_code to_error_code(cublasStatus_t s) noexcept { return {static_cast<int>(s), cublas_category()}; }

inline void check(cudaError_t e, const char* call, const char* file, int line) {
  if (e != cudaSuccess) throw error(to_error_code(e), call, file, line);
}
inline void check(cublasStatus_t s, const char* call, const char* file, int line) {
  if (s != CUBLAS_STATUS_SUCCESS) throw error(to_error_code(s), call, file, line);
}

}  // namespace nerve::gpu::detail::cuda

/// Checks a `cudaError_t` or `cublasStatus_t` expression; throws `nerve::gpu::error`.
#define NERVE_CUDA_CHECK(expr) ::nerve::gpu::detail::cuda::check((expr), #expr, __FILE__, __LINE__)

#pragma once
// Loading kernels before their first launch (see cuda_kernels::preload in launch.hpp).
#include <cuda_runtime_api.h>

#include <vector>

namespace nerve::gpu::cuda_kernels {

/// Loads each kernel now: cudaFuncGetAttributes references it, and CUDA's lazy loading
/// loads a kernel at its first reference. Returns the first error.
inline cudaError_t load_now(const std::vector<const void*>& kernels) {
  for (const void* k : kernels) {
    cudaFuncAttributes a{};
    if (const cudaError_t e = cudaFuncGetAttributes(&a, k); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace nerve::gpu::cuda_kernels

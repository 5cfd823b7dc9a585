#pragma once
// Grid-stride launches shared by the kernels, and their loading before the first launch.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <variant>
#include <vector>

namespace nerve::gpu::cuda_kernels {

constexpr int block_size = 256;

/// Blocks for n elements, one element per thread up to a cap (grid-stride beyond).
inline unsigned grid_for(std::size_t n) {
  const std::size_t blocks = (n + block_size - 1) / block_size;
  return static_cast<unsigned>(blocks < 65535u * 16u ? (blocks ? blocks : 1) : 65535u * 16u);
}

/// Loads each kernel now (see cuda_kernels::preload_elementwise in launch.hpp):
/// cudaFuncGetAttributes references it, and CUDA's lazy loading loads a kernel at its
/// first reference. Returns the first error.
inline cudaError_t load_now(const std::vector<const void*>& kernels) {
  for (const void* k : kernels) {
    cudaFuncAttributes a{};
    if (const cudaError_t e = cudaFuncGetAttributes(&a, k); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

namespace {

/// `op(i)` for every i < n (an op of gpu/kernels/ops.hpp), indices of type I. Internal to
/// each .cu file, so no two files share a kernel symbol.
template <class I, class Op>
__global__ void each_kernel(Op op, I n) {
  for (I i = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x); i < n; i += I(gridDim.x) * I(blockDim.x)) op(i);
}

/// Enqueues `op` over n elements on `st`.
template <class I, class Op>
void launch_each(cudaStream_t st, std::size_t n, const Op& op) {
  each_kernel<I><<<grid_for(n), block_size, 0, st>>>(op, I(n));
}

/// Appends the kernels `launch_each<I>` runs for every alternative of a variant of ops,
/// for cuda_kernels::load_now.
template <class I, class... Ops>
void add_kernels(std::vector<const void*>& out, const std::variant<Ops...>*) {
  (out.push_back(reinterpret_cast<const void*>(&each_kernel<I, Ops>)), ...);
}

}  // namespace
}  // namespace nerve::gpu::cuda_kernels

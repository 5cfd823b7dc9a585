#pragma once
// Grid-stride helpers shared by the kernels.
#include <cstddef>
#include <cstdint>

namespace nerve::gpu::cuda_kernels {

constexpr int block_size = 256;

/// Blocks for n elements, one element per thread up to a cap (grid-stride beyond).
inline unsigned grid_for(std::size_t n) {
  const std::size_t blocks = (n + block_size - 1) / block_size;
  return static_cast<unsigned>(blocks < 65535u * 16u ? (blocks ? blocks : 1) : 65535u * 16u);
}

#define NERVE_GRID_STRIDE(i, n)                                                        \
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;          \
       i < std::int64_t(n); i += std::int64_t(gridDim.x) * blockDim.x)

}  // namespace nerve::gpu::cuda_kernels

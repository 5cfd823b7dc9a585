// The pointwise kernels (their bodies are gpu/kernels/ops.hpp's), and column sums.
#include "gpu/kernels/grid.cuh"
#include "gpu/kernels/launch.hpp"
#include "gpu/kernels/ops.hpp"

#include <vector>

namespace nerve::gpu::cuda_kernels {
namespace {

// A block sums a tile of 32 columns: thread (tx, ty) adds rows ty, ty + 32, … of column
// tile·32 + tx in double (a warp reads 32 neighbouring floats), then row 0 of the block
// adds the 32 partial sums in order. The order depends on the shape alone: deterministic,
// and in double like the CPU twin (which adds the rows one by one), so the two differ by
// the final rounding and the double sums' orders (docs/gpu.md has the measured gain).
constexpr int sums_tile = 32;

__global__ void column_sums_kernel(const float* __restrict__ x, std::size_t rows, std::size_t cols, float* out,
                                   float beta) {
  __shared__ double part[sums_tile][sums_tile + 1];
  const std::size_t c = std::size_t(blockIdx.x) * sums_tile + threadIdx.x;
  double acc = 0.0;
  if (c < cols)
    for (std::size_t r = threadIdx.y; r < rows; r += sums_tile) acc += x[r * cols + c];
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    double sum = 0.0;
    for (int k = 0; k < sums_tile; ++k) sum += part[k][threadIdx.x];
    out[c] = beta == 0.0f ? float(sum) : float(sum + double(beta) * out[c]);
  }
}

}  // namespace

void each(cudaStream_t st, std::size_t n, const ops::pointwise_op& op) {
  std::visit([&](const auto& o) { launch_each<std::int64_t>(st, n, o); }, op);
}

void column_sums(cudaStream_t st, const float* x, std::size_t rows, std::size_t cols, float* out, float beta) {
  const unsigned blocks = unsigned((cols + sums_tile - 1) / sums_tile);
  column_sums_kernel<<<blocks, dim3(sums_tile, sums_tile), 0, st>>>(x, rows, cols, out, beta);
}

cudaError_t preload_elementwise() {
  std::vector<const void*> kernels{reinterpret_cast<const void*>(&column_sums_kernel)};
  add_kernels<std::int64_t>(kernels, static_cast<const ops::pointwise_op*>(nullptr));
  return load_now(kernels);
}

}  // namespace nerve::gpu::cuda_kernels

// Softmax cross-entropy forward, one warp per row (backward is a pointwise op).
#include "gpu/kernels/grid.cuh"
#include "gpu/kernels/launch.hpp"

#include <cfloat>

namespace nerve::gpu::cuda_kernels {
namespace {

constexpr int warps_per_block = 8;

__global__ void xent_fwd(const float* __restrict__ logits, const std::int32_t* __restrict__ labels,
                         std::size_t rows, std::size_t cols, float* probs, float* loss, float* correct) {
  const std::size_t row = std::size_t(blockIdx.x) * warps_per_block + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float* z = logits + row * cols;
  // Arg-max: the largest value, the first index among equals (as the CPU twin).
  float best = -FLT_MAX;
  long long arg = -1;
  for (std::size_t c = lane; c < cols; c += 32)
    if (arg < 0 || z[c] > best) {
      best = z[c];
      arg = (long long)c;
    }
  for (int off = 16; off > 0; off /= 2) {
    const float ob = __shfl_down_sync(0xffffffffu, best, off);
    const long long oa = __shfl_down_sync(0xffffffffu, arg, off);
    if (oa >= 0 && (arg < 0 || ob > best || (ob == best && oa < arg))) {
      best = ob;
      arg = oa;
    }
  }
  best = __shfl_sync(0xffffffffu, best, 0);
  arg = __shfl_sync(0xffffffffu, arg, 0);
  double sum = 0.0;
  for (std::size_t c = lane; c < cols; c += 32) sum += exp(double(z[c]) - double(best));
  for (int off = 16; off > 0; off /= 2) sum += __shfl_down_sync(0xffffffffu, sum, off);
  sum = __shfl_sync(0xffffffffu, sum, 0);
  for (std::size_t c = lane; c < cols; c += 32) probs[row * cols + c] = float(exp(double(z[c]) - double(best)) / sum);
  if (lane == 0) {
    const std::int32_t label = labels[row];
    loss[row] = float(double(best) + log(sum) - double(z[label]));
    if (arg == label) atomicAdd(correct, 1.0f);
  }
}

}  // namespace

void softmax_xent_forward(cudaStream_t st, const float* logits, const std::int32_t* labels, std::size_t rows,
                          std::size_t cols, float* probs, float* loss, float* correct) {
  cudaMemsetAsync(correct, 0, sizeof(float), st);  // 0.0f
  if (rows == 0) return;
  const unsigned blocks = unsigned((rows + warps_per_block - 1) / warps_per_block);
  xent_fwd<<<blocks, warps_per_block * 32, 0, st>>>(logits, labels, rows, cols, probs, loss, correct);
}

cudaError_t preload_loss() { return load_now({reinterpret_cast<const void*>(&xent_fwd)}); }

}  // namespace nerve::gpu::cuda_kernels

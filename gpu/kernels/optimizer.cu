// Optimizer updates, elementwise, the CPU twin's formulas in the same order.
#include "gpu/kernels/grid.cuh"
#include "gpu/kernels/launch.hpp"
#include "gpu/kernels/preload.cuh"

namespace nerve::gpu::cuda_kernels {
namespace {

__global__ void sgd_kernel(float* w, const float* __restrict__ g, float* velocity, std::size_t n, sgd_params p) {
  NERVE_GRID_STRIDE(i, n) {
    float d = g[i] + p.weight_decay * w[i];
    if (p.momentum != 0.0f) {
      const float v = p.momentum * velocity[i] + d;
      velocity[i] = v;
      d = p.nesterov ? d + p.momentum * v : v;
    }
    w[i] -= p.lr * d;
  }
}

__global__ void adam_kernel(float* w, const float* __restrict__ g, float* m, float* v, std::size_t n, adam_params p,
                            float c1, float c2) {
  NERVE_GRID_STRIDE(i, n) {
    float wi = w[i];
    float gi = g[i];
    if (p.decoupled)
      wi *= 1.0f - p.lr * p.weight_decay;
    else
      gi += p.weight_decay * wi;
    const float mi = p.beta1 * m[i] + (1.0f - p.beta1) * gi;
    const float vi = p.beta2 * v[i] + (1.0f - p.beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    w[i] = wi - p.lr * (mi / c1) / (sqrtf(vi / c2) + p.eps);
  }
}

}  // namespace

void sgd_update(cudaStream_t st, float* w, const float* g, float* velocity, std::size_t n, const sgd_params& p) {
  sgd_kernel<<<grid_for(n), block_size, 0, st>>>(w, g, velocity, n, p);
}

void adam_update(cudaStream_t st, float* w, const float* g, float* m, float* v, std::size_t n, const adam_params& p,
                 float c1, float c2) {
  adam_kernel<<<grid_for(n), block_size, 0, st>>>(w, g, m, v, n, p, c1, c2);
}

cudaError_t preload_optimizer() {
  return load_now({
      reinterpret_cast<const void*>(&sgd_kernel), reinterpret_cast<const void*>(&adam_kernel)});
}

}  // namespace nerve::gpu::cuda_kernels

// Sliding windows over NCHW images: im2col/col2im and pooling (their bodies are
// gpu/kernels/ops.hpp's, shared with the CPU twin).
#include "gpu/kernels/grid.cuh"
#include "gpu/kernels/launch.hpp"
#include "gpu/kernels/ops.hpp"
#include "gpu/kernels/preload.cuh"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace nerve::gpu::cuda_kernels {
namespace {

// Each kernel runs on 32-bit indices where every index of the launch fits (always, for
// the shapes nerve trains), 64-bit otherwise. On a GPU a 64-bit division is a long
// software routine and im2col does seven per element; 32-bit ones are a few
// instructions each (docs/gpu.md has the measured difference). Same arithmetic on the
// floats: the results are bitwise the same.

/// 32-bit indices when every index of the launch fits: the patch matrices (the largest
/// buffer any of these kernels indexes), the inputs and the outputs, plus a grid stride.
bool narrow(const window_geometry& g) {
  const std::size_t biggest = std::max({ops::patch_elements(g), ops::inputs(g), ops::outputs(g)});
  return biggest + std::size_t(grid_for(biggest)) * block_size < (std::size_t(1) << 32);
}

template <class Op>
void each_window(cudaStream_t st, const window_geometry& g, std::size_t n, const Op& op) {
  if (narrow(g))
    each<std::uint32_t>(st, n, op);
  else
    each<std::size_t>(st, n, op);
}

}  // namespace

void im2col(cudaStream_t st, const float* x, const window_geometry& g, float* col) {
  each_window(st, g, ops::patch_elements(g), ops::im2col{x, g, col});
}
void col2im(cudaStream_t st, const float* col, const window_geometry& g, float* dx) {
  each_window(st, g, ops::inputs(g), ops::col2im{col, g, dx});
}
void max_pool_forward(cudaStream_t st, const float* x, const window_geometry& g, float* y, std::int32_t* argmax) {
  each_window(st, g, ops::outputs(g), ops::pool_forward<true>{x, g, y, argmax});
}
void max_pool_backward(cudaStream_t st, const float* dy, const std::int32_t* argmax, const window_geometry& g,
                       float* dx) {
  each_window(st, g, ops::inputs(g), ops::pool_backward<true>{dy, argmax, g, dx});
}
void avg_pool_forward(cudaStream_t st, const float* x, const window_geometry& g, float* y) {
  each_window(st, g, ops::outputs(g), ops::pool_forward<false>{x, g, y, nullptr});
}
void avg_pool_backward(cudaStream_t st, const float* dy, const window_geometry& g, float* dx) {
  each_window(st, g, ops::inputs(g), ops::pool_backward<false>{dy, nullptr, g, dx});
}

cudaError_t preload_window() {
  std::vector<const void*> kernels;
  auto both = [&](auto op) {
    kernels.push_back(kernel_of<decltype(op), std::uint32_t>());
    kernels.push_back(kernel_of<decltype(op), std::size_t>());
  };
  both(ops::im2col{});
  both(ops::col2im{});
  both(ops::pool_forward<true>{});
  both(ops::pool_backward<true>{});
  both(ops::pool_forward<false>{});
  both(ops::pool_backward<false>{});
  return load_now(kernels);
}

}  // namespace nerve::gpu::cuda_kernels

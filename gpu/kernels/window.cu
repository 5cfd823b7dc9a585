// Sliding windows over NCHW images: im2col/col2im and pooling (their bodies are
// gpu/kernels/ops.hpp's, shared with the CPU twin).
#include "gpu/kernels/grid.cuh"
#include "gpu/kernels/launch.hpp"
#include "gpu/kernels/ops.hpp"

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

}  // namespace

void each(cudaStream_t st, const ops::window_op& op) {
  std::visit(
      [&](const auto& o) {
        if (narrow(o.g))
          launch_each<std::uint32_t>(st, o.size(), o);
        else
          launch_each<std::size_t>(st, o.size(), o);
      },
      op);
}

cudaError_t preload_window() {
  std::vector<const void*> kernels;
  add_kernels<std::uint32_t>(kernels, static_cast<const ops::window_op*>(nullptr));
  add_kernels<std::size_t>(kernels, static_cast<const ops::window_op*>(nullptr));
  return load_now(kernels);
}

}  // namespace nerve::gpu::cuda_kernels

// Sliding windows over NCHW images: im2col/col2im and pooling. The backward
// kernels gather per input pixel (no atomics): deterministic, same sums as the CPU twin.
#include "gpu/kernels/grid.cuh"
#include "gpu/kernels/launch.hpp"
#include "gpu/kernels/preload.cuh"

#include <algorithm>
#include <cfloat>
#include <cstdint>

namespace nerve::gpu::cuda_kernels {
namespace {

// The kernels are templates on their index type I: 32-bit where every index of the
// launch fits (always, for the shapes nerve trains), 64-bit otherwise. On a GPU a
// 64-bit division is a long software routine and im2col does seven per element; 32-bit
// ones are a few instructions each (docs/gpu.md has the measured difference). Same
// arithmetic on the floats: the results are bitwise the same.

template <class I>
__device__ I grid_start() {
  return I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x);
}
template <class I>
__device__ I grid_step() {
  return I(gridDim.x) * I(blockDim.x);
}

template <class I>
__global__ void im2col_kernel(const float* __restrict__ x, window_geometry g, float* col) {
  const I oh = I(g.out_h()), ow = I(g.out_w()), kh = I(g.kernel_h), kw = I(g.kernel_w);
  const I pc = oh * ow, pr = I(g.channels) * kh * kw, total = I(g.batch) * pr * pc;
  for (I idx = grid_start<I>(); idx < total; idx += grid_step<I>()) {
    const I n = idx / (pr * pc), rest = idx - n * (pr * pc);
    const I row = rest / pc, pix = rest - row * pc;
    const I c = row / (kh * kw), ij = row - c * (kh * kw);
    const I i = ij / kw, j = ij - i * kw;
    const I y = pix / ow, xo = pix - y * ow;
    const int h = int(y) * g.stride_h - g.pad_h + int(i), w = int(xo) * g.stride_w - g.pad_w + int(j);
    col[idx] = (h >= 0 && h < g.height && w >= 0 && w < g.width)
                   ? x[((n * I(g.channels) + c) * I(g.height) + I(h)) * I(g.width) + I(w)]
                   : 0.0f;
  }
}

template <class I>
__global__ void col2im_kernel(const float* __restrict__ col, window_geometry g, float* dx) {
  const int oh = g.out_h(), ow = g.out_w();
  const I pc = I(oh) * I(ow), pr = I(g.channels) * I(g.kernel_h) * I(g.kernel_w);
  const I plane = I(g.width) * I(g.height), total = I(g.batch) * I(g.channels) * plane;
  for (I idx = grid_start<I>(); idx < total; idx += grid_step<I>()) {
    const I nc = idx / plane, hw = idx - nc * plane;
    const I n = nc / I(g.channels), c = nc - n * I(g.channels);
    const int h = int(hw / I(g.width)), w = int(hw - I(h) * I(g.width));
    float acc = 0.0f;
    for (int i = 0; i < g.kernel_h; ++i) {
      const int ys = h + g.pad_h - i;
      if (ys < 0 || ys % g.stride_h) continue;
      const int y = ys / g.stride_h;
      if (y >= oh) continue;
      for (int j = 0; j < g.kernel_w; ++j) {
        const int xs = w + g.pad_w - j;
        if (xs < 0 || xs % g.stride_w) continue;
        const int xo = xs / g.stride_w;
        if (xo >= ow) continue;
        const I row = (c * I(g.kernel_h) + I(i)) * I(g.kernel_w) + I(j);
        acc += col[n * pr * pc + row * pc + I(y) * I(ow) + I(xo)];
      }
    }
    dx[idx] = acc;
  }
}

template <class I>
__global__ void max_fwd(const float* __restrict__ x, window_geometry g, float* y, std::int32_t* argmax) {
  const int oh = g.out_h(), ow = g.out_w();
  const I plane = I(oh) * I(ow), total = I(g.batch) * I(g.channels) * plane;
  for (I o = grid_start<I>(); o < total; o += grid_step<I>()) {
    const I p = o / plane, q = o - p * plane;
    const int yo = int(q / I(ow)), xo = int(q - I(yo) * I(ow));
    const float* img = x + p * I(g.height) * I(g.width);
    float best = -FLT_MAX;
    std::int32_t arg = -1;
    for (int i = 0; i < g.kernel_h; ++i)
      for (int j = 0; j < g.kernel_w; ++j) {
        const int h = yo * g.stride_h - g.pad_h + i, w = xo * g.stride_w - g.pad_w + j;
        if (h < 0 || h >= g.height || w < 0 || w >= g.width) continue;
        const float v = img[h * g.width + w];
        if (arg < 0 || v > best) {
          best = v;
          arg = h * g.width + w;
        }
      }
    y[o] = best;
    argmax[o] = arg;
  }
}

template <bool Max, class I>
__global__ void pool_bwd(const float* __restrict__ dy, const std::int32_t* __restrict__ argmax, window_geometry g,
                         float* dx) {
  const int oh = g.out_h(), ow = g.out_w();
  const float inv = 1.0f / float(g.kernel_h * g.kernel_w);
  const I plane = I(g.width) * I(g.height), total = I(g.batch) * I(g.channels) * plane;
  for (I idx = grid_start<I>(); idx < total; idx += grid_step<I>()) {
    const I p = idx / plane, hw = idx - p * plane;
    const int h = int(hw / I(g.width)), w = int(hw - I(h) * I(g.width));
    const std::int32_t me = h * g.width + w;
    float acc = 0.0f;
    for (int i = 0; i < g.kernel_h; ++i) {
      const int ys = h + g.pad_h - i;
      if (ys < 0 || ys % g.stride_h || ys / g.stride_h >= oh) continue;
      for (int j = 0; j < g.kernel_w; ++j) {
        const int xs = w + g.pad_w - j;
        if (xs < 0 || xs % g.stride_w || xs / g.stride_w >= ow) continue;
        const I o = (p * I(oh) + I(ys / g.stride_h)) * I(ow) + I(xs / g.stride_w);
        if constexpr (Max) {
          if (argmax[o] == me) acc += dy[o];
        } else {
          acc += dy[o];
        }
      }
    }
    dx[idx] = Max ? acc : acc * inv;
  }
}

template <class I>
__global__ void avg_fwd(const float* __restrict__ x, window_geometry g, float* y) {
  const int oh = g.out_h(), ow = g.out_w();
  const float inv = 1.0f / float(g.kernel_h * g.kernel_w);
  const I plane = I(oh) * I(ow), total = I(g.batch) * I(g.channels) * plane;
  for (I o = grid_start<I>(); o < total; o += grid_step<I>()) {
    const I p = o / plane, q = o - p * plane;
    const int yo = int(q / I(ow)), xo = int(q - I(yo) * I(ow));
    const float* img = x + p * I(g.height) * I(g.width);
    float acc = 0.0f;
    for (int i = 0; i < g.kernel_h; ++i)
      for (int j = 0; j < g.kernel_w; ++j) {
        const int h = yo * g.stride_h - g.pad_h + i, w = xo * g.stride_w - g.pad_w + j;
        if (h >= 0 && h < g.height && w >= 0 && w < g.width) acc += img[h * g.width + w];
      }
    y[o] = acc * inv;
  }
}

std::size_t outputs(const window_geometry& g) { return std::size_t(g.batch) * g.channels * g.out_h() * g.out_w(); }
std::size_t inputs(const window_geometry& g) { return std::size_t(g.batch) * g.channels * g.height * g.width; }

/// 32-bit indices when every index of the launch fits: the patch matrices (the largest
/// buffer any of these kernels indexes), the inputs and the outputs, plus a grid stride.
bool narrow(const window_geometry& g) {
  const std::size_t biggest = std::max({std::size_t(g.batch) * g.patch_rows() * g.patch_cols(), inputs(g), outputs(g)});
  return biggest + std::size_t(grid_for(biggest)) * block_size < (std::size_t(1) << 32);
}

}  // namespace

void im2col(cudaStream_t st, const float* x, const window_geometry& g, float* col) {
  const std::size_t n = std::size_t(g.batch) * g.patch_rows() * g.patch_cols();
  if (narrow(g))
    im2col_kernel<std::uint32_t><<<grid_for(n), block_size, 0, st>>>(x, g, col);
  else
    im2col_kernel<std::size_t><<<grid_for(n), block_size, 0, st>>>(x, g, col);
}
void col2im(cudaStream_t st, const float* col, const window_geometry& g, float* dx) {
  if (narrow(g))
    col2im_kernel<std::uint32_t><<<grid_for(inputs(g)), block_size, 0, st>>>(col, g, dx);
  else
    col2im_kernel<std::size_t><<<grid_for(inputs(g)), block_size, 0, st>>>(col, g, dx);
}
void max_pool_forward(cudaStream_t st, const float* x, const window_geometry& g, float* y, std::int32_t* argmax) {
  if (narrow(g))
    max_fwd<std::uint32_t><<<grid_for(outputs(g)), block_size, 0, st>>>(x, g, y, argmax);
  else
    max_fwd<std::size_t><<<grid_for(outputs(g)), block_size, 0, st>>>(x, g, y, argmax);
}
void max_pool_backward(cudaStream_t st, const float* dy, const std::int32_t* argmax, const window_geometry& g,
                       float* dx) {
  if (narrow(g))
    pool_bwd<true, std::uint32_t><<<grid_for(inputs(g)), block_size, 0, st>>>(dy, argmax, g, dx);
  else
    pool_bwd<true, std::size_t><<<grid_for(inputs(g)), block_size, 0, st>>>(dy, argmax, g, dx);
}
void avg_pool_forward(cudaStream_t st, const float* x, const window_geometry& g, float* y) {
  if (narrow(g))
    avg_fwd<std::uint32_t><<<grid_for(outputs(g)), block_size, 0, st>>>(x, g, y);
  else
    avg_fwd<std::size_t><<<grid_for(outputs(g)), block_size, 0, st>>>(x, g, y);
}
void avg_pool_backward(cudaStream_t st, const float* dy, const window_geometry& g, float* dx) {
  if (narrow(g))
    pool_bwd<false, std::uint32_t><<<grid_for(inputs(g)), block_size, 0, st>>>(dy, nullptr, g, dx);
  else
    pool_bwd<false, std::size_t><<<grid_for(inputs(g)), block_size, 0, st>>>(dy, nullptr, g, dx);
}

cudaError_t preload_window() {
  return load_now({
      reinterpret_cast<const void*>(&im2col_kernel<std::uint32_t>),
      reinterpret_cast<const void*>(&im2col_kernel<std::size_t>),
      reinterpret_cast<const void*>(&col2im_kernel<std::uint32_t>),
      reinterpret_cast<const void*>(&col2im_kernel<std::size_t>),
      reinterpret_cast<const void*>(&max_fwd<std::uint32_t>), reinterpret_cast<const void*>(&max_fwd<std::size_t>),
      reinterpret_cast<const void*>(&pool_bwd<true, std::uint32_t>),
      reinterpret_cast<const void*>(&pool_bwd<true, std::size_t>),
      reinterpret_cast<const void*>(&avg_fwd<std::uint32_t>), reinterpret_cast<const void*>(&avg_fwd<std::size_t>),
      reinterpret_cast<const void*>(&pool_bwd<false, std::uint32_t>),
      reinterpret_cast<const void*>(&pool_bwd<false, std::size_t>)});
}

}  // namespace nerve::gpu::cuda_kernels

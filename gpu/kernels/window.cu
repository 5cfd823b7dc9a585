// Sliding windows over NCHW images: im2col/col2im and pooling. The backward
// kernels gather per input pixel (no atomics): deterministic, same sums as the CPU twin.
#include "gpu/kernels/grid.cuh"
#include "gpu/kernels/launch.hpp"
#include "gpu/kernels/preload.cuh"

#include <cfloat>

namespace nerve::gpu::cuda_kernels {
namespace {

__global__ void im2col_kernel(const float* __restrict__ x, window_geometry g, float* col) {
  const int oh = g.out_h(), ow = g.out_w();
  const std::size_t pc = std::size_t(oh) * ow, pr = std::size_t(g.channels) * g.kernel_h * g.kernel_w;
  NERVE_GRID_STRIDE(idx, std::size_t(g.batch) * pr * pc) {
    const std::size_t n = std::size_t(idx) / (pr * pc);
    const std::size_t rest = std::size_t(idx) % (pr * pc);
    const std::size_t row = rest / pc, pix = rest % pc;
    const int c = int(row / (g.kernel_h * g.kernel_w));
    const int i = int(row / g.kernel_w % g.kernel_h), j = int(row % g.kernel_w);
    const int y = int(pix / ow), xo = int(pix % ow);
    const int h = y * g.stride_h - g.pad_h + i, w = xo * g.stride_w - g.pad_w + j;
    col[idx] = (h >= 0 && h < g.height && w >= 0 && w < g.width)
                   ? x[((n * g.channels + c) * g.height + h) * g.width + w]
                   : 0.0f;
  }
}

__global__ void col2im_kernel(const float* __restrict__ col, window_geometry g, float* dx) {
  const int oh = g.out_h(), ow = g.out_w();
  const std::size_t pc = std::size_t(oh) * ow, pr = std::size_t(g.channels) * g.kernel_h * g.kernel_w;
  NERVE_GRID_STRIDE(idx, std::size_t(g.batch) * g.channels * g.height * g.width) {
    const int w = int(idx % g.width), h = int(idx / g.width % g.height);
    const int c = int(idx / (std::size_t(g.width) * g.height) % g.channels);
    const std::size_t n = std::size_t(idx) / (std::size_t(g.width) * g.height * g.channels);
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
        const std::size_t row = (std::size_t(c) * g.kernel_h + i) * g.kernel_w + j;
        acc += col[n * pr * pc + row * pc + std::size_t(y) * ow + xo];
      }
    }
    dx[idx] = acc;
  }
}

__global__ void max_fwd(const float* __restrict__ x, window_geometry g, float* y, std::int32_t* argmax) {
  const int oh = g.out_h(), ow = g.out_w();
  NERVE_GRID_STRIDE(o, std::size_t(g.batch) * g.channels * oh * ow) {
    const int xo = int(o % ow), yo = int(o / ow % oh);
    const std::size_t p = std::size_t(o) / (std::size_t(ow) * oh);
    const float* img = x + p * g.height * g.width;
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

template <bool Max>
__global__ void pool_bwd(const float* __restrict__ dy, const std::int32_t* __restrict__ argmax, window_geometry g,
                         float* dx) {
  const int oh = g.out_h(), ow = g.out_w();
  const float inv = 1.0f / float(g.kernel_h * g.kernel_w);
  NERVE_GRID_STRIDE(idx, std::size_t(g.batch) * g.channels * g.height * g.width) {
    const int w = int(idx % g.width), h = int(idx / g.width % g.height);
    const std::size_t p = std::size_t(idx) / (std::size_t(g.width) * g.height);
    const std::int32_t me = h * g.width + w;
    float acc = 0.0f;
    for (int i = 0; i < g.kernel_h; ++i) {
      const int ys = h + g.pad_h - i;
      if (ys < 0 || ys % g.stride_h || ys / g.stride_h >= oh) continue;
      for (int j = 0; j < g.kernel_w; ++j) {
        const int xs = w + g.pad_w - j;
        if (xs < 0 || xs % g.stride_w || xs / g.stride_w >= ow) continue;
        const std::size_t o = (p * oh + ys / g.stride_h) * ow + xs / g.stride_w;
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

__global__ void avg_fwd(const float* __restrict__ x, window_geometry g, float* y) {
  const int oh = g.out_h(), ow = g.out_w();
  const float inv = 1.0f / float(g.kernel_h * g.kernel_w);
  NERVE_GRID_STRIDE(o, std::size_t(g.batch) * g.channels * oh * ow) {
    const int xo = int(o % ow), yo = int(o / ow % oh);
    const std::size_t p = std::size_t(o) / (std::size_t(ow) * oh);
    const float* img = x + p * g.height * g.width;
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

}  // namespace

void im2col(cudaStream_t st, const float* x, const window_geometry& g, float* col) {
  const std::size_t n = std::size_t(g.batch) * g.patch_rows() * g.patch_cols();
  im2col_kernel<<<grid_for(n), block_size, 0, st>>>(x, g, col);
}
void col2im(cudaStream_t st, const float* col, const window_geometry& g, float* dx) {
  col2im_kernel<<<grid_for(inputs(g)), block_size, 0, st>>>(col, g, dx);
}
void max_pool_forward(cudaStream_t st, const float* x, const window_geometry& g, float* y, std::int32_t* argmax) {
  max_fwd<<<grid_for(outputs(g)), block_size, 0, st>>>(x, g, y, argmax);
}
void max_pool_backward(cudaStream_t st, const float* dy, const std::int32_t* argmax, const window_geometry& g,
                       float* dx) {
  pool_bwd<true><<<grid_for(inputs(g)), block_size, 0, st>>>(dy, argmax, g, dx);
}
void avg_pool_forward(cudaStream_t st, const float* x, const window_geometry& g, float* y) {
  avg_fwd<<<grid_for(outputs(g)), block_size, 0, st>>>(x, g, y);
}
void avg_pool_backward(cudaStream_t st, const float* dy, const window_geometry& g, float* dx) {
  pool_bwd<false><<<grid_for(inputs(g)), block_size, 0, st>>>(dy, nullptr, g, dx);
}

cudaError_t preload_window() {
  return load_now({
      reinterpret_cast<const void*>(&im2col_kernel), reinterpret_cast<const void*>(&col2im_kernel),
      reinterpret_cast<const void*>(&max_fwd), reinterpret_cast<const void*>(&pool_bwd<true>),
      reinterpret_cast<const void*>(&avg_fwd), reinterpret_cast<const void*>(&pool_bwd<false>)});
}

}  // namespace nerve::gpu::cuda_kernels

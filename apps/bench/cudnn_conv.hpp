#pragma once
/// \file
/// `nerve-bench conv`'s cuDNN side, as a module (libnerve_bench_cudnn.so) that
/// conv.cpp opens only when `conv` runs: cuDNN and cudart stay out of nerve-bench,
/// so its other subcommands (messaging) never map them. Plain C types only: the
/// module links no nerve code (no second copy of nerve::gpu's state).

#include <cstddef>

extern "C" {

/// One convolution: NCHW input n×c×h×w, k filters r×r, stride 1, padding `pad`.
struct nerve_cudnn_conv_shape {
  int n, c, h, w, k, r, pad;
};

/// What cuDNN did with it. `y`, `dx`, `dw` are the caller's buffers (n·k·oh·ow,
/// n·c·h·w, k·c·r·r floats), filled with cuDNN's outputs of one pass.
struct nerve_cudnn_conv_result {
  int version;                 ///< cudnnGetVersion()
  double forward_us;           ///< median of 5 trials, per pass (forward + bias)
  double backward_data_us;
  double backward_filter_us;   ///< filter and bias gradients
  int algo_forward, algo_backward_data, algo_backward_filter;
  float* y;
  float* dx;
  float* dw;
  char error[512];             ///< why, when the call returns non-zero
};

/// Times cuDNN on its own stream with these inputs and weights (host memory).
/// Returns 0, or non-zero with `out->error` set. Never throws.
int nerve_bench_cudnn_conv(const nerve_cudnn_conv_shape* shape, const float* x, const float* dy, const float* w,
                           const float* bias, int reps, nerve_cudnn_conv_result* out);
using nerve_bench_cudnn_conv_fn = decltype(&nerve_bench_cudnn_conv);
}

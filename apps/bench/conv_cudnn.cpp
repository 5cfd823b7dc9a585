// `nerve-bench conv`'s cuDNN side (cudnn_conv.hpp): built as libnerve_bench_cudnn.so and
// opened by conv.cpp when `conv` runs, so nerve-bench itself links neither cuDNN nor cudart.
// For one shape: the fastest cudnnFind* algorithm of each pass among those that do not use
// tensor cores (the descriptors ask for CUDNN_FMA_MATH), timed with CUDA events on a stream
// of its own, and one pass's outputs for the comparison with nerve's.
#include "apps/bench/cudnn_conv.hpp"

#include <cudnn.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

void check(cudnnStatus_t s, const char* what) {
  if (s != CUDNN_STATUS_SUCCESS) throw std::runtime_error(std::string(what) + ": " + cudnnGetErrorString(s));
}
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
#define NERVE_CHECK(call) check((call), #call)

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// cuDNN's side of one shape: a stream, a handle bound to it, the descriptors and two
/// timing events, released whatever ends the run (a failed call throws).
struct cudnn_side {
  cudaStream_t stream = nullptr;
  cudnnHandle_t handle = nullptr;
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, bias = nullptr;
  cudnnFilterDescriptor_t filter = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;

  cudnn_side() {
    NERVE_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    NERVE_CHECK(cudnnCreate(&handle));
    NERVE_CHECK(cudnnSetStream(handle, stream));
    NERVE_CHECK(cudnnCreateTensorDescriptor(&x));
    NERVE_CHECK(cudnnCreateTensorDescriptor(&y));
    NERVE_CHECK(cudnnCreateTensorDescriptor(&bias));
    NERVE_CHECK(cudnnCreateFilterDescriptor(&filter));
    NERVE_CHECK(cudnnCreateConvolutionDescriptor(&conv));
    NERVE_CHECK(cudaEventCreate(&start));
    NERVE_CHECK(cudaEventCreate(&stop));
  }
  ~cudnn_side() {
    if (stop) (void)cudaEventDestroy(stop);
    if (start) (void)cudaEventDestroy(start);
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
    if (filter) cudnnDestroyFilterDescriptor(filter);
    if (bias) cudnnDestroyTensorDescriptor(bias);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (x) cudnnDestroyTensorDescriptor(x);
    if (handle) cudnnDestroy(handle);
    if (stream) (void)cudaStreamDestroy(stream);
  }
  cudnn_side(const cudnn_side&) = delete;
  cudnn_side& operator=(const cudnn_side&) = delete;
};

/// A device allocation for the cuDNN side (setup, outside the timed loops).
struct dev_mem {
  void* p = nullptr;
  explicit dev_mem(std::size_t bytes) {
    if (bytes) NERVE_CHECK(cudaMalloc(&p, bytes));
  }
  ~dev_mem() { (void)cudaFree(p); }
  dev_mem(const dev_mem&) = delete;
  dev_mem& operator=(const dev_mem&) = delete;
  float* f() const { return static_cast<float*>(p); }
};

void run(const nerve_cudnn_conv_shape& sh, const float* x, const float* dy, const float* w_host,
         const float* b_host, int reps, nerve_cudnn_conv_result& r) {
  const int oh = sh.h + 2 * sh.pad - sh.r + 1, ow = sh.w + 2 * sh.pad - sh.r + 1;
  const std::size_t nx = std::size_t(sh.n) * sh.c * sh.h * sh.w, ny = std::size_t(sh.n) * sh.k * oh * ow;
  const std::size_t nw = std::size_t(sh.k) * sh.c * sh.r * sh.r;
  r.version = int(cudnnGetVersion());
  // cuDNN on a stream of its own, the same data and weights.
  cudnn_side side;
  cudnnHandle_t h = side.handle;
  cudnnTensorDescriptor_t xd = side.x, yd = side.y, bd = side.bias;
  cudnnFilterDescriptor_t fd = side.filter;
  cudnnConvolutionDescriptor_t cd = side.conv;
  cudaStream_t st = side.stream;
  NERVE_CHECK(cudnnSetTensor4dDescriptor(xd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, sh.n, sh.c, sh.h, sh.w));
  NERVE_CHECK(cudnnSetTensor4dDescriptor(yd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, sh.n, sh.k, oh, ow));
  NERVE_CHECK(cudnnSetTensor4dDescriptor(bd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, sh.k, 1, 1));
  NERVE_CHECK(cudnnSetFilter4dDescriptor(fd, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, sh.k, sh.c, sh.r, sh.r));
  NERVE_CHECK(cudnnSetConvolution2dDescriptor(cd, sh.pad, sh.pad, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION,
                                              CUDNN_DATA_FLOAT));
  NERVE_CHECK(cudnnSetConvolutionMathType(cd, CUDNN_FMA_MATH));  // fp32 FMA: no TF32, as nerve's default
  dev_mem cx(nx * 4), cy(ny * 4), cdy(ny * 4), cdx(nx * 4), cw(nw * 4), cdw(nw * 4), cb(sh.k * 4), cdb(sh.k * 4);
  NERVE_CHECK(cudaMemcpy(cx.p, x, nx * 4, cudaMemcpyHostToDevice));
  NERVE_CHECK(cudaMemcpy(cdy.p, dy, ny * 4, cudaMemcpyHostToDevice));
  NERVE_CHECK(cudaMemcpy(cw.p, w_host, nw * 4, cudaMemcpyHostToDevice));
  NERVE_CHECK(cudaMemcpy(cb.p, b_host, sh.k * 4, cudaMemcpyHostToDevice));
  // fp32 on the FMA units only: TF32 tensor cores would not be nerve's arithmetic.
  auto usable = [](cudnnMathType_t m) { return m != CUDNN_TENSOR_OP_MATH && m != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION; };
  constexpr int asked = 16;
  int got = 0;
  cudnnConvolutionFwdAlgoPerf_t fp[asked];
  NERVE_CHECK(cudnnFindConvolutionForwardAlgorithm(h, xd, fd, cd, yd, asked, &got, fp));
  const auto* fwd = std::find_if(fp, fp + got, [&](auto& p) { return p.status == CUDNN_STATUS_SUCCESS && usable(p.mathType); });
  cudnnConvolutionBwdDataAlgoPerf_t dp[asked];
  NERVE_CHECK(cudnnFindConvolutionBackwardDataAlgorithm(h, fd, yd, cd, xd, asked, &got, dp));
  const int got_d = got;
  const auto* bwd_d = std::find_if(dp, dp + got_d, [&](auto& p) { return p.status == CUDNN_STATUS_SUCCESS && usable(p.mathType); });
  cudnnConvolutionBwdFilterAlgoPerf_t wp[asked];
  NERVE_CHECK(cudnnFindConvolutionBackwardFilterAlgorithm(h, xd, yd, cd, fd, asked, &got, wp));
  const int got_w = got;
  const auto* bwd_f = std::find_if(wp, wp + got_w, [&](auto& p) { return p.status == CUDNN_STATUS_SUCCESS && usable(p.mathType); });
  if (fwd == fp + got || bwd_d == dp + got_d || bwd_f == wp + got_w)
    throw std::runtime_error("cuDNN found no fp32 FMA algorithm for this shape");
  std::size_t ws_f = 0, ws_d = 0, ws_w = 0;
  NERVE_CHECK(cudnnGetConvolutionForwardWorkspaceSize(h, xd, fd, cd, yd, fwd->algo, &ws_f));
  NERVE_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(h, fd, yd, cd, xd, bwd_d->algo, &ws_d));
  NERVE_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(h, xd, yd, cd, fd, bwd_f->algo, &ws_w));
  dev_mem ws(std::max({ws_f, ws_d, ws_w}));
  const float one = 1.0f, zero = 0.0f;
  auto c_fwd = [&] {
    NERVE_CHECK(cudnnSetConvolutionMathType(cd, fwd->mathType));
    NERVE_CHECK(cudnnConvolutionForward(h, &one, xd, cx.p, fd, cw.p, cd, fwd->algo, ws.p, ws_f, &zero, yd, cy.p));
    NERVE_CHECK(cudnnAddTensor(h, &one, bd, cb.p, &one, yd, cy.p));
  };
  auto c_bd = [&] {
    NERVE_CHECK(cudnnSetConvolutionMathType(cd, bwd_d->mathType));
    NERVE_CHECK(cudnnConvolutionBackwardData(h, &one, fd, cw.p, yd, cdy.p, cd, bwd_d->algo, ws.p, ws_d, &zero, xd,
                                             cdx.p));
  };
  auto c_bf = [&](float beta) {
    NERVE_CHECK(cudnnSetConvolutionMathType(cd, bwd_f->mathType));
    NERVE_CHECK(cudnnConvolutionBackwardFilter(h, &one, xd, cx.p, yd, cdy.p, cd, bwd_f->algo, ws.p, ws_w, &beta, fd,
                                               cdw.p));
    NERVE_CHECK(cudnnConvolutionBackwardBias(h, &one, yd, cdy.p, &beta, bd, cdb.p));
  };
  c_fwd();
  c_bd();
  c_bf(0.0f);
  NERVE_CHECK(cudaStreamSynchronize(st));
  NERVE_CHECK(cudaMemcpy(r.y, cy.p, ny * 4, cudaMemcpyDeviceToHost));
  NERVE_CHECK(cudaMemcpy(r.dx, cdx.p, nx * 4, cudaMemcpyDeviceToHost));
  NERVE_CHECK(cudaMemcpy(r.dw, cdw.p, nw * 4, cudaMemcpyDeviceToHost));
  cudaEvent_t e0 = side.start, e1 = side.stop;
  auto timed = [&](const std::function<void()>& pass) {
    NERVE_CHECK(cudaEventRecord(e0, st));
    for (int i = 0; i < reps; ++i) pass();
    NERVE_CHECK(cudaEventRecord(e1, st));
    NERVE_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    NERVE_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    return double(ms) * 1e3 / reps;
  };
  std::vector<double> c_tf, c_tbd, c_tbf;
  for (int trial = 0; trial < 5; ++trial) {
    c_tf.push_back(timed(c_fwd));
    c_tbd.push_back(timed(c_bd));
    c_tbf.push_back(timed([&] { c_bf(1.0f); }));
  }

  r.forward_us = median(c_tf);
  r.backward_data_us = median(c_tbd);
  r.backward_filter_us = median(c_tbf);
  r.algo_forward = int(fwd->algo);
  r.algo_backward_data = int(bwd_d->algo);
  r.algo_backward_filter = int(bwd_f->algo);
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int nerve_bench_cudnn_conv(
    const nerve_cudnn_conv_shape* shape, const float* x, const float* dy, const float* w, const float* bias, int reps,
    nerve_cudnn_conv_result* out) {
  out->error[0] = '\0';
  try {
    run(*shape, x, dy, w, bias, reps, *out);
    return 0;
  } catch (const std::exception& e) {
    std::snprintf(out->error, sizeof out->error, "%s", e.what());
  } catch (...) {
    std::snprintf(out->error, sizeof out->error, "unknown error");
  }
  return 1;
}

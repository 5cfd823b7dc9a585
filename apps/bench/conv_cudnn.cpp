// `nerve-bench conv`: nerve's convolution (im2col + strided-batched cuBLAS, gpu/layers)
// against cuDNN 9 on the same GPU, per pass, fp32 with TF32 off on both sides.
//
//   nerve-bench conv [--reps N] [--json]
//
// Built only where CUDA and cuDNN are found (issue 7 asks to use cuDNN where it beats
// im2col + cuBLAS). For each shape (LeNet's two convolutions at batch 64 and a wider
// 3x3 one) and each pass (forward with the bias; backward data; backward filter with
// the bias gradient), the device time of `reps` passes back to back, per pass:
//   nerve   the Conv2d device twin on a gpu::stream, behind a closed gate (as
//           `nerve-bench gpu` times a step): gate opened at t0, t1 in the completion
//           handler, so it includes the completion's trip (about 12 µs on an H200) / reps
//   cudnn   the fastest algorithm cudnnFind* returns among those that do not use tensor
//           cores (the descriptors ask for CUDNN_FMA_MATH), timed with CUDA events on a
//           stream of its own
// and the largest |nerve − cudnn| of each output against the output's largest entry.
#include "gpu/device.hpp"
#include "gpu/layers/device_layer.hpp"
#include "gpu/memory.hpp"
#include "gpu/stream.hpp"
#include "gpu/testing.hpp"
#include "layers/conv2d.hpp"

#include <cudnn.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iostream>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "apps/bench/gpu_timing.hpp"
#include "apps/bench/subcommand.hpp"

namespace {

using namespace nerve;
using bench::gated_us;
using bench::loop_thread;
using nlohmann::json;

void check(cudnnStatus_t s, const char* what) {
  if (s != CUDNN_STATUS_SUCCESS) throw std::runtime_error(std::string(what) + ": " + cudnnGetErrorString(s));
}
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
#define NERVE_CHECK(call) check((call), #call)

struct conv_shape {
  const char* name;
  int n, c, h, w, k, r, pad;
};

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

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return scale > 0 ? worst / scale : worst;
}

json run_shape(const conv_shape& sh, int reps) {
  const int oh = sh.h + 2 * sh.pad - sh.r + 1, ow = sh.w + 2 * sh.pad - sh.r + 1;
  const std::size_t nx = std::size_t(sh.n) * sh.c * sh.h * sh.w, ny = std::size_t(sh.n) * sh.k * oh * ow;
  const std::size_t nw = std::size_t(sh.k) * sh.c * sh.r * sh.r;
  std::mt19937 rng(7);
  std::normal_distribution<float> d;
  std::vector<float> x(nx), dy(ny);
  for (auto& v : x) v = d(rng);
  for (auto& v : dy) v = d(rng);

  // nerve: the CPU layer's weights go to its device twin.
  layers::conv2d cpu(sh.c, sh.k, sh.r, 1, sh.pad);
  std::mt19937_64 init(3);
  cpu.reset_parameters(init);  // a layer starts at zero: the outputs' comparison would prove nothing
  gpu::device_options o;
  o.backend = gpu::backend_kind::cuda;
  loop_thread loop;
  gpu::device dev(o);
  auto s = dev.create_stream();
  auto layer = gpu::make_device_layer(s, cpu);
  auto params = layer->parameters();
  auto gx = gpu::upload(s, x.data(), {std::size_t(sh.n), std::size_t(sh.c), std::size_t(sh.h), std::size_t(sh.w)});
  auto gdy = gpu::upload(s, dy.data(), {std::size_t(sh.n), std::size_t(sh.k), std::size_t(oh), std::size_t(ow)});
  const gpu::device_tensor* ins[] = {&gx};
  gpu::device_tensor out;
  gpu::device_stash stash;
  auto forward = [&] {
    out = gpu::device_tensor();
    stash = gpu::device_stash();
    layer->forward(s, ins, out, stash);
  };
  std::vector<gpu::device_tensor> dx;
  auto back_data = [&] { dx = layer->backward_input(s, stash, gdy, gpu::all_inputs); };
  auto back_filter = [&] { layer->backward_weight(s, stash, gdy); };
  // Warm-up: every cuBLAS product runs once before any goes behind the gate (lazy loading).
  forward();
  back_data();
  back_filter();
  s.synchronize();
  const auto nerve_y = gpu::download(s, out);
  const auto nerve_dx = gpu::download(s, dx.at(0));
  std::vector<double> t_fwd, t_bd, t_bf;
  for (int trial = 0; trial < 5; ++trial) {
    t_fwd.push_back(gated_us(dev, s, loop, [&] { for (int i = 0; i < reps; ++i) forward(); }) / reps);
    t_bd.push_back(gated_us(dev, s, loop, [&] { for (int i = 0; i < reps; ++i) back_data(); }) / reps);
    t_bf.push_back(gated_us(dev, s, loop, [&] { for (int i = 0; i < reps; ++i) back_filter(); }) / reps);
  }
  // One filter gradient for the comparison: zero, one pass, read.
  for (auto& p : params) gpu::fill_zero_async(s, p.grad->data(), p.grad->bytes());
  back_filter();
  const auto nerve_dw = gpu::download(s, *params.at(0).grad);
  std::vector<float> w_host = gpu::download(s, *params.at(0).value), b_host = gpu::download(s, *params.at(1).value);
  s.synchronize();

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
  NERVE_CHECK(cudaMemcpy(cx.p, x.data(), nx * 4, cudaMemcpyHostToDevice));
  NERVE_CHECK(cudaMemcpy(cdy.p, dy.data(), ny * 4, cudaMemcpyHostToDevice));
  NERVE_CHECK(cudaMemcpy(cw.p, w_host.data(), nw * 4, cudaMemcpyHostToDevice));
  NERVE_CHECK(cudaMemcpy(cb.p, b_host.data(), sh.k * 4, cudaMemcpyHostToDevice));
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
    throw std::runtime_error("cuDNN found no fp32 FMA algorithm for " + std::string(sh.name));
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
  std::vector<float> cudnn_y(ny), cudnn_dx(nx), cudnn_dw(nw);
  NERVE_CHECK(cudaMemcpy(cudnn_y.data(), cy.p, ny * 4, cudaMemcpyDeviceToHost));
  NERVE_CHECK(cudaMemcpy(cudnn_dx.data(), cdx.p, nx * 4, cudaMemcpyDeviceToHost));
  NERVE_CHECK(cudaMemcpy(cudnn_dw.data(), cdw.p, nw * 4, cudaMemcpyDeviceToHost));
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

  const double nf = median(t_fwd), nbd = median(t_bd), nbf = median(t_bf);
  const double cf = median(c_tf), cbd = median(c_tbd), cbf = median(c_tbf);
  return {{"shape", sh.name},
          {"nchw", {sh.n, sh.c, sh.h, sh.w}},
          {"out_channels", sh.k},
          {"kernel", sh.r},
          {"pad", sh.pad},
          {"nerve_us", {{"forward", nf}, {"backward_data", nbd}, {"backward_filter", nbf}, {"total", nf + nbd + nbf}}},
          {"cudnn_us", {{"forward", cf}, {"backward_data", cbd}, {"backward_filter", cbf}, {"total", cf + cbd + cbf}}},
          {"cudnn_algos", {{"forward", int(fwd->algo)}, {"backward_data", int(bwd_d->algo)}, {"backward_filter", int(bwd_f->algo)}}},
          {"nerve_over_cudnn", (nf + nbd + nbf) / (cf + cbd + cbf)},
          {"max_rel_diff", {{"y", max_rel_diff(nerve_y, cudnn_y)},
                            {"dx", max_rel_diff(nerve_dx, cudnn_dx)},
                            {"dw", max_rel_diff(nerve_dw, cudnn_dw)}}}};
}

void run(int reps, bool as_json) {
  if (gpu::device::cuda_device_count() == 0) {
    std::cout << json{{"skipped", "no CUDA device"}}.dump() << std::endl;
    return;
  }
  int version = int(cudnnGetVersion());
  json out{{"cudnn_version", version}, {"reps", reps}, {"shapes", json::array()}};
  const conv_shape shapes[] = {{"lenet conv1 (b64, 1->6, 5x5, pad 2, 28x28)", 64, 1, 28, 28, 6, 5, 2},
                               {"lenet conv2 (b64, 6->16, 5x5, 14x14)", 64, 6, 14, 14, 16, 5, 0},
                               {"wide 3x3 (b64, 64->64, 32x32, pad 1)", 64, 64, 32, 32, 64, 3, 1}};
  for (const auto& sh : shapes) {
    auto r = run_shape(sh, reps);
    std::cerr << "nerve-bench conv: " << r.dump() << std::endl;
    out["shapes"].push_back(std::move(r));
  }
  if (as_json) {
    std::cout << out.dump(2) << std::endl;
    return;
  }
  std::printf("%-45s %12s %12s %8s\n", "shape", "nerve µs", "cuDNN µs", "ratio");
  for (auto& r : out["shapes"])
    std::printf("%-45s %12.1f %12.1f %7.2fx\n", r["shape"].get<std::string>().c_str(),
                r["nerve_us"]["total"].get<double>(), r["cudnn_us"]["total"].get<double>(),
                r["nerve_over_cudnn"].get<double>());
}

void add_conv(CLI::App& app) {
  auto reps = std::make_shared<int>(50);
  auto as_json = std::make_shared<bool>(false);
  auto* sub = app.add_subcommand("conv", "GPU convolution: nerve's im2col + cuBLAS against cuDNN, per pass");
  sub->add_option("--reps", *reps, "Passes timed back to back (default 50)");
  sub->add_flag("--json", *as_json, "Print one JSON object");
  sub->callback([reps, as_json] { run(*reps, *as_json); });
}

const nerve::bench::subcommand_registration registration{"conv", &add_conv};

}  // namespace

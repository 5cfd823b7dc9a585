// `nerve-bench conv`: nerve's convolution (im2col + strided-batched cuBLAS, gpu/layers)
// against cuDNN 9 on the same GPU, per pass, fp32 with TF32 off on both sides.
//
//   nerve-bench conv [--reps N] [--json]
//
// Built only where CUDA and cuDNN are found (issue 7 asks to use cuDNN where it beats
// im2col + cuBLAS). cuDNN's side is a module (cudnn_conv.hpp, conv_cudnn.cpp) opened
// only when `conv` runs: nerve-bench itself links no CUDA library. For each shape (LeNet's two convolutions at batch 64 and a wider
// 3x3 one) and each pass (forward with the bias; backward data; backward filter with
// the bias gradient), the device time of `reps` passes back to back, per pass:
//   nerve   the Conv2d device twin on a gpu::stream, behind a closed gate (as
//           `nerve-bench gpu` times a step): gate opened at t0, t1 in the completion
//           handler, so it includes the completion's trip (about 12 µs on an H200) / reps
//   cudnn   the fastest algorithm cudnnFind* returns among those that do not use tensor
//           cores (the descriptors ask for CUDNN_FMA_MATH), timed with CUDA events on a
//           stream of its own
// and the largest |nerve − cudnn| of each output against the output's largest entry.
#include "apps/bench/cudnn_conv.hpp"
#include "gpu/detail/module.hpp"
#include "gpu/device.hpp"
#include "gpu/layers/device_op_set.hpp"
#include "gpu/memory.hpp"
#include "gpu/memory.hpp"
#include "gpu/stream.hpp"
#include "gpu/testing.hpp"
#include "layers/conv2d.hpp"

#include <dlfcn.h>

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
#include "apps/common/options.hpp"

namespace {

using namespace nerve;
using bench::gated_us;
using bench::loop_thread;
using nlohmann::json;

struct conv_shape {
  const char* name;
  int n, c, h, w, k, r, pad;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return scale > 0 ? worst / scale : worst;
}

/// cuDNN's side, opened once, the first time `conv` runs.
nerve_bench_cudnn_conv_fn cudnn_conv() {
  static const nerve_bench_cudnn_conv_fn fn = [] {
    const auto m = gpu::detail::open_module("libnerve_bench_cudnn.so", "NERVE_BENCH_CUDNN_MODULE");
    if (!m.handle) throw std::runtime_error("nerve-bench conv: " + m.error);
    auto f = reinterpret_cast<nerve_bench_cudnn_conv_fn>(dlsym(m.handle, "nerve_bench_cudnn_conv"));
    if (!f) throw std::runtime_error("nerve-bench conv: " + m.path + " has no nerve_bench_cudnn_conv");
    return f;
  }();
  return fn;
}

json run_shape(const conv_shape& sh, int reps, int& cudnn_version) {
  const int oh = sh.h + 2 * sh.pad - sh.r + 1, ow = sh.w + 2 * sh.pad - sh.r + 1;
  const std::size_t nx = std::size_t(sh.n) * sh.c * sh.h * sh.w, ny = std::size_t(sh.n) * sh.k * oh * ow;
  const std::size_t nw = std::size_t(sh.k) * sh.c * sh.r * sh.r;
  std::mt19937 rng(7);
  std::normal_distribution<float> d;
  std::vector<float> x(nx), dy(ny);
  for (auto& v : x) v = d(rng);
  for (auto& v : dy) v = d(rng);

  // nerve: the CPU layer's weights through the device's op set (what a Conv2d layer
  // actor runs there).
  layers::conv2d cpu(sh.c, sh.k, sh.r, 1, sh.pad);
  std::mt19937_64 init(3);
  cpu.reset_parameters(init);  // a layer starts at zero: the outputs' comparison would prove nothing
  gpu::device_options o;
  o.backend = gpu::backend_kind::cuda;
  loop_thread loop;
  gpu::device dev(o);
  auto s = dev.create_stream();
  gpu::device_op_set ops(s, "cuda");
  const auto K = std::size_t(sh.k), C = std::size_t(sh.c), R = std::size_t(sh.r);
  auto w = gpu::upload(s, cpu.weight().data(), {K, C, R, R});
  auto b = gpu::upload(s, cpu.bias().data(), {K});
  std::vector<float> zeros_w(nw, 0.0f), zeros_b(K, 0.0f);
  auto dw = gpu::upload(s, zeros_w.data(), {K, C, R, R});
  auto db = gpu::upload(s, zeros_b.data(), {K});
  const std::int64_t dims[4] = {sh.n, sh.c, sh.h, sh.w};
  const auto g = layers::window_over(dims, {sh.r, sh.r}, {1, 1}, {sh.pad, sh.pad});
  auto gx = gpu::upload(s, x.data(), {std::size_t(sh.n), C, std::size_t(sh.h), std::size_t(sh.w)});
  auto gdy = gpu::upload(s, dy.data(), {std::size_t(sh.n), K, std::size_t(oh), std::size_t(ow)});
  gpu::device_tensor out(s, {std::size_t(sh.n), K, std::size_t(oh), std::size_t(ow)});
  gpu::device_tensor dx(s, gx.shape());
  auto forward = [&] { ops.conv2d(g, sh.k, gx.data(), w.data(), b.data(), out.data()); };
  auto back_data = [&] { ops.conv2d_grad_input(g, sh.k, w.data(), gdy.data(), dx.data()); };
  auto back_filter = [&] { ops.conv2d_grad_weight(g, sh.k, gx.data(), gdy.data(), dw.data(), db.data()); };
  // Warm-up: every cuBLAS product runs once before any goes behind the gate (lazy loading).
  forward();
  back_data();
  back_filter();
  s.synchronize();
  const auto nerve_y = gpu::download(s, out);
  const auto nerve_dx = gpu::download(s, dx);
  std::vector<double> t_fwd, t_bd, t_bf;
  for (int trial = 0; trial < 5; ++trial) {
    t_fwd.push_back(gated_us(dev, s, loop, [&] { for (int i = 0; i < reps; ++i) forward(); }) / reps);
    t_bd.push_back(gated_us(dev, s, loop, [&] { for (int i = 0; i < reps; ++i) back_data(); }) / reps);
    t_bf.push_back(gated_us(dev, s, loop, [&] { for (int i = 0; i < reps; ++i) back_filter(); }) / reps);
  }
  // One filter gradient for the comparison: zero, one pass, read.
  gpu::fill_zero_async(s, dw.data(), dw.bytes());
  gpu::fill_zero_async(s, db.data(), db.bytes());
  back_filter();
  const auto nerve_dw = gpu::download(s, dw);
  std::vector<float> w_host = gpu::download(s, w), b_host = gpu::download(s, b);
  s.synchronize();

  // cuDNN on a stream of its own, the same data and weights.
  std::vector<float> cudnn_y(ny), cudnn_dx(nx), cudnn_dw(nw);
  nerve_cudnn_conv_result c{};
  c.y = cudnn_y.data();
  c.dx = cudnn_dx.data();
  c.dw = cudnn_dw.data();
  const nerve_cudnn_conv_shape cs{sh.n, sh.c, sh.h, sh.w, sh.k, sh.r, sh.pad};
  if (cudnn_conv()(&cs, x.data(), dy.data(), w_host.data(), b_host.data(), reps, &c) != 0)
    throw std::runtime_error(std::string("cuDNN on ") + sh.name + ": " + c.error);
  cudnn_version = c.version;

  const double nf = median(t_fwd), nbd = median(t_bd), nbf = median(t_bf);
  const double cf = c.forward_us, cbd = c.backward_data_us, cbf = c.backward_filter_us;
  return {{"shape", sh.name},
          {"nchw", {sh.n, sh.c, sh.h, sh.w}},
          {"out_channels", sh.k},
          {"kernel", sh.r},
          {"pad", sh.pad},
          {"nerve_us", {{"forward", nf}, {"backward_data", nbd}, {"backward_filter", nbf}, {"total", nf + nbd + nbf}}},
          {"cudnn_us", {{"forward", cf}, {"backward_data", cbd}, {"backward_filter", cbf}, {"total", cf + cbd + cbf}}},
          {"cudnn_algos", {{"forward", c.algo_forward}, {"backward_data", c.algo_backward_data}, {"backward_filter", c.algo_backward_filter}}},
          {"nerve_over_cudnn", (nf + nbd + nbf) / (cf + cbd + cbf)},
          {"max_rel_diff", {{"y", max_rel_diff(nerve_y, cudnn_y)},
                            {"dx", max_rel_diff(nerve_dx, cudnn_dx)},
                            {"dw", max_rel_diff(nerve_dw, cudnn_dw)}}}};
}

void run(int reps, bool as_json) {
  (void)cudnn_conv();  // the module first: a build without it fails here, GPU or not
  if (gpu::device::cuda_device_count() == 0) {
    std::cout << json{{"skipped", "no CUDA device"}}.dump() << std::endl;
    return;
  }
  int version = 0;
  json out{{"reps", reps}, {"shapes", json::array()}};
  const conv_shape shapes[] = {{"lenet conv1 (b64, 1->6, 5x5, pad 2, 28x28)", 64, 1, 28, 28, 6, 5, 2},
                               {"lenet conv2 (b64, 6->16, 5x5, 14x14)", 64, 6, 14, 14, 16, 5, 0},
                               {"wide 3x3 (b64, 64->64, 32x32, pad 1)", 64, 64, 32, 32, 64, 3, 1}};
  for (const auto& sh : shapes) {
    auto r = run_shape(sh, reps, version);
    std::cerr << "nerve-bench conv: " << r.dump() << std::endl;
    out["shapes"].push_back(std::move(r));
  }
  out["cudnn_version"] = version;
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
  sub->add_option("--reps", *reps, "Passes timed back to back (default 50)")->transform(nerve::apps::whole_in(1, 100000));
  sub->add_flag("--json", *as_json, "Print one JSON object");
  sub->callback([reps, as_json] { run(*reps, *as_json); });
}

const nerve::bench::subcommand_registration registration{"conv", &add_conv};

}  // namespace

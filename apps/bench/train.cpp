// `nerve-bench train`: training speed of the layers.
//
// Sections (all by default, or those named with --only):
//   peak      the machine's FMA peak (a register-only FMA loop) and a 1024^3 float GEMM
//             through nerve's gemm (each compiled-in engine), per thread count: GFLOP/s
//   shapes    the three products of each deep-mlp Linear layer at each batch (forward X·Wᵀ,
//             input gradient dY·W, weight gradient dYᵀ·X), single-threaded, per engine: GFLOP/s
//   steps     one training step (forward, cross-entropy, backward, SGD momentum 0.9,
//             lr 0.1) of mlp and deep-mlp at each batch and thread count, run as actors
//             (nerve::layers::network, all layers on loop 0 as nerve-train does) and by the
//             direct executor, alternating within every repeat; and the same models in
//             PyTorch (apps/bench/torch_train.py via /usr/bin/python3, one process per
//             thread count)
//   epoch     one mlp epoch on Fashion-MNIST (nerve-train's driver, no evaluation) vs
//             PyTorch's epoch (same batch 256, SGD momentum 0.9, data in memory)
//   branches  a DAG with two independent branches (input -> 2 x [fc 784->1024, relu,
//             fc 1024->1024] -> add -> fc 1024->10): both branches on one loop vs on two
//             loops (products single-threaded in both): the step time and the speed-up
//   user-layer  (only when named) a user's Swish layer (a pointwise loop with expf,
//             apps/bench/user_layer.hpp) built twice, with nerve's -march and with the
//             compiler's defaults, each inside the actors (input 64 -> fc 4096 -> swish ->
//             fc 10, batch 256, one loop): the layer's own seconds per step, and the ratio
//             of the default build to the native one (the AVX-SSE transition, issue 37)
//
// Every figure is the median of --repeats; ratios compare figures taken in this one run.
#include <immintrin.h>
#include <sched.h>
#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cerrno>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "actors/runtime.hpp"
#include "apps/bench/subcommand.hpp"
#include "apps/common/options.hpp"
#include "layers/activation.hpp"
#include "layers/executor.hpp"
#include "layers/gemm.hpp"
#include "layers/join.hpp"
#include "layers/linear.hpp"
#include "layers/network.hpp"
#include "layers/optimizer.hpp"
#include "layers/presets.hpp"
#include "layers/trainer.hpp"
#include "apps/bench/user_layer.hpp"

#ifndef NERVE_BENCH_TORCH_SCRIPT
#define NERVE_BENCH_TORCH_SCRIPT "apps/bench/torch_train.py"
#endif

namespace nerve::bench {
// apps/bench/user_layer_native.cpp and user_layer_default.cpp.
std::unique_ptr<layers::layer> make_user_swish_native(user_layer_clock& clock);
std::unique_ptr<layers::layer> make_user_swish_default(user_layer_clock& clock);
namespace {

namespace nl = nerve::layers;
using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

struct train_bench_options {
  std::vector<std::string> models{"mlp", "deep-mlp"};
  std::vector<std::size_t> batches{32, 64, 256, 1024};
  std::vector<unsigned> threads{1, 2};
  std::vector<std::string> only{"peak", "shapes", "steps", "epoch", "branches"};
  unsigned repeats = 5;
  unsigned epoch_repeats = 3;
  double min_seconds = 0.25;
  std::string python = "/usr/bin/python3";
  std::string torch_script = NERVE_BENCH_TORCH_SCRIPT;
  std::string data = "/usr/share/datasets/fashion-mnist";
  /// CPUs to pin the process (its loops, product threads and the PyTorch run) to; empty: no pinning.
  std::vector<unsigned> cpus;
  bool no_torch = false;
  bool json_out = false;
  bool quiet = false;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  auto n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double seconds_since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

/// Minor page faults of the whole process so far (the actor path computes on a loop thread).
long minor_faults() {
  rusage r{};
  getrusage(RUSAGE_SELF, &r);
  return r.ru_minflt;
}

/// CPU seconds of the whole process so far, user and system. On a shared machine the CPU
/// time of a one-thread step hardly moves with the load, where the wall time doubles.
double cpu_seconds() {
  rusage r{};
  getrusage(RUSAGE_SELF, &r);
  return double(r.ru_utime.tv_sec + r.ru_stime.tv_sec) + 1e-6 * double(r.ru_utime.tv_usec + r.ru_stime.tv_usec);
}

void progress(const train_bench_options& o, const std::string& s) {
  if (!o.quiet) std::cerr << "[train] " << s << std::endl;
}

bool wants(const train_bench_options& o, const char* section) {
  return std::find(o.only.begin(), o.only.end(), section) != o.only.end();
}

// ---- peak ---------------------------------------------------------------------------------

/// FLOPs of a register-only FMA loop on one thread (no loads; 12 independent chains hide the
/// FMA latency).
double fma_flops_one_thread(std::uint64_t iters, float* sink) {
#if defined(__AVX512F__)
  using vec = __m512;
  constexpr int lanes = 16;
  auto fma = [](vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); };
  auto set1 = [](float v) { return _mm512_set1_ps(v); };
  auto hsum = [](vec v) {
    alignas(64) float f[16];
    _mm512_store_ps(f, v);
    float s = 0;
    for (float x : f) s += x;
    return s;
  };
#elif defined(__FMA__)
  using vec = __m256;
  constexpr int lanes = 8;
  auto fma = [](vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); };
  auto set1 = [](float v) { return _mm256_set1_ps(v); };
  auto hsum = [](vec v) {
    alignas(32) float f[8];
    _mm256_store_ps(f, v);
    float s = 0;
    for (float x : f) s += x;
    return s;
  };
#else
  *sink = 0;
  (void)iters;
  return 0;
#endif
#if defined(__AVX512F__) || defined(__FMA__)
  constexpr int chains = 12;
  vec acc[chains];
  for (int i = 0; i < chains; ++i) acc[i] = set1(static_cast<float>(i) * 1e-3f);
  const vec a = set1(0.999999f), b = set1(1e-7f);
  for (std::uint64_t it = 0; it < iters; ++it)
    for (int i = 0; i < chains; ++i) acc[i] = fma(acc[i], a, b);
  float s = 0;
  for (int i = 0; i < chains; ++i) s += hsum(acc[i]);
  *sink = s;
  return 2.0 * lanes * chains * static_cast<double>(iters);
#endif
}

/// GFLOP/s of `threads` threads each running the FMA loop at once.
double fma_peak_gflops(unsigned threads) {
  constexpr std::uint64_t iters = 20'000'000;
  std::vector<float> sinks(threads);
  std::vector<std::thread> ts;
  auto t0 = clock_type::now();
  double flops = 0;
  std::vector<double> per(threads);
  for (unsigned t = 0; t < threads; ++t) ts.emplace_back([&, t] { per[t] = fma_flops_one_thread(iters, &sinks[t]); });
  for (auto& t : ts) t.join();
  const double s = seconds_since(t0);
  for (double f : per) flops += f;
  return flops / s / 1e9;
}

/// GFLOP/s of `once`, which does `flops` per call: one untimed call, then the median of
/// `repeats` timings, each calling it for at least `min_seconds`.
template <class F>
double median_gflops(F&& once, double flops, unsigned repeats, double min_seconds) {
  once();
  std::vector<double> rates;
  for (unsigned r = 0; r < repeats; ++r) {
    auto t0 = clock_type::now();
    int calls = 0;
    do {
      once();
      ++calls;
    } while (seconds_since(t0) < min_seconds);
    rates.push_back(flops * calls / seconds_since(t0) / 1e9);
  }
  return median(rates);
}

double gemm_gflops(nl::gemm_engine engine, unsigned threads, unsigned repeats) {
  const std::int64_t n = 1024;
  std::vector<float> a(n * n), b(n * n), c(n * n);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto& v : a) v = u(rng);
  for (auto& v : b) v = u(rng);
  const auto saved = nl::current_gemm_engine();
  nl::set_gemm_engine(engine);
  nl::set_gemm_threads(static_cast<int>(threads));
  const double rate = median_gflops(
      [&] { nl::gemm<float>(nl::trans::no, nl::trans::no, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n); },
      2.0 * n * n * n, repeats, 0.1);
  nl::set_gemm_engine(saved);
  return rate;
}

json run_peak(const train_bench_options& o) {
  json out = json::array();
  for (unsigned t : o.threads) {
    std::vector<double> fma;
    for (unsigned r = 0; r < o.repeats; ++r) fma.push_back(fma_peak_gflops(t));
    json j{{"threads", t}, {"fma_peak_gflops", median(fma)}, {"gemm_1024_gflops", json::object()}};
    j["gemm_1024_gflops"]["eigen"] = gemm_gflops(nl::gemm_engine::eigen, t, o.repeats);
    if (nl::has_openblas()) j["gemm_1024_gflops"]["openblas"] = gemm_gflops(nl::gemm_engine::openblas, t, o.repeats);
    progress(o, "peak threads=" + std::to_string(t) + ": " + j.dump());
    out.push_back(j);
  }
  return out;
}

// ---- shapes -------------------------------------------------------------------------------

/// GFLOP/s (median of `repeats`) of one product shape through nerve's gemm, as the Linear
/// layer calls it (row-major, the same transposes and beta).
double product_gflops(nl::trans ta, nl::trans tb, std::int64_t m, std::int64_t n, std::int64_t k, float beta,
                      unsigned repeats) {
  std::vector<float> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(k * n)), c(static_cast<std::size_t>(m * n));
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto& v : a) v = u(rng);
  for (auto& v : b) v = u(rng);
  const std::int64_t lda = ta == nl::trans::yes ? m : k, ldb = tb == nl::trans::yes ? k : n;
  return median_gflops([&] { nl::gemm<float>(ta, tb, m, n, k, 1.f, a.data(), lda, b.data(), ldb, beta, c.data(), n); },
                       2.0 * double(m) * double(n) * double(k), repeats, 0.05);
}

json run_shapes(const train_bench_options& o) {
  json out = json::array();
  const auto saved = nl::current_gemm_engine();
  nl::set_gemm_threads(1);
  for (auto batch : o.batches) {
    const auto n = static_cast<std::int64_t>(batch);
    struct product {
      const char* name;
      nl::trans ta, tb;
      std::int64_t m, n, k;
      float beta;
    };
    // fc2..fc4 of deep-mlp (1024 -> 1024) and fc1's two products (784 -> 1024; no input gradient).
    const product ps[] = {{"forward x·Wt 784->1024", nl::trans::no, nl::trans::yes, n, 1024, 784, 1.f},
                          {"weight grad dyt·x 784->1024", nl::trans::yes, nl::trans::no, 1024, 784, n, 1.f},
                          {"forward x·Wt 1024->1024", nl::trans::no, nl::trans::yes, n, 1024, 1024, 1.f},
                          {"input grad dy·W 1024->1024", nl::trans::no, nl::trans::no, n, 1024, 1024, 0.f},
                          {"weight grad dyt·x 1024->1024", nl::trans::yes, nl::trans::no, 1024, 1024, n, 1.f}};
    for (const auto& p : ps) {
      json j{{"batch", batch}, {"product", p.name}, {"m", p.m}, {"n", p.n}, {"k", p.k}, {"gflops", json::object()}};
      std::vector<nl::gemm_engine> engines{nl::gemm_engine::eigen};
      if (nl::has_openblas()) engines.push_back(nl::gemm_engine::openblas);
      for (auto e : engines) {
        nl::set_gemm_engine(e);
        j["gflops"][std::string(nl::to_string(e))] = product_gflops(p.ta, p.tb, p.m, p.n, p.k, p.beta, o.repeats);
      }
      nl::set_gemm_engine(saved);
      progress(o, "shape batch=" + std::to_string(batch) + " " + p.name + ": " + j["gflops"].dump());
      out.push_back(j);
    }
  }
  return out;
}

// ---- steps --------------------------------------------------------------------------------

std::vector<std::int64_t> dims_of(const std::string& model) {
  if (model == "mlp") return {784, 256, 10};
  if (model == "deep-mlp") return {784, 1024, 1024, 1024, 1024, 10};
  throw std::invalid_argument("nerve-bench train: unknown model '" + model + "' (mlp, deep-mlp)");
}

/// Multiply-adds x2 of one step's products: forward, weight gradient and input gradient per
/// linear layer, without the first layer's input gradient (neither side computes it).
double step_flops(const std::string& model, std::size_t batch) {
  auto d = dims_of(model);
  double f = 0;
  for (std::size_t i = 0; i + 1 < d.size(); ++i) f += (i == 0 ? 4.0 : 6.0) * static_cast<double>(batch) * d[i] * d[i + 1];
  return f;
}

nl::tensor random_batch(std::int64_t n, std::uint64_t seed) {
  nl::tensor t(n, nl::shape{784});
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  for (std::int64_t i = 0; i < t.size(); ++i) t.data()[i] = u(rng);
  return t;
}

nl::targets random_labels(std::int64_t n, std::uint64_t seed) {
  nl::targets t;
  std::mt19937_64 rng(seed);
  for (std::int64_t i = 0; i < n; ++i) t.labels.push_back(static_cast<std::int32_t>(rng() % 10));
  return t;
}

const nl::sgd_options bench_sgd{0.1, 0.9, 0.0, 0.0, false};

/// Median seconds per step, actor-run and direct, alternating within each repeat.
json time_steps(const train_bench_options& o, const std::string& model, std::size_t batch, unsigned threads) {
  nl::set_gemm_threads(static_cast<int>(threads));
  auto criterion = std::make_shared<nl::cross_entropy>();
  auto g_direct = nl::make_preset(model, 1);
  auto g_actor = nl::make_preset(model, 1);
  nl::sgd opt(bench_sgd);
  nl::direct_executor ex(g_direct);
  actors::runtime rt({.loops = threads});
  nl::network net(rt, g_actor, criterion, [] { return std::make_unique<nl::sgd>(bench_sgd); });
  const auto b = static_cast<std::int64_t>(batch);
  auto x = random_batch(b, 7);
  auto y = random_labels(b, 8);

  // Inputs for k steps made before the clock starts (a step consumes its input tensor).
  auto inputs = [&](std::size_t k) {
    std::vector<std::pair<nl::tensor, nl::targets>> v;
    v.reserve(k);
    for (std::size_t i = 0; i < k; ++i) v.emplace_back(x.clone(), y.clone());
    return v;
  };
  // Page faults per step beside the times: fresh pages cost microseconds each on these VMs,
  // and which path faulted used to depend on allocation history (layers/memory.hpp).
  std::vector<double> direct_faults, actor_faults, direct_cpu, actor_cpu;
  auto run_direct = [&](std::size_t k) {
    auto in = inputs(k);
    const long f0 = minor_faults();
    const double c0 = cpu_seconds();
    auto t0 = clock_type::now();
    for (auto& [xi, yi] : in) ex.train_step(std::move(xi), yi, *criterion, opt);
    const double s = seconds_since(t0) / static_cast<double>(k);
    direct_cpu.push_back((cpu_seconds() - c0) / static_cast<double>(k));
    direct_faults.push_back(double(minor_faults() - f0) / static_cast<double>(k));
    return s;
  };
  auto run_actor = [&](std::size_t k) {
    auto in = inputs(k);
    const long f0 = minor_faults();
    const double c0 = cpu_seconds();
    auto t0 = clock_type::now();
    for (auto& [xi, yi] : in) net.train_step(std::move(xi), std::move(yi)).get();
    const double s = seconds_since(t0) / static_cast<double>(k);
    actor_cpu.push_back((cpu_seconds() - c0) / static_cast<double>(k));
    actor_faults.push_back(double(minor_faults() - f0) / static_cast<double>(k));
    return s;
  };
  // Warm up both, then size a repeat to about min_seconds.
  run_direct(2);
  run_actor(2);
  const double one = std::min(run_direct(1), run_actor(1));
  const std::size_t k = std::max<std::size_t>(1, static_cast<std::size_t>(o.min_seconds / std::max(one, 1e-6)));
  std::vector<double> direct, actor;
  direct_faults.clear();
  actor_faults.clear();
  direct_cpu.clear();
  actor_cpu.clear();
  for (unsigned r = 0; r < o.repeats; ++r) {
    if (r % 2 == 0) {
      direct.push_back(run_direct(k));
      actor.push_back(run_actor(k));
    } else {
      actor.push_back(run_actor(k));
      direct.push_back(run_direct(k));
    }
  }
  const double flops = step_flops(model, batch);
  const double d = median(direct), a = median(actor);
  json j{{"model", model},
         {"batch", batch},
         {"threads", threads},
         {"steps_per_repeat", k},
         {"gflop_per_step", flops / 1e9},
         {"direct_seconds", d},
         {"actor_seconds", a},
         {"actor_overhead", d > 0 ? a / d - 1.0 : 0.0},
         // Minima too: on a shared machine interference only ever adds time, so the fastest
         // repeat of each side is the least disturbed estimate of the overhead.
         {"direct_min_seconds", *std::min_element(direct.begin(), direct.end())},
         {"actor_min_seconds", *std::min_element(actor.begin(), actor.end())},
         {"actor_overhead_min", *std::min_element(actor.begin(), actor.end()) / *std::min_element(direct.begin(), direct.end()) - 1.0},
         {"direct_cpu_seconds", median(direct_cpu)},
         {"actor_cpu_seconds", median(actor_cpu)},
         {"direct_faults_per_step", median(direct_faults)},
         {"actor_faults_per_step", median(actor_faults)},
         {"direct_gflops", flops / d / 1e9},
         {"actor_gflops", flops / a / 1e9},
         {"direct_samples_seconds", direct},
         {"actor_samples_seconds", actor}};
  progress(o, model + " batch=" + std::to_string(batch) + " threads=" + std::to_string(threads) + ": direct " +
                  std::to_string(d * 1e3) + " ms, actors " + std::to_string(a * 1e3) + " ms (" +
                  std::to_string(100 * (a / d - 1)) + "%; page faults per step " + std::to_string(median(direct_faults)) +
                  " direct, " + std::to_string(median(actor_faults)) + " actors)");
  return j;
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

/// Runs the PyTorch script for one thread count; a JSON object, or {"skipped": why}.
json run_torch(const train_bench_options& o, unsigned threads, bool steps, bool epoch) {
  if (o.no_torch) return {{"skipped", "--no-torch"}};
  if (!std::filesystem::exists(o.python)) return {{"skipped", o.python + " not found (Debian's python3-torch)"}};
  if (!std::filesystem::exists(o.torch_script)) return {{"skipped", "script " + o.torch_script + " not found (--torch-script)"}};
  std::vector<std::string> bs;
  for (auto b : o.batches) bs.push_back(std::to_string(b));
  std::ostringstream cmd;
  const std::string t = std::to_string(threads);
  cmd << "OMP_NUM_THREADS=" << t << " OPENBLAS_NUM_THREADS=" << t << " '" << o.python << "' -c 'import torch' 2>/dev/null && "
      << "OMP_NUM_THREADS=" << t << " OPENBLAS_NUM_THREADS=" << t << " '" << o.python << "' '" << o.torch_script
      << "' --threads " << t << " --repeats " << o.repeats << " --min-seconds " << o.min_seconds
      << " --epoch-repeats " << o.epoch_repeats << " --data '" << o.data << "'";
  if (steps) cmd << " --models " << join(o.models, ",") << " --batches " << join(bs, ",");
  else cmd << " --models '' ";
  if (epoch) cmd << " --epoch";
  progress(o, "PyTorch, threads=" + t + ": " + cmd.str());
  FILE* p = popen(cmd.str().c_str(), "r");
  if (!p) return {{"skipped", "cannot run " + o.python}};
  std::string out;
  char buf[4096];
  while (auto n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int rc = pclose(p);
  if (rc != 0 || out.empty()) return {{"skipped", o.python + " has no working torch (python3-torch), or the script failed"}};
  try {
    return json::parse(out);
  } catch (const std::exception& e) {
    return {{"skipped", std::string("unreadable output from the PyTorch script: ") + e.what()}};
  }
}

// ---- epoch --------------------------------------------------------------------------------

json run_epoch(const train_bench_options& o, unsigned threads) {
  if (!std::filesystem::exists(std::filesystem::path(o.data) / "train-images-idx3-ubyte.gz"))
    return {{"skipped", "no Fashion-MNIST under " + o.data}};
  std::vector<double> secs;
  for (unsigned r = 0; r < o.epoch_repeats; ++r) {
    auto opt = nl::preset_defaults("mlp");
    opt.model = "mlp";
    opt.epochs = 1;
    opt.threads = threads;
    opt.evaluate = false;
    opt.seed = r;
    opt.data = o.data;
    auto rep = nl::train(opt);
    secs.push_back(rep.epochs.at(0).seconds);
    progress(o, "nerve mlp epoch threads=" + std::to_string(threads) + ": " + std::to_string(secs.back()) + " s");
  }
  return {{"model", "mlp"}, {"batch", 256}, {"threads", threads}, {"median_seconds", median(secs)}, {"samples_seconds", secs}};
}

// ---- user-layer ---------------------------------------------------------------------------

/// Seconds per step the user layer spent in its own forward and backward, inside the
/// actors, `steps` steps after one warm-up step.
double user_layer_seconds(const train_bench_options& o, bool native) {
  constexpr std::int64_t batch = 256, in = 64, hidden = 4096;
  constexpr int steps = 10;
  user_layer_clock clock;
  nl::graph_builder b;
  b.input("x", nl::shape{in});
  b.add("fc1", std::make_unique<nl::linear>(in, hidden), {"x"});
  b.add("swish", native ? make_user_swish_native(clock) : make_user_swish_default(clock), {"fc1"});
  b.add("fc2", std::make_unique<nl::linear>(hidden, 10), {"swish"});
  b.output("fc2");
  auto g = b.build(1);
  actors::runtime rt({.loops = 1});
  nl::network net(rt, g, std::make_shared<nl::cross_entropy>(),
                  [] { return std::make_unique<nl::sgd>(nl::sgd_options{.lr = 0.01}); });
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  nl::tensor x(batch, nl::shape{in});
  for (std::int64_t i = 0; i < x.size(); ++i) x.data()[i] = u(rng);
  nl::targets y;
  for (std::int64_t i = 0; i < batch; ++i) y.labels.push_back(std::int32_t(i % 10));
  net.train_step(x.clone(), y.clone(), 1, 0).get();  // warm-up: buffers, pages
  clock = {};
  for (int s = 1; s <= steps; ++s) net.train_step(x.clone(), y.clone(), 1, std::uint64_t(s)).get();
  (void)o;
  return (clock.forward_seconds + clock.backward_seconds) / steps;
}

json run_user_layer(const train_bench_options& o) {
  std::vector<double> native, fallback;
  for (unsigned r = 0; r < o.repeats; ++r) {  // alternating, so drift falls on both alike
    progress(o, "user-layer repeat " + std::to_string(r + 1));
    native.push_back(user_layer_seconds(o, true));
    fallback.push_back(user_layer_seconds(o, false));
  }
  const double n = median(native), d = median(fallback);
  return {{"batch", 256}, {"features", 4096}, {"native_seconds", n}, {"default_seconds", d},
          {"native_runs", native}, {"default_runs", fallback}, {"ratio", n > 0 ? d / n : 0.0}};
}

// ---- branches -----------------------------------------------------------------------------

json run_branches(const train_bench_options& o) {
  // node order: input, a1, ar, a2, b1, br, b2, add, out
  auto build = [] {
    nl::graph_builder b;
    b.input("input", nl::shape{784});
    for (const char* br : {"a", "b"}) {
      const std::string p = br;
      b.add(p + "1", nl::linear(784, 1024), {"input"});
      b.add(p + "r", nl::relu(), {p + "1"});
      b.add(p + "2", nl::linear(1024, 1024), {p + "r"});
    }
    b.add("add", nl::add(), {"a2", "b2"});
    b.add("out", nl::linear(1024, 10), {"add"});
    return b.build(3);
  };
  const std::size_t batch = 256;
  nl::set_gemm_threads(1);
  auto criterion = std::make_shared<nl::cross_entropy>();
  auto x = random_batch(batch, 11);
  auto y = random_labels(batch, 12);
  auto time_with = [&](std::vector<unsigned> loops) {
    auto g = build();
    actors::runtime rt({.loops = 2});
    nl::network net(rt, g, criterion, [] { return std::make_unique<nl::sgd>(bench_sgd); }, nl::network_options{.loops = loops});
    auto step = [&] { net.train_step(x.clone(), y.clone()).get(); };
    step();
    step();
    std::vector<double> v;
    for (unsigned r = 0; r < o.repeats; ++r) {
      auto t0 = clock_type::now();
      const int k = 5;
      for (int i = 0; i < k; ++i) step();
      v.push_back(seconds_since(t0) / k);
    }
    return v;
  };
  std::vector<double> one, two;
  // Alternate the two placements so drift on a shared machine hits both alike.
  for (unsigned r = 0; r < 3; ++r) {
    auto a = time_with({0, 0, 0, 0, 0, 0, 0, 0, 0});
    auto b = time_with({0, 0, 0, 0, 1, 1, 1, 0, 0});
    one.insert(one.end(), a.begin(), a.end());
    two.insert(two.end(), b.begin(), b.end());
  }
  const double s1 = median(one), s2 = median(two);
  progress(o, "branches: one loop " + std::to_string(s1 * 1e3) + " ms, two loops " + std::to_string(s2 * 1e3) + " ms");
  return {{"graph", "input -> 2 x [fc 784->1024, relu, fc 1024->1024] -> add -> fc 1024->10"},
          {"batch", batch},
          {"gemm_threads", 1},
          {"one_loop_seconds", s1},
          {"two_loops_seconds", s2},
          {"speedup", s2 > 0 ? s1 / s2 : 0.0},
          {"one_loop_samples_seconds", one},
          {"two_loops_samples_seconds", two}};
}

// ---- output -------------------------------------------------------------------------------

void print_text(const json& r) {
  std::printf("gemm engine: %s; threads per product = the run's thread count\n", r["gemm_engine"].get<std::string>().c_str());
  if (r.contains("peak"))
    for (auto& p : r["peak"]) {
      std::printf("peak threads=%u: FMA %.1f GFLOP/s, GEMM 1024^3", p["threads"].get<unsigned>(), p["fma_peak_gflops"].get<double>());
      for (auto& [k, v] : p["gemm_1024_gflops"].items()) std::printf(" %s %.1f", k.c_str(), v.get<double>());
      std::printf(" GFLOP/s\n");
    }
  if (r.contains("shapes"))
    for (auto& p : r["shapes"]) {
      std::printf("batch %5zu %-30s", p["batch"].get<std::size_t>(), p["product"].get<std::string>().c_str());
      for (auto& [k, v] : p["gflops"].items()) std::printf(" %s %.1f", k.c_str(), v.get<double>());
      std::printf(" GFLOP/s (1 thread)\n");
    }
  if (r.contains("steps")) {
    std::printf("\n%-9s %5s %3s %11s %11s %8s %11s %9s %8s\n", "model", "batch", "thr", "direct ms", "actors ms", "overhead",
                "pytorch ms", "vs torch", "GFLOP/s");
    for (auto& s : r["steps"]) {
      std::printf("%-9s %5zu %3u %11.3f %11.3f %7.1f%% ", s["model"].get<std::string>().c_str(), s["batch"].get<std::size_t>(),
                  s["threads"].get<unsigned>(), 1e3 * s["direct_seconds"].get<double>(), 1e3 * s["actor_seconds"].get<double>(),
                  100 * s["actor_overhead"].get<double>());
      if (s.contains("torch_seconds"))
        std::printf("%11.3f %8.2fx ", 1e3 * s["torch_seconds"].get<double>(), s["actor_vs_torch"].get<double>());
      else
        std::printf("%11s %9s ", "-", "-");
      std::printf("%8.1f\n", s["actor_gflops"].get<double>());
    }
  }
  if (r.contains("epoch"))
    for (auto& e : r["epoch"]) {
      if (e.contains("skipped")) {
        std::printf("epoch: skipped (%s)\n", e["skipped"].get<std::string>().c_str());
        continue;
      }
      std::printf("mlp epoch threads=%u: nerve %.3f s", e["threads"].get<unsigned>(), e["median_seconds"].get<double>());
      if (e.contains("torch_seconds"))
        std::printf(", PyTorch %.3f s, ratio %.2f", e["torch_seconds"].get<double>(), e["ratio_to_torch"].get<double>());
      std::printf("\n");
    }
  if (r.contains("branches")) {
    auto& b = r["branches"];
    std::printf("branches (batch %zu): one loop %.3f ms, two loops %.3f ms, speed-up %.2fx\n", b["batch"].get<std::size_t>(),
                1e3 * b["one_loop_seconds"].get<double>(), 1e3 * b["two_loops_seconds"].get<double>(), b["speedup"].get<double>());
  }
  if (r.contains("user_layer")) {
    auto& u = r["user_layer"];
    std::printf("user layer (Swish, batch 256 x 4096, inside the actors): nerve's -march %.3f ms, compiler defaults "
                "%.3f ms per step, ratio %.2f\n",
                1e3 * u["native_seconds"].get<double>(), 1e3 * u["default_seconds"].get<double>(),
                u["ratio"].get<double>());
  }
  if (r.contains("torch"))
    for (auto& t : r["torch"]) {
      if (t.contains("skipped")) std::printf("PyTorch: skipped (%s)\n", t["skipped"].get<std::string>().c_str());
      else
        std::printf("PyTorch %s threads=%u: BLAS %s\n", t.value("version", "?").c_str(), t["threads"].get<unsigned>(),
                    t.value("blas", "?").c_str());
    }
}

void run_train(const train_bench_options& o) {
  if (!o.cpus.empty()) {
    // Before any thread starts: the loops, the product threads and the PyTorch child inherit it.
    cpu_set_t set;
    CPU_ZERO(&set);
    for (unsigned c : o.cpus) CPU_SET(c, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0)
      throw std::runtime_error("--cpus: cannot pin to those CPUs (" + std::string(std::strerror(errno)) + ")");
  }
  json r{{"benchmark", "train"}, {"gemm_engine", std::string(nl::to_string(nl::current_gemm_engine()))},
         {"hardware_threads", std::thread::hardware_concurrency()}, {"repeats", o.repeats}, {"cpus", o.cpus}};
  if (wants(o, "peak")) r["peak"] = run_peak(o);
  if (wants(o, "shapes")) r["shapes"] = run_shapes(o);
  const bool steps = wants(o, "steps"), epoch = wants(o, "epoch");
  if (steps || epoch) {
    json torch = json::array();
    for (unsigned t : o.threads) {
      auto tj = run_torch(o, t, steps, epoch);
      tj["threads"] = t;
      torch.push_back(tj);
    }
    r["torch"] = torch;
  }
  auto torch_for = [&](unsigned t) -> const json* {
    if (!r.contains("torch")) return nullptr;
    for (auto& tj : r["torch"])
      if (tj["threads"] == t && !tj.contains("skipped")) return &tj;
    return nullptr;
  };
  if (steps) {
    json out = json::array();
    for (unsigned t : o.threads)
      for (auto& m : o.models)
        for (auto b : o.batches) {
          auto j = time_steps(o, m, b, t);
          if (auto* tj = torch_for(t))
            for (auto& s : (*tj)["steps"])
              if (s["model"] == m && s["batch"] == b) {
                const double ts = s["median_seconds"];
                j["torch_seconds"] = ts;
                j["torch_gflops"] = j["gflop_per_step"].get<double>() / ts;
                j["actor_vs_torch"] = j["actor_seconds"].get<double>() / ts;
                j["direct_vs_torch"] = j["direct_seconds"].get<double>() / ts;
                if (s.contains("median_cpu_seconds")) {
                  const double tc = s["median_cpu_seconds"];
                  j["torch_cpu_seconds"] = tc;
                  j["actor_vs_torch_cpu"] = j["actor_cpu_seconds"].get<double>() / tc;
                }
              }
          out.push_back(j);
        }
    r["steps"] = out;
  }
  if (epoch) {
    json out = json::array();
    for (unsigned t : o.threads) {
      auto e = run_epoch(o, t);
      if (auto* tj = torch_for(t); tj && tj->contains("epoch") && (*tj)["epoch"].contains("median_seconds")) {
        e["torch_seconds"] = (*tj)["epoch"]["median_seconds"];
        if (e.contains("median_seconds")) e["ratio_to_torch"] = e["median_seconds"].get<double>() / e["torch_seconds"].get<double>();
      }
      out.push_back(e);
    }
    r["epoch"] = out;
  }
  if (wants(o, "branches")) r["branches"] = run_branches(o);
  if (wants(o, "user-layer")) r["user_layer"] = run_user_layer(o);
  if (o.json_out) std::cout << r.dump(2) << std::endl;
  else print_text(r);
}

void add_train(CLI::App& app) {
  auto* sub = app.add_subcommand("train", "Training speed: FMA/GEMM peak, one step of mlp/deep-mlp (actors, direct, PyTorch), an mlp epoch, independent branches");
  auto o = std::make_shared<train_bench_options>();
  // Lists are comma-separated, each item checked on its own (CLI11 splits them).
  auto list = [&](const char* name, auto& v, const std::string& what) {
    return sub->add_option(name, v, what)->delimiter(',')->capture_default_str();
  };
  list("--models", o->models, "Comma-separated: mlp, deep-mlp")->check(CLI::IsMember({"mlp", "deep-mlp"}));
  list("--batches", o->batches, "Comma-separated batch sizes")->transform(nerve::apps::whole_in<std::size_t>(1, 65536));
  list("--threads", o->threads, "Comma-separated thread counts (event loops and threads per product)")
      ->transform(nerve::apps::whole_in(1u, unsigned(nl::max_threads)));
  list("--only", o->only, "Comma-separated sections: peak, shapes, steps, epoch, branches, user-layer (default: all "
                          "but user-layer)")
      ->check(CLI::IsMember({"peak", "shapes", "steps", "epoch", "branches", "user-layer"}));
  sub->add_option("--repeats", o->repeats, "Repeats per figure (the median is reported)")
      ->capture_default_str()
      ->transform(nerve::apps::whole_in(1u, 1000u));
  sub->add_option("--epoch-repeats", o->epoch_repeats, "Epochs timed per side")
      ->capture_default_str()
      ->transform(nerve::apps::whole_in(1u, 100u));
  sub->add_option("--min-seconds", o->min_seconds, "A step repeat runs at least this long")
      ->capture_default_str()
      ->transform(nerve::apps::real_in(0, 3600, " s"));
  sub->add_option("--python", o->python, "Python with torch (Debian's python3-torch)")->capture_default_str();
  sub->add_option("--torch-script", o->torch_script, "The PyTorch side")->capture_default_str();
  sub->add_option("--data", o->data, "Fashion-MNIST directory (epoch)")->capture_default_str();
  list("--cpus", o->cpus,
       "Comma-separated CPUs to pin the whole run to (e.g. --cpus 1 --threads 1: direct calls and actors on "
       "the same core; a VM's vCPUs can differ by 10%)")
      ->transform(nerve::apps::whole_in(0u, unsigned(CPU_SETSIZE - 1)));
  sub->add_flag("--no-torch", o->no_torch, "Skip PyTorch");
  sub->add_flag("--json", o->json_out, "Print one JSON object");
  sub->add_flag("--quiet,-q", o->quiet, "No progress lines on stderr");
  sub->callback([o] { run_train(*o); });
}

const subcommand_registration registration{"train", &add_train};

}  // namespace
}  // namespace nerve::bench

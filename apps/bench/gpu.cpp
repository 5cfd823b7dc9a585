// `nerve-bench gpu`: the GPU path's figures as one JSON object on stdout.
//
//   nerve-bench gpu [--quick] [--standin] [--steps N] [--no-torch] [--torch-script PATH]
//
// latency (per waiting backend: poller, blocking)
//   idle_round_trip  record an event on an idle stream -> handler running on an io_context thread
//   gated_<hold>us   a one-thread kernel spins on pinned memory; the host waits <hold> µs (the
//                    poller has backed off as far as it will), takes t0, opens the gate; t1 is
//                    taken first thing in the handler on the loop: t1 - t0 bounds "event
//                    completes -> handler runs" from above (it adds the flag's trip over PCIe
//                    and the kernel's exit)
// steps (mlp batch 256, deep-mlp batch 1024; SGD momentum 0.9, fp32, TF32 off)
//   step_median_us   `train_step().get()`: the batch in, the step, loss and correct count back on
//                    the loop, as the trainer runs it
//   gpu_us           the same step enqueued behind a closed gate, the gate opened at t0, t1 in
//                    the completion handler: the device's own time for the step (from the events)
//   busy_fraction    gpu_us / step_median_us: how much of a step the GPU is working
//   queued_step_us   the mean step when every step is asked for at once (the network runs
//                    them one after the other, as the trainer does); busy_fraction_queued =
//                    gpu_us / queued_step_us, vs_torch_queued against torch's queued steps
//   gemm_us          the step's matrix products alone (cuBLAS, same shapes, same stream), gated
//                    the same way; gflops (step) and cublas_gflops (products alone)
//   torch            PyTorch eager on the same GPU (gpu/bench/torch_step.py), same model and batch
// pipeline (deep-mlp, batch 1024, 8 micro-batches, 1F1B, SGD momentum 0.9)
//   one_stage / four_stages   `pipeline::train_step` median with every stage a device stage on
//                    one GPU: 1 stage (1 stream) against 4 stages (4 streams, device-resident
//                    messages between them); four_vs_one = four / one (target: ≤ 1.0). Needs a
//                    GPU: without one the entry says so (--standin runs it small on the stand-in,
//                    a check of the wiring, not a figure).
// gemm: row-major products through cuBLAS fp32 (and TF32 where marked): GFLOP/s = 2mnk / time.
#include "gpu/blas.hpp"
#include "gpu/device.hpp"
#include "gpu/kernels.hpp"
#include "gpu/layers/device_backend.hpp"
#include "gpu/memory.hpp"
#include "gpu/testing.hpp"
#include "layers/graph.hpp"
#include "layers/linear.hpp"
#include "layers/network.hpp"
#include "layers/pipeline/pipeline.hpp"
#include "layers/presets.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <future>
#include <iostream>
#include <latch>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "apps/bench/gpu_timing.hpp"
#include "apps/bench/subcommand.hpp"
#include "apps/common/options.hpp"

namespace {

using namespace nerve;
using bench::busy_wait;
using bench::clock_type;
using bench::gated_us;
using bench::loop_thread;
using bench::us_between;
using nlohmann::json;

json summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return {{"samples", 0}};
  return {{"median_us", v[v.size() / 2]},
          {"p99_us", v[std::min(v.size() - 1, v.size() * 99 / 100)]},
          {"min_us", v.front()},
          {"max_us", v.back()},
          {"samples", v.size()}};
}

double cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + 1e-6 * double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

json latency(gpu::backend_kind kind, gpu::wait_mode mode, bool quick) {
  gpu::device_options o;
  o.backend = kind;
  o.waits = mode;
  loop_thread loop;
  json out;
  gpu::device dev(o);
  auto s = dev.create_stream();
  gpu::testing::gate gate(dev);
  const int scale = quick ? 5 : 1;
  std::vector<double> idle;
  for (int i = 0; i < 2000 / scale; ++i) {
    std::latch done(1);
    clock_type::time_point t1;
    const auto t0 = clock_type::now();
    s.async_wait(loop.executor(), [&](std::error_code) {
      t1 = clock_type::now();
      done.count_down();
    });
    done.wait();
    if (i >= 50) idle.push_back(us_between(t0, t1));
  }
  out["idle_round_trip"] = summarize(idle);
  const std::pair<int, int> holds[] = {{0, 1000}, {50, 1000}, {1000, 400}, {5000, 200}};
  for (auto [hold, reps] : holds) {
    std::vector<double> lat;
    for (int i = 0; i < reps / scale + 10; ++i) {
      gate.close();
      gate.enqueue(s);
      std::latch done(1);
      clock_type::time_point t1;
      s.async_wait(loop.executor(), [&](std::error_code) {
        t1 = clock_type::now();
        done.count_down();
      });
      busy_wait(std::chrono::microseconds(hold));
      const auto t0 = clock_type::now();
      gate.open();
      done.wait();
      if (i >= 10) lat.push_back(us_between(t0, t1));
    }
    out["gated_" + std::to_string(hold) + "us"] = summarize(lat);
  }
  s.synchronize();
  const double c0 = cpu_seconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(quick ? 100 : 500));
  out["idle_cpu_fraction"] = (cpu_seconds() - c0) / (quick ? 0.1 : 0.5);
  dev.shutdown();
  return out;
}

json gemm_table(gpu::backend_kind kind, bool quick) {
  gpu::device_options o;
  o.backend = kind;
  gpu::device dev(o);
  auto s = dev.create_stream();
  auto s_tf32 = dev.create_stream(gpu::stream_options{true});
  using gpu::transpose;
  struct shape {
    int m, n, k;
    transpose ta, tb;
    const char* what;
  };
  std::vector<shape> shapes = {
      {256, 256, 784, transpose::no, transpose::yes, "mlp fc1 fwd b256 (x·Wᵀ)"},
      {1024, 1024, 1024, transpose::no, transpose::yes, "deep-mlp fwd b1024 1024->1024"},
      {1024, 1024, 1024, transpose::yes, transpose::no, "deep-mlp dW b1024 (dYᵀ·X)"},
      {2048, 2048, 2048, transpose::no, transpose::no, "square"},
      {4096, 4096, 4096, transpose::no, transpose::no, "square"},
      {8192, 8192, 8192, transpose::no, transpose::no, "square"},
  };
  if (kind == gpu::backend_kind::standin) shapes.resize(1);  // plain loops: keep it short
  json out = json::array();
  for (const auto& sh : shapes)
    for (bool tf32 : {false, true}) {
      if (tf32 && (sh.m < 2048 || kind == gpu::backend_kind::standin)) continue;
      auto& st = tf32 ? s_tf32 : s;
      const std::size_t a_n = std::size_t(sh.m) * sh.k, b_n = std::size_t(sh.k) * sh.n, c_n = std::size_t(sh.m) * sh.n;
      gpu::device_buffer a(st, a_n * 4), b(st, b_n * 4), c(st, c_n * 4);
      gpu::fill(st, a_n, 0.5f, static_cast<float*>(a.data()));
      gpu::fill(st, b_n, 0.25f, static_cast<float*>(b.data()));
      auto run = [&] {
        gpu::gemm(st, sh.ta, sh.tb, sh.m, sh.n, sh.k, 1.0f, static_cast<float*>(a.data()),
                  static_cast<float*>(b.data()), 0.0f, static_cast<float*>(c.data()));
      };
      for (int i = 0; i < 3; ++i) run();
      st.synchronize();
      const double flop = 2.0 * sh.m * sh.n * sh.k;
      int reps = int(std::clamp(2e11 / flop, 3.0, quick ? 50.0 : 500.0));
      if (kind == gpu::backend_kind::standin) reps = 1;
      const auto t0 = clock_type::now();
      for (int i = 0; i < reps; ++i) run();
      st.synchronize();
      const double secs = std::chrono::duration<double>(clock_type::now() - t0).count() / reps;
      out.push_back({{"m", sh.m}, {"n", sh.n}, {"k", sh.k}, {"ta", sh.ta == transpose::yes},
                     {"tb", sh.tb == transpose::yes}, {"tf32", tf32}, {"what", sh.what}, {"reps", reps},
                     {"us", secs * 1e6}, {"gflops", flop / secs / 1e9}});
    }
  return out;
}

json run_torch(const std::string& script, const std::string& model, std::size_t batch, int steps) {
  if (!std::filesystem::exists(script)) return {{"error", "no script at " + script}};
  const std::string cmd = "python3 '" + script + "' --model " + model + " --batch " + std::to_string(batch) +
                          " --steps " + std::to_string(steps) + " 2>&1";
  std::unique_ptr<FILE, int (*)(FILE*)> p(popen(cmd.c_str(), "r"), pclose);
  if (!p) return {{"error", "cannot run python3"}};
  std::string text;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p.get())) text += buf;
  const auto brace = text.rfind("\n{");
  const std::string last = brace == std::string::npos ? text : text.substr(brace + 1);
  try {
    return json::parse(last);
  } catch (const std::exception&) {
    return {{"error", "unreadable output: " + text.substr(0, 400)}};
  }
}

json step_bench(gpu::backend_kind kind, const std::string& model, std::size_t batch, int steps,
                const std::string& torch_script, bool torch) {
  // The layer actors of a network on one loop, their kernels on one stream of the device.
  actors::runtime rt(actors::runtime_options{.loops = 1});
  loop_thread loop;  // the gated waits' loop
  gpu::device_options o;
  o.backend = kind;
  gpu::device dev(o);  // after the loops: shut down before they go
  auto g = layers::make_preset(model, 0);
  auto be = std::make_shared<gpu::device_backend>(
      dev, g, gpu::device_backend_options{.make_optimizer = [] { return layers::make_optimizer<float>("sgd", 0.01, 0.9); }, .max_batch = batch});
  layers::network net(rt, g, std::make_shared<layers::cross_entropy>(), {}, layers::network_options{.backend = be});
  std::mt19937_64 rng(1);
  std::normal_distribution<float> d;
  layers::tensor x(std::int64_t(batch), layers::shape{784});
  for (std::int64_t i = 0; i < x.size(); ++i) x.data()[i] = d(rng);
  layers::targets y;
  for (std::size_t i = 0; i < batch; ++i) y.labels.push_back(std::int32_t(i % 10));
  std::uint64_t step = 0;
  auto start = [&] { return net.train_step(x.clone(), y.clone(), 1, step++); };

  const int warmup = kind == gpu::backend_kind::standin ? 1 : 20;
  for (int i = 0; i < warmup; ++i) start().get();
  std::vector<double> step_us;
  for (int i = 0; i < steps; ++i) {
    auto xs = x.clone();
    auto ys = y.clone();
    const auto t0 = clock_type::now();
    net.train_step(std::move(xs), std::move(ys), 1, step++).get();
    step_us.push_back(us_between(t0, clock_type::now()));
  }
  // Queued: every step asked for at once; the network runs them one after the other (a
  // layer's next step begins after its update), the host's copies made before each starts.
  double queued_us = 0;
  {
    std::vector<std::future<layers::step_result>> all;
    const auto q0 = clock_type::now();
    for (int i = 0; i < steps; ++i) all.push_back(start());
    for (auto& f : all) f.get();
    queued_us = us_between(q0, clock_type::now()) / steps;
  }
  std::vector<double> gpu_us;
  for (int i = 0; i < std::max(3, steps / 4); ++i) {
    std::future<layers::step_result> f;
    gpu_us.push_back(gated_us(dev, be->stream(), loop, [&] {
      f = start();
      rt.synchronize();  // every actor has enqueued its part of the step
    }));
    f.get();
  }
  // The step's matrix products alone, on the same stream, gated the same way.
  struct product {
    int m, n, k;
    gpu::transpose ta, tb;
  };
  std::vector<product> products;
  bool first = true;
  for (auto i : g.order()) {
    // A Linear's products, by its kind and its weight's [out, in] shape.
    auto* l = g.nodes()[i].layer.get();
    if (!l || l->kind() != "Linear") continue;
    const auto& w = l->parameters().at(0).torch_shape;
    const int b = int(batch), in = int(w.at(1)), out = int(w.at(0));
    products.push_back({b, out, in, gpu::transpose::no, gpu::transpose::yes});  // forward
    products.push_back({out, in, b, gpu::transpose::yes, gpu::transpose::no});  // dW
    if (!first) products.push_back({b, in, out, gpu::transpose::no, gpu::transpose::no});  // dX
    first = false;
  }
  double flops = 0;
  std::size_t biggest = 0;
  for (auto& p : products) {
    flops += 2.0 * p.m * p.n * p.k;
    biggest = std::max({biggest, std::size_t(p.m) * p.k, std::size_t(p.k) * p.n, std::size_t(p.m) * p.n});
  }
  auto& s = be->stream();
  gpu::device_buffer a(s, biggest * 4), b(s, biggest * 4), c(s, biggest * 4);
  gpu::fill(s, biggest, 0.5f, static_cast<float*>(a.data()));
  gpu::fill(s, biggest, 0.25f, static_cast<float*>(b.data()));
  std::vector<double> gemm_us;
  for (int i = 0; i < std::max(3, steps / 4); ++i)
    gemm_us.push_back(gated_us(dev, s, loop, [&] {
      for (auto& p : products)
        gpu::gemm(s, p.ta, p.tb, p.m, p.n, p.k, 1.0f, static_cast<float*>(a.data()), static_cast<float*>(b.data()),
                  0.0f, static_cast<float*>(c.data()));
    }));
  be->synchronize();
  const auto step_s = summarize(step_us), gpu_s = summarize(gpu_us), gemm_s = summarize(gemm_us);
  const double step_med = step_s["median_us"], gpu_med = gpu_s["median_us"], gemm_med = gemm_s["median_us"];
  json out{{"model", model},
           {"batch", batch},
           {"steps", steps},
           {"step", step_s},
           {"step_median_us", step_med},
           {"gpu_us", gpu_med},
           {"busy_fraction", gpu_med / step_med},
           {"queued_step_us", queued_us},
           {"busy_fraction_queued", std::min(1.0, gpu_med / queued_us)},
           {"gemm_us", gemm_med},
           {"flops_per_step", flops},
           {"gflops", flops / step_med * 1e-3},
           {"gpu_gflops", flops / gpu_med * 1e-3},
           {"cublas_gflops", flops / gemm_med * 1e-3}};
  if (torch && kind == gpu::backend_kind::cuda) {
    auto t = run_torch(torch_script, model, batch, steps);
    if (t.contains("step_median_us")) {
      const double tm = t["step_median_us"];
      out["vs_torch"] = step_med / tm;  // ≤ 1.0: nerve is at least as fast
    }
    if (t.contains("queued_step_us")) out["vs_torch_queued"] = queued_us / double(t["queued_step_us"]);
    out["torch"] = std::move(t);
  }
  return out;
}

/// Median `pipeline::train_step` of deep-mlp with `stages` device stages on one device.
json pipeline_run(gpu::backend_kind kind, std::uint32_t stages, std::size_t batch, std::uint32_t micro, int steps) {
  actors::runtime rt(actors::runtime_options{.loops = stages});
  gpu::device_options o;
  o.backend = kind;
  gpu::device dev(o);  // after the runtime: shut down before its loops go
  auto g = layers::make_preset("deep-mlp", 0);
  nerve::pipeline::pipeline_options po;
  for (std::uint32_t s = 0; s < stages; ++s)
    po.backends.push_back([&dev, batch](layers::graph& graph, const std::vector<std::size_t>& nodes) {
      gpu::device_backend_options so;
      so.make_optimizer = [] { return layers::make_optimizer<float>("sgd", 0.01, 0.9); };
      so.max_batch = std::max(so.max_batch, batch);  // the last stage's loss stages a batch's labels
      so.nodes = nodes;
      return std::make_shared<gpu::device_backend>(dev, graph, so);
    });
  const auto plan = nerve::pipeline::make_schedule("1f1b", stages, micro);
  nerve::pipeline::pipeline p(rt, g, nerve::pipeline::partition_by_parameters(g, plan.pieces()), plan,
                              std::make_shared<layers::cross_entropy>(),
                              [] { return layers::make_optimizer<float>("sgd", 0.01, 0.9); }, po);
  std::mt19937_64 rng(1);
  std::normal_distribution<float> d;
  auto batch_of = [&] {
    layers::tensor x(std::int64_t(batch), layers::shape{784});
    for (std::int64_t i = 0; i < x.size(); ++i) x.data()[i] = d(rng);
    layers::targets y;
    for (std::size_t i = 0; i < batch; ++i) y.labels.push_back(std::int32_t(i % 10));
    return std::make_pair(std::move(x), std::move(y));
  };
  const int warmup = kind == gpu::backend_kind::standin ? 1 : 10;
  for (int i = 0; i < warmup; ++i) {
    auto [x, y] = batch_of();
    p.train_step(std::move(x), y, std::uint64_t(i));
  }
  std::vector<double> us;
  for (int i = 0; i < steps; ++i) {
    auto [x, y] = batch_of();
    const auto t0 = clock_type::now();
    p.train_step(std::move(x), y, std::uint64_t(warmup + i));
    us.push_back(us_between(t0, clock_type::now()));
  }
  return summarize(std::move(us));
}

/// The 4-stage pipeline of deep-mlp on one GPU (4 streams) against 1 stage.
json pipeline_bench(gpu::backend_kind kind, bool standin_asked, int steps) {
  if (kind != gpu::backend_kind::cuda && !standin_asked)
    return {{"skipped", "no CUDA device: the 4-stage pipeline figure needs a GPU (--standin runs it small on the "
                        "CPU stand-in, a wiring check, not a figure)"}};
  const bool small = kind != gpu::backend_kind::cuda;
  const std::size_t batch = small ? 64 : 1024;
  const std::uint32_t micro = 8;
  auto one = pipeline_run(kind, 1, batch, micro, steps);
  auto four = pipeline_run(kind, 4, batch, micro, steps);
  const double a = one["median_us"], b = four["median_us"];
  return {{"model", "deep-mlp"}, {"batch", batch}, {"microbatches", micro}, {"schedule", "1f1b"},
          {"one_stage", one},    {"four_stages", four}, {"four_vs_one", b / a}};
}

struct gpu_options {
  bool quick = false, standin = false, no_torch = false, pipeline_only = false;
  int steps = 200;
  std::string torch_script;
};

void run(const gpu_options& opt) {
  const auto kind = opt.standin || gpu::device::cuda_device_count() == 0 ? gpu::backend_kind::standin
                                                                          : gpu::backend_kind::cuda;
  std::string name;
  {
    gpu::device_options o;
    o.backend = kind;
    gpu::device d(o);
    name = d.name();
  }
  std::string script = opt.torch_script;
  if (script.empty()) {
    script = "gpu/bench/torch_step.py";  // from the repository root
    if (!std::filesystem::exists(script))
      script = (std::filesystem::path(__FILE__).parent_path().parent_path().parent_path() / script).string();
  }
  json out{{"device", name}, {"backend", kind == gpu::backend_kind::cuda ? "cuda" : "standin"}};
  const int steps = kind == gpu::backend_kind::standin ? std::min(opt.steps, 3) : (opt.quick ? 50 : opt.steps);
  if (opt.pipeline_only) {
    out["pipeline"] = pipeline_bench(kind, opt.standin, steps);
    std::cout << out.dump(2) << std::endl;
    return;
  }
  // Progress on stderr, each part's figures as it ends: a run cut short still says how far it got.
  const auto done = [](const char* what, const json& j) { std::cerr << "nerve-bench gpu: " << what << ' ' << j.dump() << std::endl; };
  std::cerr << "nerve-bench gpu: device " << name << std::endl;
  out["latency"]["poller"] = latency(kind, gpu::wait_mode::poller, opt.quick);
  done("latency poller", out["latency"]["poller"]);
  out["latency"]["blocking"] = latency(kind, gpu::wait_mode::blocking, opt.quick);
  done("latency blocking", out["latency"]["blocking"]);
  out["steps"] = json::array();
  out["steps"].push_back(step_bench(kind, "mlp", 256, steps, script, !opt.no_torch));
  done("step mlp", out["steps"].back());
  if (kind == gpu::backend_kind::cuda || !opt.quick) {
    out["steps"].push_back(step_bench(kind, "deep-mlp", kind == gpu::backend_kind::cuda ? 1024 : 64, steps, script,
                                      !opt.no_torch));
    done("step deep-mlp", out["steps"].back());
  }
  out["gemm"] = gemm_table(kind, opt.quick);
  done("gemm", out["gemm"]);
  out["pipeline"] = pipeline_bench(kind, opt.standin, steps);
  done("pipeline", out["pipeline"]);
  std::cout << out.dump(2) << std::endl;
}

void add_gpu(CLI::App& app) {
  auto opts = std::make_shared<gpu_options>();
  auto* sub = app.add_subcommand("gpu", "GPU: completion latency (poller vs blocking), training steps vs PyTorch, GEMM");
  sub->add_flag("--quick", opts->quick, "Fewer samples");
  sub->add_flag("--standin", opts->standin, "Run on the CPU stand-in even where a GPU is visible");
  sub->add_option("--steps", opts->steps, "Timed training steps per model (default 200)")
      ->transform(nerve::apps::whole_in(1, 100000));
  sub->add_flag("--no-torch", opts->no_torch, "Skip the PyTorch comparison");
  sub->add_flag("--pipeline", opts->pipeline_only, "Only the 4-stage pipeline on one GPU vs 1 stage");
  sub->add_option("--torch-script", opts->torch_script, "PyTorch twin (default gpu/bench/torch_step.py)");
  sub->callback([opts] { run(*opts); });
}

const nerve::bench::subcommand_registration registration{"gpu", &add_gpu};

}  // namespace

// nerve-bench-mpi training: training across ranks against the same training in one
// process, in one command (run under `mpirun -np N`, N ≥ 2).
//
//   data parallel:  N replicas of --model, --batch rows each (N·batch per step): one replica
//                   per rank (gradients summed over MPI) against N replicas in one process
//                   (N loops) on rank 0 while the other ranks wait.
//   pipeline:       N stages, --batch rows per step in --microbatches, 1F1B: one stage per
//                   rank against N stages in one process on rank 0.
//
// Every repeat runs the four in turn (the one-process runs while the other ranks wait
// asleep, no transport polling; mpirun's binding of ranks to cores undone, as the one-process
// runs need every core), so a noisy neighbour hits them all; medians of the
// samples per second are reported with the ratios ranks / one process. The steps are the
// apps' (layer actors, stage gates, bus signals); the data are random (the speed does not
// depend on them). Rank 0 prints (text or --json).
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "actors/runtime.hpp"
#include "apps/bench/subcommand.hpp"
#include "apps/common/options.hpp"
#include "bus/mpi/transport.hpp"
#include "layers/gemm.hpp"
#include "layers/pipeline/mpi_ranks.hpp"
#include "layers/pipeline/pipeline.hpp"
#include "layers/presets.hpp"

namespace {

namespace nl = nerve::layers;
using bus_session = nerve::bus::mpi::session;
namespace np = nerve::pipeline;
using clock_type = std::chrono::steady_clock;

struct options {
  std::string model = "deep-mlp";
  std::int64_t batch = 256;
  std::uint32_t micro = 8;
  int steps = 20, warmup = 3, repeats = 5;
  bool json = false;
};

struct batch_data {
  nl::tensor x;
  nl::targets t;
};

batch_data random_batch(const nl::graph& g, std::int64_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d;
  batch_data b{nl::tensor(n, g.nodes()[g.inputs()[0]].output_shape), {}};
  for (std::int64_t i = 0; i < b.x.size(); ++i) b.x.data()[i] = d(rng);
  const auto classes = g.nodes()[g.output()].output_shape.numel();
  for (std::int64_t i = 0; i < n; ++i) b.t.labels.push_back(std::int32_t(rng() % std::uint64_t(classes)));
  return b;
}

/// A pipeline over its own graphs (replicas), ready to time.
struct bench_pipeline {
  std::vector<nl::graph> graphs;
  std::unique_ptr<np::pipeline> p;
  std::int64_t rows = 0;
  batch_data data;

  bench_pipeline(nerve::actors::runtime& rt, const options& o, std::uint32_t stages, std::uint32_t replicas,
                 std::int64_t rows_per_step, std::shared_ptr<np::rank_link> link) {
    for (std::uint32_t r = 0; r < replicas; ++r) graphs.push_back(nl::make_preset(o.model, 1));
    std::vector<nl::graph*> ptrs;
    for (auto& g : graphs) ptrs.push_back(&g);
    np::pipeline_options po;
    po.link = std::move(link);
    for (std::uint32_t k = 0; k < stages * replicas; ++k) po.loops.push_back(po.link ? 0 : k % rt.loop_count());
    const auto plan = np::make_schedule("1f1b", stages, stages > 1 ? o.micro : 1);
    p = std::make_unique<np::pipeline>(rt, ptrs, np::partition_by_parameters(graphs[0], stages), plan,
                                       std::make_shared<nl::cross_entropy>(),
                                       [] { return nl::make_optimizer<float>("sgd", 0.01, 0.9); }, po);
    rows = rows_per_step;
    data = random_batch(graphs[0], rows, 7);
  }

  /// Samples per second over `steps` steps after `warmup`.
  double run(const options& o, std::uint64_t& step) {
    for (int k = 0; k < o.warmup; ++k) p->train_step(data.x.clone(), data.t, step++);
    const auto t0 = clock_type::now();
    for (int k = 0; k < o.steps; ++k) p->train_step(data.x.clone(), data.t, step++);
    return double(rows) * o.steps / std::chrono::duration<double>(clock_type::now() - t0).count();
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

void run(const options& o) {
  nl::set_gemm_threads(1);
  // mpirun binds each of a few ranks to a core of its own; the one-process runs need every
  // core (their loops are threads of rank 0), so the whole run is unbound, both sides alike.
  cpu_set_t all;
  CPU_ZERO(&all);
  for (long c = 0; c < sysconf(_SC_NPROCESSORS_ONLN) && c < CPU_SETSIZE; ++c) CPU_SET(int(c), &all);
  sched_setaffinity(0, sizeof all, &all);
  bus_session mpi;
  const int size = mpi.size(), rank = mpi.rank();
  if (size < 2) throw std::runtime_error("training: run it under mpirun with 2 or more ranks");
  mpi.agree("the benchmark's options",
            o.model + " " + std::to_string(o.batch) + " " + std::to_string(o.micro) + " " + std::to_string(o.steps));
  const auto N = std::uint32_t(size);
  std::vector<double> dp_ranks, dp_one, pipe_ranks, pipe_one;
  std::uint64_t s1 = 0, s2 = 0, s3 = 0, s4 = 0;
  for (int r = 0; r < o.repeats; ++r) {
    if (rank == 0 && !o.json) std::fprintf(stderr, "\rrepeat %d/%d", r + 1, o.repeats);
    // One process: rank 0 alone, while the others wait asleep (no transport polls).
    if (rank == 0) {
      nerve::actors::runtime rt({.loops = N});
      {
        bench_pipeline dp(rt, o, 1, N, o.batch * N, nullptr);
        dp_one.push_back(dp.run(o, s2));
        bench_pipeline pipe(rt, o, N, 1, o.batch, nullptr);
        pipe_one.push_back(pipe.run(o, s4));
      }
      rt.shutdown();
    }
    mpi.barrier();
    // Across the ranks: one transport (MPI is called from one thread at a time), its poller
    // on loop 0, where each rank's stage or replica runs.
    nerve::actors::runtime rt({.loops = 1});
    {
      nerve::bus::mpi::transport world(rt, 0);
      {
        bench_pipeline dp(rt, o, 1, N, o.batch * N, np::mpi_ranks(world, 1u << 20));
        dp_ranks.push_back(dp.run(o, s1));
        bench_pipeline pipe(rt, o, N, 1, o.batch, np::mpi_ranks(world, 2u << 20));
        pipe_ranks.push_back(pipe.run(o, s3));
      }
      world.barrier();
    }  // the pipelines, then the transport, before the loop it polls on
    rt.shutdown();
  }
  if (rank == 0 && !o.json) std::fprintf(stderr, "\n");
  if (rank != 0) return;
  const double a = median(dp_ranks), b = median(dp_one), c = median(pipe_ranks), d = median(pipe_one);
  nlohmann::json j{{"benchmark", "training"},
                   {"ranks", size},
                   {"model", o.model},
                   {"repeats", o.repeats},
                   {"steps", o.steps},
                   {"data_parallel", {{"batch_per_replica", o.batch}, {"ranks_samples_per_s", a},
                                      {"one_process_samples_per_s", b}, {"ranks_over_one_process", a / b}}},
                   {"pipeline", {{"schedule", "1f1b"}, {"batch", o.batch}, {"microbatches", o.micro},
                                 {"ranks_samples_per_s", c}, {"one_process_samples_per_s", d},
                                 {"ranks_over_one_process", c / d}}}};
  if (o.json) {
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("nerve-bench-mpi training: %s, %d ranks, median of %d repeats of %d steps\n", o.model.c_str(), size,
              o.repeats, o.steps);
  std::printf("  data parallel, %d x %lld rows:  ranks %8.0f samples/s   one process %8.0f   ranks/one %.2f\n", size,
              static_cast<long long>(o.batch), a, b, a / b);
  std::printf("  pipeline 1f1b, %d stages, M=%u:  ranks %8.0f samples/s   one process %8.0f   ranks/one %.2f\n", size,
              o.micro, c, d, c / d);
}

void add_training(CLI::App& app) {
  auto o = std::make_shared<options>();
  auto* sub = app.add_subcommand(
      "training", "Data-parallel replicas and pipeline stages on MPI ranks against one process (mpirun -np N)");
  sub->add_option("--model", o->model, "Preset: mlp, deep-mlp, lenet, resmlp")->capture_default_str();
  sub->add_option("--batch", o->batch, "Rows per replica (data parallel) and per step (pipeline)")
      ->capture_default_str()
      ->transform(nerve::apps::whole_in<std::int64_t>(1, 1 << 20));
  sub->add_option("--microbatches", o->micro, "Pipeline micro-batches")
      ->capture_default_str()
      ->transform(nerve::apps::whole_in<std::uint32_t>(1, 4096));
  sub->add_option("--steps", o->steps, "Timed steps per repeat")
      ->capture_default_str()
      ->transform(nerve::apps::whole_in<int>(1, 100000));
  sub->add_option("--warmup", o->warmup, "Untimed steps first")
      ->capture_default_str()
      ->transform(nerve::apps::whole_in<int>(0, 1000));
  sub->add_option("--repeats,-r", o->repeats, "Repeats; the median is reported")
      ->capture_default_str()
      ->transform(nerve::apps::whole_in<int>(1, 1000));
  sub->add_flag("--json", o->json, "Print one JSON object (rank 0)");
  sub->callback([o] {
    if (o->batch < o->micro) throw CLI::ValidationError("--batch", "must be at least --microbatches");
    run(*o);
  });
}

const nerve::bench::subcommand_registration reg{"training", &add_training};

}  // namespace

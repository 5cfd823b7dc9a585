// nerve-bench pipeline: training throughput of a model cut into S pipeline stages (one
// event loop each, one GEMM thread each) against the same model as one stage on one loop,
// measured in the same command with the same micro-batches.
//
//   baseline:  [ stage 0: fc1 … fc5 ]                          1 loop
//   pipeline:  [ stage 0: fc1 … relu2 ] ─► [ stage 1: fc3 … fc5 ]   S loops
//
// Each repeat builds fresh runtimes and graphs, runs warm-up steps, then times `--steps`
// steps; the median over repeats is reported with the per-stage bubble (measured and
// theory). Synthetic inputs: the data does not change the arithmetic.
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

#include "apps/bench/subcommand.hpp"
#include "apps/common/options.hpp"
#include "layers/gemm.hpp"
#include "layers/pipeline/pipeline.hpp"
#include "layers/presets.hpp"

namespace {

namespace np = nerve::pipeline;
namespace nl = nerve::layers;

struct options {
  std::string model = "deep-mlp";
  std::uint32_t stages = 2;
  std::uint32_t micro_batches = 8;
  std::int64_t micro_batch_size = 64;
  std::vector<std::string> schedules{"1f1b", "zb-h1", "gpipe"};
  std::string partition = "cost";
  int steps = 10;
  int warmup = 2;
  int repeats = 5;
  bool json = false;
  bool quiet = false;
};

struct run_result {
  double samples_per_s = 0;
  std::vector<np::stage_metrics> stages;
  std::string pieces;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : (v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]));
}

/// One timed run: `stages` stages on as many loops, schedule `name`.
run_result run_once(const options& o, const std::string& name, std::uint32_t stages, std::uint64_t seed) {
  auto g = nl::make_preset(o.model, seed);
  np::partition pieces;
  const std::uint32_t chunks = name == "interleaved" ? 2 : 1;
  const std::size_t n_pieces = std::size_t(stages) * chunks;
  if (o.partition == "params" || n_pieces == 1) pieces = np::partition_by_parameters(g, n_pieces);
  else pieces = np::partition_by_cost(g, np::profile_layers(g, o.micro_batch_size, 3, seed), n_pieces);
  auto plan = np::make_schedule(name, stages, o.micro_batches, chunks);
  nerve::actors::runtime rt(nerve::actors::runtime_options{.loops = stages});
  auto criterion = std::make_shared<nl::cross_entropy>();
  np::pipeline p(rt, g, pieces, plan, criterion, [] { return nl::make_optimizer<float>("sgd", 0.01, 0.9); });
  const std::int64_t batch = o.micro_batch_size * o.micro_batches;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d;
  const auto& in_shape = g.nodes()[g.inputs()[0]].output_shape;
  auto make = [&] {
    nl::tensor x(batch, in_shape);
    for (std::int64_t i = 0; i < x.size(); ++i) x.data()[i] = d(rng);
    nl::targets t;
    for (std::int64_t i = 0; i < batch; ++i) t.labels.push_back(std::int32_t(rng() % 10));
    return std::make_pair(std::move(x), std::move(t));
  };
  for (int s = 0; s < o.warmup; ++s) {
    auto [x, t] = make();
    p.train_step(std::move(x), t, std::uint64_t(s));
  }
  p.reset_metrics();
  double seconds = 0;
  for (int s = 0; s < o.steps; ++s) {
    auto [x, t] = make();  // data preparation is not timed
    const auto t0 = std::chrono::steady_clock::now();
    p.train_step(std::move(x), t, std::uint64_t(o.warmup + s));
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  run_result r;
  r.samples_per_s = double(batch) * o.steps / seconds;
  r.stages = p.metrics();
  r.pieces = np::to_string(g, pieces);
  return r;
}

nlohmann::json stage_json(const np::stage_metrics& m, double theory, double predicted) {
  return {{"stage", m.stage},
          {"busy_s", m.busy_s},
          {"idle_s", m.idle_s},
          {"idle_input_s", m.idle_input_s},
          {"idle_backpressure_s", m.idle_backpressure_s},
          {"idle_optimizer_s", m.idle_optimizer_s},
          {"bubble_fraction", m.bubble_fraction()},
          {"bubble_theory", theory},
          {"bubble_predicted", predicted},
          {"f_mean_s", m.f_count ? m.f_s / double(m.f_count) : 0.0},
          {"b_mean_s", m.b_count ? m.b_s / double(m.b_count) : 0.0},
          {"w_mean_s", m.w_count ? m.w_s / double(m.w_count) : 0.0},
          {"optimizer_s", m.optimizer_s},
          {"peak_stashed_microbatches", m.peak_stashed},
          {"peak_stash_bytes", m.peak_stash_bytes}};
}

void run(const options& o) {
  nl::set_gemm_threads(1);  // one product thread per stage: the loops own the cores
  nlohmann::json out{{"benchmark", "pipeline"},
                     {"model", o.model},
                     {"stages", o.stages},
                     {"microbatches", o.micro_batches},
                     {"microbatch_size", o.micro_batch_size},
                     {"batch", o.micro_batch_size * o.micro_batches},
                     {"steps", o.steps},
                     {"repeats", o.repeats},
                     {"gemm_threads", 1},
                     {"partition", o.partition}};
  // Baseline and pipelines alternate inside each repeat, so a noisy neighbour hits both alike.
  std::vector<double> base;
  std::vector<std::vector<double>> piped(o.schedules.size());
  std::vector<run_result> last(o.schedules.size());
  for (int r = 0; r < o.repeats; ++r) {
    base.push_back(run_once(o, "1f1b", 1, std::uint64_t(r)).samples_per_s);
    for (std::size_t k = 0; k < o.schedules.size(); ++k) {
      last[k] = run_once(o, o.schedules[k], o.stages, std::uint64_t(r));
      piped[k].push_back(last[k].samples_per_s);
    }
    if (!o.quiet) std::fprintf(stderr, "repeat %d/%d done\n", r + 1, o.repeats);
  }
  const double b = median(base);
  out["baseline"] = {{"stages", 1}, {"loops", 1}, {"samples_per_s", b}, {"all", base}};
  out["runs"] = nlohmann::json::array();
  if (!o.json)
    std::printf("nerve-bench pipeline: %s, %u stages, %u micro-batches of %lld, median of %d repeats x %d steps\n"
                "baseline (1 stage, 1 loop): %.0f samples/s\n",
                o.model.c_str(), o.stages, o.micro_batches, static_cast<long long>(o.micro_batch_size), o.repeats,
                o.steps, b);
  for (std::size_t k = 0; k < o.schedules.size(); ++k) {
    const double s = median(piped[k]);
    auto plan = np::make_schedule(o.schedules[k], o.stages, o.micro_batches, o.schedules[k] == "interleaved" ? 2 : 1);
    const double theory = np::bubble_theory(plan);
    const auto predicted = np::predicted_bubbles(plan, last[k].stages);
    // The speedup the cut allows: the stages' busy time summed (one stage doing it all)
    // over the predicted step time (stage 0's busy time over its predicted busy share).
    double busy_sum = 0;
    for (auto& m : last[k].stages) busy_sum += m.busy_s;
    const double cap = last[k].stages.empty() || predicted[0] >= 1
                           ? 0
                           : busy_sum * (1 - predicted[0]) / last[k].stages[0].busy_s;
    nlohmann::json j{{"schedule", o.schedules[k]},
                     {"samples_per_s", s},
                     {"speedup", s / b},
                     {"speedup_predicted", cap},
                     {"all", piped[k]},
                     {"pieces", last[k].pieces},
                     {"stages_last_repeat", nlohmann::json::array()}};
    for (auto& m : last[k].stages) j["stages_last_repeat"].push_back(stage_json(m, theory, predicted[m.stage]));
    out["runs"].push_back(j);
    if (!o.json) {
      std::printf("%-12s %8.0f samples/s  %.2fx (the cut allows %.2fx)   pieces %s\n", o.schedules[k].c_str(), s,
                  s / b, cap, last[k].pieces.c_str());
      for (auto& m : last[k].stages)
        std::printf("    stage %u: busy %.3f s, idle %.3f s (input %.3f, optimizer %.3f), bubble %5.1f%% (theory %4.1f%%, "
                    "predicted for this cut %4.1f%%), peak %zu micro-batches\n",
                    m.stage, m.busy_s, m.idle_s, m.idle_input_s, m.idle_optimizer_s, 100 * m.bubble_fraction(),
                    100 * theory, 100 * predicted[m.stage], m.peak_stashed);
    }
  }
  if (o.json) std::printf("%s\n", out.dump(2).c_str());
}

void add_pipeline(CLI::App& app) {
  auto o = std::make_shared<options>();
  auto* sub = app.add_subcommand("pipeline", "Pipeline-parallel training throughput against one stage on one loop");
  sub->add_option("--model", o->model, "Preset: mlp, deep-mlp, lenet, resmlp")->capture_default_str();
  sub->add_option("--stages", o->stages, "Pipeline stages (one loop each)")
      ->capture_default_str()
      ->transform(nerve::apps::whole_in<std::uint32_t>(1, 256));
  sub->add_option("--microbatches", o->micro_batches, "Micro-batches per step")
      ->capture_default_str()
      ->transform(nerve::apps::whole_in<std::uint32_t>(1, 4096));
  sub->add_option("--microbatch-size", o->micro_batch_size, "Samples per micro-batch")
      ->capture_default_str()
      ->transform(nerve::apps::whole_in<std::int64_t>(1, 65536));
  sub->add_option("--schedules", o->schedules, "Schedules to run: gpipe, 1f1b, interleaved, zb-h1")->capture_default_str();
  sub->add_option("--partition", o->partition, "cost (profiled) or params")->capture_default_str();
  sub->add_option("--steps", o->steps, "Timed steps per repeat")
      ->capture_default_str()
      ->transform(nerve::apps::whole_in(1, 100000));
  sub->add_option("--warmup", o->warmup, "Untimed steps first")
      ->capture_default_str()
      ->transform(nerve::apps::whole_in(0, 1000));
  sub->add_option("--repeats,-r", o->repeats, "Repeats; the median is reported")
      ->capture_default_str()
      ->transform(nerve::apps::whole_in(1, 1000));
  sub->add_flag("--json", o->json, "Print one JSON object");
  sub->add_flag("--quiet,-q", o->quiet, "No progress lines on stderr");
  sub->callback([o] { run(*o); });
}

const nerve::bench::subcommand_registration reg{"pipeline", &add_pipeline};

}  // namespace

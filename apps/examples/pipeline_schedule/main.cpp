// A pipeline run from a schedule file: the schedule library writes a 1F1B schedule
// for 2 stages and 4 micro-batches, the file is read back, checked and run.
//
//            stage 0 (loop 0)               stage 1 (loop 1)
//   input ─► fc1 ─► relu1 ─► fc2 ─► relu2 ─►│─► fc3 ─► relu3 ─► fc4 ─► loss
//                                ◄── gradients ──┘
//   schedule.txt (what each stage runs, in order):
//     stage 0: F0 F1 B0 F2 B1 F3 B2 B3
//     stage 1: F0 B0 F1 B1 F2 B2 F3 B3
//
// A schedule is plain data (layers/pipeline/schedule.hpp, target nerve::schedule): it
// can be made, edited by hand in its text form, validated and simulated without any
// runtime. The pipeline (nerve::pipeline) runs each stage's list on its own loop.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>

#include "layers/activation.hpp"
#include "layers/linear.hpp"
#include "layers/loss.hpp"
#include "layers/optimizer.hpp"
#include "layers/pipeline/pipeline.hpp"

namespace nl = nerve::layers;
namespace np = nerve::pipeline;

int main() {
  const std::filesystem::path file = "schedule.txt";
  np::save_schedule(np::make_schedule("1f1b", /*stages=*/2, /*micro_batches=*/4), file);
  np::schedule plan = np::load_schedule(file);
  np::validate(plan);  // throws schedule_error naming the stage and step at fault
  std::printf("%s (from %s):\n%s", std::string(np::to_string(np::schedule_kind::one_f_one_b)).c_str(),
              file.c_str(), np::to_table(plan).c_str());

  nl::graph_builder b;
  b.input("input", {24});
  b.add("fc1", nl::linear(24, 48), {"input"});
  b.add("relu1", nl::relu(), {"fc1"});
  b.add("fc2", nl::linear(48, 48), {"relu1"});
  b.add("relu2", nl::relu(), {"fc2"});
  b.add("fc3", nl::linear(48, 48), {"relu2"});
  b.add("relu3", nl::relu(), {"fc3"});
  b.add("fc4", nl::linear(48, 5), {"relu3"});
  nl::graph g = b.build(/*seed=*/5);
  np::partition cut = np::partition_at(g, {"fc3"});  // stage 1 starts at fc3
  std::printf("pieces: %s\n", np::to_string(g, cut).c_str());

  std::mt19937 rng(3);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  nl::tensor x(64, {24});
  nl::targets y;
  for (int i = 0; i < 64; ++i) {
    y.labels.push_back(i % 5);
    for (int j = 0; j < 24; ++j) x.row(i)[j] = noise(rng) + (j == i % 5 ? 3.0f : 0.0f);
  }

  nerve::actors::runtime rt({.loops = 2});
  np::pipeline p(rt, g, cut, plan, std::make_shared<nl::cross_entropy>(),
                 [] { return nl::make_optimizer<float>("sgd", 0.1, 0.9); });
  double first = 0, last = 0;
  for (std::uint64_t step = 0; step < 6; ++step) {
    auto r = p.train_step(x.clone(), y, step);  // blocks until every stage reported
    std::printf("step %llu  loss %.4f\n", static_cast<unsigned long long>(step), r.loss);
    (step == 0 ? first : last) = r.loss;
  }
  for (const auto& m : p.metrics())
    std::printf("stage %u: %lld actions, bubble %.0f%%\n", m.stage, static_cast<long long>(m.actions),
                100 * m.bubble_fraction());
  return last < first ? 0 : 1;
}

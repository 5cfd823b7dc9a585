// What hooks are told (node, micro-batch, step, training or evaluation) and on which
// thread they run, under the direct executor and under the actor network.
#include <doctest/doctest.h>

#include <algorithm>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "actors/runtime.hpp"
#include "layers/executor.hpp"
#include "layers/network.hpp"
#include "layers/presets.hpp"
#include "tests/layers/common.hpp"

using namespace nerve;
using namespace nerve::layers;

namespace {

tensor random_images(std::int64_t n, std::uint64_t seed) {
  tensor t(n, shape{784});
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  for (std::int64_t i = 0; i < t.size(); ++i) t.data()[i] = u(rng);
  return t;
}

using nerve::layers::testing::random_labels;

/// One hook call as seen: which hook, node, micro-batch, step, training, and its thread.
struct seen_call {
  std::string hook;
  std::string node;
  std::uint64_t micro_batch;
  std::uint64_t step;
  bool training;
  std::thread::id thread;
  bool operator<(const seen_call& o) const {
    return std::tie(hook, node, micro_batch, step, training) < std::tie(o.hook, o.node, o.micro_batch, o.step, o.training);
  }
};

/// Records every forward and backward hook call of `fc1` and `fc2` (hooks may run on
/// several loop threads at once, hence the lock).
struct recorder {
  std::mutex mu;
  std::vector<seen_call> calls;
  void attach(graph& g) {
    for (const char* name : {"fc1", "fc2"}) {
      g.register_forward_hook(name, [this](const hook_context& c, tensor&) { note("forward", c); });
      g.register_backward_hook(name, [this](const hook_context& c, std::vector<tensor>&, const tensor&) {
        note("backward", c);
      });
    }
  }
  void note(const char* hook, const hook_context& c) {
    std::lock_guard lk(mu);
    calls.push_back({hook, std::string(c.node), c.micro_batch, c.step, c.training, std::this_thread::get_id()});
  }
  /// The calls so far, sorted (actors on several loops may run them in any order), then forgotten.
  std::vector<seen_call> take() {
    std::lock_guard lk(mu);
    auto out = std::exchange(calls, {});
    std::sort(out.begin(), out.end());
    return out;
  }
};

/// The calls a training step of `micro_batches` at `step` must make: every micro-batch
/// through both hooks of both nodes.
std::vector<seen_call> training_calls(std::size_t micro_batches, std::uint64_t step) {
  std::vector<seen_call> want;
  for (const char* hook : {"backward", "forward"})
    for (const char* node : {"fc1", "fc2"})
      for (std::uint64_t m = 0; m < micro_batches; ++m) want.push_back({hook, node, m, step, true, {}});
  std::sort(want.begin(), want.end());
  return want;
}

/// The calls one evaluation makes: forward hooks only, micro-batch 0, step 0, not training.
std::vector<seen_call> evaluation_calls() {
  return {{"forward", "fc1", 0, 0, false, {}}, {"forward", "fc2", 0, 0, false, {}}};
}

bool same_calls(const std::vector<seen_call>& got, const std::vector<seen_call>& want) {
  if (got.size() != want.size()) return false;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (got[i] < want[i] || want[i] < got[i]) return false;
  return true;
}

std::string describe(const std::vector<seen_call>& calls) {
  std::string s;
  for (const auto& c : calls)
    s += c.hook + " " + c.node + " mb " + std::to_string(c.micro_batch) + " step " + std::to_string(c.step) +
         (c.training ? " training\n" : " evaluation\n");
  return s;
}

}  // namespace

TEST_SUITE("layers.hooks") {
  TEST_CASE("direct executor hooks see the step and the mode, on the caller's thread") {
    auto g = make_preset("mlp", 3);
    recorder rec;
    rec.attach(g);
    direct_executor ex(g);
    cross_entropy loss;
    sgd opt({.lr = 0.1});

    ex.train_step(random_images(6, 1), random_labels(6, 1), loss, opt, /*micro_batches=*/3, /*step=*/7);
    auto calls = rec.take();
    CAPTURE(describe(calls));
    CHECK(same_calls(calls, training_calls(3, 7)));
    for (const auto& c : calls) CHECK(c.thread == std::this_thread::get_id());

    SUBCASE("evaluate") { ex.evaluate(random_images(4, 2), random_labels(4, 2), loss); }
    SUBCASE("predict") { ex.predict(random_images(4, 2)); }
    calls = rec.take();
    CAPTURE(describe(calls));
    CHECK(same_calls(calls, evaluation_calls()));
    for (const auto& c : calls) CHECK(c.thread == std::this_thread::get_id());

    // A forward by hand is training: its step and micro-batch are the context's.
    g.zero_grad();
    ex.forward(random_images(2, 3), {.micro_batch = 4, .step = 11});
    ex.backward(4, tensor::constant(2, {10}, 0.1f));
    calls = rec.take();
    CAPTURE(describe(calls));
    CHECK(same_calls(calls, {{"backward", "fc1", 4, 11, true, {}},
                             {"backward", "fc2", 4, 11, true, {}},
                             {"forward", "fc1", 4, 11, true, {}},
                             {"forward", "fc2", 4, 11, true, {}}}));
  }

  TEST_CASE("network hooks see the step and the mode, on their layer actor's loop") {
    auto g = make_preset("mlp", 3);
    recorder rec;
    rec.attach(g);
    actors::runtime rt({.loops = 2});
    network net(rt, g, std::make_shared<cross_entropy>(), [] { return std::make_unique<sgd>(sgd_options{.lr = 0.1}); },
                network_options{.loops = {0, 0, 0, 1}});  // input, fc1, relu1 on loop 0; fc2 on loop 1

    for (std::uint64_t step : {5u, 6u}) {
      net.train_step(random_images(8, step), random_labels(8, step), /*micro_batches=*/2, step).get();
      auto calls = rec.take();
      CAPTURE(describe(calls));
      CHECK(same_calls(calls, training_calls(2, step)));
      for (const auto& c : calls) CHECK(c.thread != std::this_thread::get_id());
    }

    SUBCASE("evaluate") { net.evaluate(random_images(4, 2), random_labels(4, 2)).get(); }
    SUBCASE("predict") { net.predict(random_images(4, 2)).get(); }
    auto calls = rec.take();
    CAPTURE(describe(calls));
    CHECK(same_calls(calls, evaluation_calls()));
    // fc1 and fc2 run their hooks on their own loops' threads.
    REQUIRE(calls.size() == 2);
    CHECK(calls[0].thread != calls[1].thread);
    CHECK(calls[0].thread != std::this_thread::get_id());
  }
}

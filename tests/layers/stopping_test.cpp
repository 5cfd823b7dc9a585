// The one trainer's helpers: early stopping on the test loss, the best evaluation's
// weights, the learning-rate range test, and what a stopped run writes.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "layers/activation.hpp"
#include "layers/early_stop.hpp"
#include "layers/linear.hpp"
#include "layers/lr_find.hpp"
#include "layers/trainer.hpp"
#include "tests/layers/tiny_fashion_mnist.hpp"

using namespace nerve;
using namespace nerve::layers;
using nerve::testing::tiny_fashion_mnist;

namespace {

graph small_graph() {
  graph_builder b;
  b.input("image", shape{784});
  b.add("fc1", linear(784, 16), {"image"});
  b.add("act1", relu(), {"fc1"});
  b.add("head", linear(16, 10), {"act1"});
  return b.build(3);
}

/// Every parameter of `g` by name, copied.
std::map<std::string, std::vector<float>> weights_of(graph& g) {
  std::map<std::string, std::vector<float>> w;
  for (auto& p : g.parameters()) w[p.name].assign(p.value->data(), p.value->data() + p.value->size());
  return w;
}

/// Bitwise equal, tensor by tensor (NaN-safe, unlike ==).
bool same_bits(const std::map<std::string, std::vector<float>>& a, const std::map<std::string, std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, v] : a) {
    auto it = b.find(name);
    if (it == b.end() || it->second.size() != v.size()) return false;
    if (std::memcmp(v.data(), it->second.data(), v.size() * sizeof(float)) != 0) return false;
  }
  return true;
}

std::future<step_result> ready(step_result r) {
  std::promise<step_result> p;
  p.set_value(r);
  return p.get_future();
}

/// The cpu engine with the test loss of evaluation k (from 0) replaced by `test_losses[k]`:
/// a run whose figure stalls as the test says. The training is the real one.
engine_factory scripted_test_loss(std::vector<double> test_losses, int& evaluations) {
  struct engine : train_engine {
    std::unique_ptr<train_engine> inner;
    std::vector<double> losses;
    int* count = nullptr;
    std::future<step_result> train_step(tensor x, targets y, std::size_t m, std::uint64_t step, double lr) override {
      return inner->train_step(std::move(x), std::move(y), m, step, lr);
    }
    std::future<step_result> evaluate(tensor x, targets y) override {
      auto r = inner->evaluate(std::move(x), std::move(y)).get();
      r.loss = losses.at(std::size_t((*count)++));
      return ready(r);
    }
    void finish() override { inner->finish(); }
    void sync_weights() override { inner->sync_weights(); }
    optimizer_state optimizer_state_of() override { return inner->optimizer_state_of(); }
  };
  return [losses = std::move(test_losses), &evaluations](actors::runtime& rt, graph& g, const train_options& o) {
    auto e = std::make_unique<engine>();
    e->inner = make_network_engine(rt, g, o);
    e->losses = losses;
    e->count = &evaluations;
    return e;
  };
}

/// An engine that trains nothing: step t reports `losses[t]` and the trainer's rate is
/// written down.
struct scripted_steps : train_engine {
  std::vector<double> losses, rates;
  std::future<step_result> train_step(tensor x, targets, std::size_t, std::uint64_t step, double lr) override {
    rates.push_back(lr);
    return ready({losses.at(std::size_t(step)), 0, x.batch()});
  }
  std::future<step_result> evaluate(tensor x, targets) override { return ready({0, 0, x.batch()}); }
};

}  // namespace

TEST_SUITE("layers.trainer.stopping") {
  TEST_CASE("the best evaluation is the lowest test loss, a tie keeps the earlier, patience counts the rest") {
    best_evaluation b(2);
    CHECK(b.add(1, 3.0));
    CHECK(b.add(2, 2.0));
    CHECK_FALSE(b.add(3, 2.0));  // a tie is no improvement
    CHECK_FALSE(b.exhausted());
    CHECK_FALSE(b.add(4, NAN));  // nor is a non-finite loss
    CHECK(b.exhausted());
    CHECK(b.best_epoch() == 2);
    CHECK(b.best_loss() == 2.0);
    best_evaluation never;  // no patience: never exhausted
    for (int e = 1; e <= 10; ++e) never.add(e, double(e));
    CHECK_FALSE(never.exhausted());
  }

  TEST_CASE("early stopping ends the run at the epoch whose evaluation is the PATIENCE-th without improvement") {
    tiny_fashion_mnist data(96, 20);
    train_options o;
    o.data = data.dir;
    o.batch = 32;  // 3 steps an epoch
    o.epochs = 10;
    o.early_stop = 2;
    o.save = data.dir / "last.st";
    // Best at epoch 2; epochs 3 and 4 do not improve (4 ties it): the run ends after epoch 4.
    int evaluations = 0;
    auto g = small_graph();
    std::vector<int> seen;
    auto report = train(g, o, {}, [&](const epoch_stats& e) { seen.push_back(e.epoch); },
                        scripted_test_loss({3.0, 2.0, 2.5, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0}, evaluations));
    CHECK(report.early_stopped);
    CHECK(evaluations == 4);
    CHECK(seen == std::vector<int>{1, 2, 3, 4});
    CHECK(report.steps == 12);
    CHECK(report.best_epoch == 2);
    CHECK(report.best_test_loss == 2.0);
    CHECK_FALSE(report.interrupted);
    // --save is written at an early stop: the weights of the last step.
    REQUIRE(std::filesystem::exists(o.save));
    auto copy = small_graph();
    load_weights(copy, o.save);
    CHECK(same_bits(weights_of(copy), weights_of(g)));

    SUBCASE("without --early-stop the same run goes to its last epoch") {
      evaluations = 0;
      o.early_stop.reset();
      auto g2 = small_graph();
      auto full = train(g2, o, {}, {}, scripted_test_loss({3.0, 2.0, 2.5, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0}, evaluations));
      CHECK_FALSE(full.early_stopped);
      CHECK(full.epochs.size() == 10);
      CHECK(full.best_epoch == 5);
    }
  }

  TEST_CASE("--save-best holds the weights of the best evaluation, bitwise") {
    tiny_fashion_mnist data(96, 20);
    train_options o;
    o.data = data.dir;
    o.batch = 32;
    o.epochs = 5;
    o.save_best = data.dir / "best.st";
    int evaluations = 0;
    auto g = small_graph();
    std::map<int, std::map<std::string, std::vector<float>>> after;  // the weights after each epoch
    auto report = train(g, o, {}, [&](const epoch_stats& e) { after[e.epoch] = weights_of(g); },
                        scripted_test_loss({3.0, 1.5, 2.5, 1.9, 1.5}, evaluations));
    CHECK(report.best_epoch == 2);
    REQUIRE(after.size() == 5);
    REQUIRE(std::filesystem::exists(o.save_best));
    auto best = small_graph();
    load_weights(best, o.save_best);
    CHECK(same_bits(weights_of(best), after[2]));
    CHECK_FALSE(same_bits(after[2], after[5]));  // the last epoch moved on: the file is not just the end
  }

  TEST_CASE("a stop request still writes --save: the weights of the last step taken") {
    tiny_fashion_mnist data(160, 10);
    train_options o;
    o.data = data.dir;
    o.batch = 32;
    o.epochs = 3;
    o.save = data.dir / "w.st";
    std::atomic<bool> stop{false};
    o.stop = &stop;
    auto g = small_graph();
    auto report = train(g, o, [&](const train_progress& p) {
      if (p.epoch == 2 && p.batch == 2) stop = true;
    });
    CHECK(report.interrupted);
    CHECK(report.steps == 7);
    REQUIRE(std::filesystem::exists(o.save));
    auto copy = small_graph();
    load_weights(copy, o.save);
    CHECK(same_bits(weights_of(copy), weights_of(g)));
  }

  TEST_CASE("the rate range test takes the exact geometric rates and stops when the loss diverges") {
    tiny_fashion_mnist data(64, 10);
    train_options o;
    o.data = data.dir;
    o.batch = 16;  // 4 steps an epoch: the test goes on over epochs
    o.lr_find = lr_range{1e-6, 1.0, 20, 4.0};
    // Lowest 0.8 at step 3; step 8's 3.2 is 4 × 0.8 exactly, not above it; step 9's 5.0 is.
    const std::vector<double> losses{2.0, 1.5, 1.0, 0.8, 0.9, 1.2, 2.0, 2.5, 3.2, 5.0,
                                     1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0};
    auto scripted = [](std::vector<double> l) -> engine_factory {
      return [l](actors::runtime&, graph&, const train_options&) {
        auto e = std::make_unique<scripted_steps>();
        e->losses = l;
        return std::unique_ptr<train_engine>(std::move(e));
      };
    };
    o.metrics = data.dir / "lr.jsonl";
    auto g = small_graph();
    auto report = train(g, o, {}, {}, scripted(losses));
    {  // the curves file says it is a range test, so nerve-trace curves draws loss against rate
      std::ifstream in(o.metrics);
      std::string first;
      std::getline(in, first);
      CHECK(first.find(R"("lr_find":{"min_lr":1e-06,"max_lr":1.0,"steps":20})") != std::string::npos);
    }
    o.metrics.clear();
    const auto& f = report.lr_find;
    CHECK(f.diverged);
    REQUIRE(f.points.size() == 10);  // steps 0 to 9: the diverging one is the last taken
    CHECK(report.steps == 10);
    for (std::size_t t = 0; t < f.points.size(); ++t) {
      CAPTURE(t);
      const double want = 1e-6 * std::pow(1.0 / 1e-6, double(t) / 19.0);
      CHECK(f.points[t].lr == want);  // exact: the same expression, the same bits
      CHECK(f.points[t].lr == lr_range_rate(*o.lr_find, std::int64_t(t)));
    }
    CHECK(f.points.front().lr == 1e-6);
    CHECK(f.min_loss_lr == f.points[3].lr);
    CHECK(f.suggested_lr == f.points[3].lr / 10);
    CHECK(lr_range_rate(*o.lr_find, 19) == doctest::Approx(1.0));

    SUBCASE("a loss that never diverges runs every step, over as many epochs as they need") {
      auto g2 = small_graph();
      auto all = train(g2, o, {}, {}, scripted(std::vector<double>(20, 1.0)));
      CHECK_FALSE(all.lr_find.diverged);
      CHECK(all.lr_find.points.size() == 20);
      CHECK(all.epochs.size() == 5);
      CHECK(all.lr_find.points.back().lr == doctest::Approx(1.0));
    }
  }

  TEST_CASE("the helpers' options are refused out of range or without what they need, naming the option") {
    tiny_fashion_mnist data(32, 10);
    train_options o;
    o.data = data.dir;
    auto refused = [&](const train_options& bad, const std::string& what) {
      CAPTURE(what);
      try {
        check_options(bad);
        FAIL("accepted");
      } catch (const std::invalid_argument& e) {
        CHECK(std::string(e.what()).find(what) != std::string::npos);
      }
    };
    auto a = o;
    a.early_stop = 0;
    refused(a, "--early-stop must be at least 1 evaluation without improvement (got 0)");
    a.early_stop = -3;
    refused(a, "(got -3)");
    a = o;
    a.early_stop = 2;
    a.evaluate = false;
    refused(a, "--early-stop watches the test loss after each epoch: it cannot be given with --no-eval");
    a = o;
    a.save_best = data.dir / "b.st";
    a.evaluate = false;
    refused(a, "--save-best keeps the weights of the best evaluation: it cannot be given with --no-eval");
    a.evaluate = true;
    a.save = a.save_best;
    refused(a, "--save-best");  // one file under two options
    a = o;
    a.save_best = data.dir;  // a directory
    refused(a, data.dir.string());
    a = o;
    a.lr_find = lr_range{};
    a.save = data.dir / "w.st";
    refused(a, "--save cannot be given with --lr-find");
    a.save.clear();
    a.early_stop = 3;
    refused(a, "--early-stop cannot be given with --lr-find");
    a.early_stop.reset();
    a.schedule = "cosine";
    refused(a, "--schedule cannot be given with --lr-find");
    a.schedule = "none";
    a.steps = 5;
    refused(a, "--steps cannot be given with --lr-find");
    a.steps = -1;
    a.lr_find = lr_range{1e-3, 1e-4, 10, 4};
    refused(a, "--lr-find: the highest rate must be a finite number above the lowest 0.001 (got 0.0001)");
    a.lr_find = lr_range{0, 1, 10, 4};
    refused(a, "--lr-find: the lowest rate must be a finite number above 0 (got 0)");
    a.lr_find = lr_range{1e-5, 1, 1, 4};
    refused(a, "--lr-find-steps must be at least 2 (got 1)");
    a.lr_find = lr_range{1e-5, 1, 10, 1};
    refused(a, "the divergence factor must be a finite number above 1 (got 1)");
    a.lr_find = lr_range{};
    CHECK_NOTHROW(check_options(a));
  }
}

// Evaluation and prediction without training (layers/inference.hpp): weights from a
// --save file or a checkpoint, the figures bitwise those of the run that wrote them, and
// the class counts and predictions consistent with them.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "layers/checkpoint/checkpoint.hpp"
#include "layers/inference.hpp"
#include "layers/presets.hpp"
#include "layers/trainer.hpp"
#include "tests/layers/tiny_fashion_mnist.hpp"

using namespace nerve;
using namespace nerve::layers;
using nerve::testing::tiny_fashion_mnist;

namespace {

/// A short mlp run with momentum (so its checkpoint holds optimizer buffers).
train_options short_run_options(const std::filesystem::path& data) {
  train_options o;
  o.model = "mlp";
  o.data = data;
  o.epochs = 2;
  o.batch = 32;
  o.lr = 0.05;
  o.momentum = 0.9;
  return o;
}

bool same_weights(graph& a, graph& b) {
  auto pa = a.parameters(), pb = b.parameters();
  if (pa.size() != pb.size()) return false;
  for (std::size_t i = 0; i < pa.size(); ++i)
    if (pa[i].name != pb[i].name || pa[i].value->size() != pb[i].value->size() ||
        std::memcmp(pa[i].value->data(), pb[i].value->data(), sizeof(float) * std::size_t(pa[i].value->size())) != 0)
      return false;
  return true;
}

/// The labels of the test split of `dir`.
std::vector<std::int32_t> test_labels(const std::filesystem::path& dir) {
  return data::load_fashion_mnist(dir, data::split::test).labels;
}

}  // namespace

TEST_SUITE("layers.inference") {
  TEST_CASE("load_weights takes the weights out of a checkpoint and leaves its optimizer state") {
    tiny_fashion_mnist data(128, 20);
    auto o = short_run_options(data.dir);
    o.checkpoint = data.dir / "run.ck";
    auto trained = make_preset("mlp", 0);
    train(trained, o);
    REQUIRE(checkpoint::load_checkpoint(o.checkpoint).contains("optimizer.fc1.bias.momentum_buffer"));
    auto loaded = make_preset("mlp", 7);  // other weights, which the checkpoint's replace
    CHECK_FALSE(same_weights(loaded, trained));
    load_weights(loaded, o.checkpoint);
    CHECK(same_weights(loaded, trained));
  }

  TEST_CASE("evaluate on the saved weights gives bitwise the trained run's last test figures") {
    tiny_fashion_mnist data(128, 1500);  // two evaluation chunks, the second short
    auto o = short_run_options(data.dir);
    o.save = data.dir / "w.safetensors";
    o.checkpoint = data.dir / "run.ck";
    o.class_figures = true;
    auto trained = make_preset("mlp", 0);
    const auto report = train(trained, o);
    const auto& last = report.epochs.back();
    for (const auto& weights : {o.save, o.checkpoint}) {
      CAPTURE(weights);
      train_options e;
      e.model = "mlp";
      e.data = data.dir;
      e.init = weights;
      auto g = make_preset("mlp", 3);
      const auto got = evaluate(g, e);
      CHECK(got.test.loss == last.test_loss);  // bitwise: the same arithmetic on the same weights
      CHECK(got.test.accuracy == last.test_accuracy);
      CHECK(got.test.samples == 1500);
      CHECK(got.classes.confusion == report.classes.confusion);
    }
  }

  TEST_CASE("the class counts agree with the accuracy, and each row sums to its class's samples") {
    tiny_fashion_mnist data(128, 1200);
    auto o = short_run_options(data.dir);
    o.class_figures = true;
    auto g = make_preset("mlp", 0);
    const auto report = train(g, o);
    const auto& c = report.classes;
    REQUIRE(c.confusion.size() == 10);
    const auto labels = test_labels(data.dir);
    std::vector<std::int64_t> per_class(10, 0);
    for (auto l : labels) ++per_class[std::size_t(l)];
    CHECK(c.samples() == per_class);
    std::int64_t diagonal = 0;
    for (std::size_t t = 0; t < 10; ++t) {
      REQUIRE(c.confusion[t].size() == 10);
      diagonal += c.confusion[t][t];
      CHECK(c.accuracy()[t] == (per_class[t] ? double(c.confusion[t][t]) / double(per_class[t]) : 0.0));
    }
    CHECK(double(diagonal) / double(labels.size()) == report.epochs.back().test_accuracy);
    // Without asking, no extra pass and no counts.
    o.class_figures = false;
    auto g2 = make_preset("mlp", 0);
    CHECK(train(g2, o).classes.confusion.empty());
  }

  TEST_CASE("predictions: a row per test sample, probabilities that sum to 1, as many right as the accuracy says") {
    tiny_fashion_mnist data(128, 1100);
    auto o = short_run_options(data.dir);
    o.save = data.dir / "w.safetensors";
    auto trained = make_preset("mlp", 0);
    const auto report = train(trained, o);
    train_options e;
    e.model = "mlp";
    e.data = data.dir;
    e.init = o.save;
    auto g = make_preset("mlp", 0);
    const auto csv = data.dir / "p.csv";
    const auto got = evaluate(g, e, csv);
    std::ifstream in(csv);
    std::string line;
    REQUIRE(std::getline(in, line));
    CHECK(line == "index,predicted,p0,p1,p2,p3,p4,p5,p6,p7,p8,p9");
    const auto labels = test_labels(data.dir);
    std::size_t rows = 0;
    std::int64_t right = 0;
    while (std::getline(in, line)) {
      std::stringstream fields(line);
      std::string f;
      std::vector<double> v;
      while (std::getline(fields, f, ',')) v.push_back(std::stod(f));
      REQUIRE(v.size() == 12);
      CHECK(v[0] == double(rows));
      double sum = 0, best = -1;
      std::size_t arg = 0;
      for (std::size_t k = 0; k < 10; ++k) {
        sum += v[2 + k];
        if (v[2 + k] > best) best = v[2 + k], arg = k;
      }
      CHECK(sum == doctest::Approx(1.0).epsilon(1e-6));
      CHECK(v[1] == double(arg));
      right += std::int64_t(v[1]) == labels[rows];
      ++rows;
    }
    CHECK(rows == 1100);
    CHECK(right == got.test.correct);
    CHECK(right == std::llround(report.epochs.back().test_accuracy * 1100));
  }

  TEST_CASE("evaluate refuses a run without weights, and predictions over the weights they come from") {
    tiny_fashion_mnist data(64, 10);
    train_options e;
    e.model = "mlp";
    e.data = data.dir;
    auto g = make_preset("mlp", 0);
    CHECK_THROWS_WITH_AS(evaluate(g, e), doctest::Contains("needs --init FILE"), std::invalid_argument);
    e.init = data.dir / "w.safetensors";
    save_weights(g, e.init, "mlp");
    CHECK_THROWS_WITH_AS(evaluate(g, e, e.init), doctest::Contains("is the file --init names"), std::invalid_argument);
  }
}

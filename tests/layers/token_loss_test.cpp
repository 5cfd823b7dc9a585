// Cross-entropy over every token of [B, T, vocab] predictions with [B, T] labels (a GPT's
// loss): PyTorch parity (scripts/torch_reference_attention.py), micro-batches of
// sequences, and the refusals that name the sample and the token.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>

#include "layers/checkpoint/safetensors.hpp"
#include "layers/executor.hpp"
#include "layers/graph.hpp"
#include "layers/linear.hpp"
#include "layers/loss.hpp"
#include "layers/optimizer.hpp"
#include "tests/layers/gradcheck.hpp"

using namespace nerve::layers;
using nerve::checkpoint::safetensors_file;
using nerve::layers::testing::random_tensor;

namespace {

/// `[B, T]` labels from the fixture, and the logits as a batch of `[T, V]` samples.
struct token_case {
  tensor logits;
  targets y;
};

token_case load_case(const safetensors_file& f) {
  const auto& info = f.at("logits");
  auto values = f.to_float(info);
  const auto b = std::int64_t(info.shape[0]), t = std::int64_t(info.shape[1]), vocab = std::int64_t(info.shape[2]);
  token_case c{tensor(b, shape{t, vocab}), {}};
  std::copy(values.begin(), values.end(), c.logits.data());
  for (auto v : f.to_int64(f.at("labels"))) c.y.labels.push_back(std::int32_t(v));
  c.y.labels_per_sample = t;
  return c;
}

}  // namespace

TEST_SUITE("layers.token_loss") {
  TEST_CASE("cross-entropy over every token matches PyTorch's over the flattened tokens") {
    const auto f = safetensors_file::read(std::filesystem::path(NERVE_LAYERS_FIXTURES) /
                                          "torch_cross_entropy_tokens.safetensors");
    auto c = load_case(f);
    REQUIRE(c.y.size() == 2);  // samples, each of 5 tokens
    cross_entropy ce;
    auto r = ce.forward(c.logits, c.y);
    const double want = f.to_float(f.at("loss"))[0];
    CHECK(std::abs(r.loss - want) <= 1e-5 * std::abs(want));
    const auto g = ce.backward(r.stash);
    CHECK(g.sample_shape() == shape{5, 7});
    const auto grad = f.to_float(f.at("grad_logits"));
    REQUIRE(std::int64_t(grad.size()) == g.size());
    double diff = 0, scale = 0;
    for (std::size_t i = 0; i < grad.size(); ++i) {
      diff = std::max(diff, std::abs(double(g.data()[i]) - double(grad[i])));
      scale = std::max(scale, std::abs(double(grad[i])));
    }
    CHECK(diff <= 1e-5 * scale);
    CHECK(r.correct >= 0);
    CHECK(r.correct <= 10);  // tokens, not samples
  }

  TEST_CASE("targets of sequences slice by samples, each with its tokens' labels") {
    targets y;
    y.labels = {0, 1, 2, 3, 4, 5, 6, 7, 8};
    y.labels_per_sample = 3;
    CHECK(y.size() == 3);
    const auto mid = y.slice(1, 2);
    CHECK(mid.labels == std::vector<std::int32_t>{3, 4, 5, 6, 7, 8});
    CHECK(mid.labels_per_sample == 3);
    CHECK(mid.size() == 2);
    CHECK(y.clone().labels == y.labels);
  }

  TEST_CASE("a per-token model trained in micro-batches of sequences takes the mean over every token") {
    // Linear per token into a vocabulary of 6: two steps of 4 sequences of 5 tokens, in 1
    // and in 2 micro-batches, land on the same weights within rounding.
    auto build = [] {
      graph_builder b;
      b.input("tokens", {5, 3});
      b.add("head", std::make_unique<linear>(3, 6), {"tokens"});
      return b.build(3);
    };
    auto whole = build(), split = build();
    direct_executor a(whole), b(split);
    cross_entropy ce;
    auto opt_a = make_optimizer<float>("sgd", 0.5, 0.0), opt_b = make_optimizer<float>("sgd", 0.5, 0.0);
    for (std::uint64_t step = 0; step < 2; ++step) {
      const auto x = random_tensor(4, {5, 3}, 30 + step).cast<float>();
      targets y;
      y.labels_per_sample = 5;
      for (int i = 0; i < 20; ++i) y.labels.push_back(std::int32_t((i * 7 + int(step)) % 6));
      const auto ra = a.train_step(x.clone(), y, ce, *opt_a, 1, step);
      const auto rb = b.train_step(x.clone(), y, ce, *opt_b, 2, step);
      CHECK(ra.samples == 4);
      CHECK(rb.loss == doctest::Approx(ra.loss).epsilon(1e-6));
    }
    auto pa = whole.parameters(), pb = split.parameters();
    for (std::size_t i = 0; i < pa.size(); ++i)
      for (std::int64_t j = 0; j < pa[i].value->size(); ++j)
        CHECK(pb[i].value->data()[j] == doctest::Approx(pa[i].value->data()[j]).epsilon(1e-6));
  }

  TEST_CASE("per-token cross-entropy refuses labels that do not fit, naming the sample and the token") {
    cross_entropy ce;
    const auto logits = random_tensor(2, {4, 5}, 3).cast<float>();
    targets y;
    y.labels = {0, 1, 2, 3, 4, 0, 1};
    y.labels_per_sample = 4;
    CHECK_THROWS_WITH_AS(ce.forward(logits, y),
                         "CrossEntropyLoss: 7 labels for a batch of 2 samples of 4 tokens (one per token: 8)",
                         std::invalid_argument);
    y.labels.push_back(5);
    CHECK_THROWS_WITH_AS(ce.forward(logits, y), "CrossEntropyLoss: label 5 of sample 1, token 3 is outside [0, 5)",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(ce.forward(random_tensor(2, {2, 3, 5}, 3).cast<float>(), y),
                         "CrossEntropyLoss: prediction must be [K] or [T, K] per sample, got [2, 2, 3, 5]",
                         std::invalid_argument);
  }
}

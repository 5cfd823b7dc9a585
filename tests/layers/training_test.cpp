// A small network learns a synthetic task: the whole stack (layers, executor, optimizer) works together.
#include <doctest/doctest.h>

#include <cmath>
#include <random>

#include "layers/activation.hpp"
#include "layers/executor.hpp"
#include "layers/linear.hpp"
#include "layers/presets.hpp"

using namespace nerve::layers;

namespace {

// Two interleaved spirals-lite: the label is the quadrant parity of (x, y) — XOR, not linearly separable.
void make_batch(std::mt19937_64& rng, std::int64_t n, tensor& x, targets& t) {
  x = tensor(n, {2});
  t.labels.resize(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const float a = float(double(rng() >> 11) * 0x1.0p-53 * 2 - 1), b = float(double(rng() >> 11) * 0x1.0p-53 * 2 - 1);
    x.row(i)[0] = a;
    x.row(i)[1] = b;
    t.labels[static_cast<std::size_t>(i)] = (a > 0) != (b > 0);
  }
}

double train_xor(basic_optimizer<float>& opt, int steps) {
  graph_builder b;
  b.input("input", {2});
  b.add("fc1", linear(2, 32), {"input"});
  b.add("act1", tanh_layer(), {"fc1"});
  b.add("fc2", linear(32, 2), {"act1"});
  auto g = b.build(1);
  direct_executor ex(g);
  cross_entropy ce;
  std::mt19937_64 rng(2);
  for (int s = 0; s < steps; ++s) {
    tensor x;
    targets t;
    make_batch(rng, 64, x, t);
    ex.train_step(std::move(x), t, ce, opt, 1, std::uint64_t(s));
  }
  tensor x;
  targets t;
  make_batch(rng, 1000, x, t);
  return double(ex.evaluate(std::move(x), t, ce).correct) / 1000.0;
}

}  // namespace

TEST_SUITE("layers.training") {
  TEST_CASE("a small MLP learns XOR with SGD and with Adam") {
    sgd s(sgd_options{0.5, 0.9});
    CHECK(train_xor(s, 600) > 0.95);
    adam a(adam_options{0.01});
    CHECK(train_xor(a, 600) > 0.95);
  }

  TEST_CASE("an untrained network is at chance on the same task") {
    sgd s(sgd_options{0.0});
    const double acc = train_xor(s, 1);
    CHECK(acc < 0.75);
  }

  TEST_CASE("lenet drives the loss on a fixed batch down") {
    auto g = make_preset("lenet", 3);
    direct_executor ex(g);
    cross_entropy ce;
    adam opt(adam_options{3e-3});
    std::mt19937_64 rng(4);
    tensor x(16, {1, 28, 28});
    for (std::int64_t i = 0; i < x.size(); ++i) x.data()[i] = float(double(rng() >> 11) * 0x1.0p-53);
    targets t;
    for (int i = 0; i < 16; ++i) t.labels.push_back(i % 10);
    const double first = ex.train_step(x.clone(), t, ce, opt).loss;
    double last = first;
    for (int s = 0; s < 60; ++s) last = ex.train_step(x.clone(), t, ce, opt).loss;
    CHECK(first == doctest::Approx(std::log(10.0)).epsilon(0.1));
    CHECK(last < 0.1 * first);  // it memorises the 16 samples
  }
}

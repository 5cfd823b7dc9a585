// A custom layer (SiLU, from an elementwise op) with a forward hook that watches it.
//
//   input ─► fc1 ─► silu1 ─► fc2 ─► loss
//                     └─ hook: mean and fraction of negative outputs, per micro-batch
//
// `basic_activation<Scalar, Op>` turns a struct with `kind`, `f(x)` and `f'(x)` into a
// layer (forward, backward, shape inference); a layer with parameters derives from
// `basic_layer` itself (docs/layers.md, "Adding a layer"). The graph runs as a network of
// layer actors on an event loop: the hook runs on silu1's loop, right after its forward.
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <string_view>

#include "actors/runtime.hpp"
#include "layers/activation.hpp"
#include "layers/linear.hpp"
#include "layers/loss.hpp"
#include "layers/network.hpp"
#include "layers/optimizer.hpp"

namespace nl = nerve::layers;

/// SiLU (swish): x·σ(x), and its derivative σ(x)·(1 + x·(1 − σ(x))).
struct silu_op {
  static constexpr std::string_view kind = "SiLU";
  template <class S> S f(S x) const { return x / (S(1) + std::exp(-x)); }
  template <class S> S df(S x) const {
    const S s = S(1) / (S(1) + std::exp(-x));
    return s * (S(1) + x * (S(1) - s));
  }
};
using silu = nl::basic_activation<float, silu_op>;

int main() {
  nl::graph_builder b;
  b.input("input", {16});
  b.add("fc1", nl::linear(16, 32), {"input"});
  b.add("silu1", silu(), {"fc1"});
  b.add("fc2", nl::linear(32, 3), {"silu1"});
  nl::graph g = b.build(/*seed=*/3);

  int calls = 0;
  g.register_forward_hook("silu1", [&](const nl::hook_context& ctx, nl::tensor& y) {
    double sum = 0;
    std::int64_t negative = 0;
    for (std::int64_t i = 0; i < y.size(); ++i) {
      sum += y.data()[i];
      negative += y.data()[i] < 0;
    }
    if (calls++ % 4 == 0)
      std::printf("  hook %.*s mb %llu: mean %.4f, %.0f%% negative\n", static_cast<int>(ctx.node.size()),
                  ctx.node.data(), static_cast<unsigned long long>(ctx.micro_batch), sum / y.size(),
                  100.0 * negative / y.size());
  });

  std::mt19937 rng(11);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  nl::tensor x(96, {16});
  nl::targets y;
  for (int i = 0; i < 96; ++i) {
    y.labels.push_back(i % 3);
    for (int j = 0; j < 16; ++j) x.row(i)[j] = noise(rng) + (j == i % 3 ? 2.5f : 0.0f);
  }

  nerve::actors::runtime rt({.loops = 1});
  nl::network net(rt, g, std::make_shared<nl::cross_entropy>(),
                  [] { return nl::make_optimizer<float>("sgd", 0.1, 0.9); });
  double first = 0, last = 0;
  for (std::uint64_t step = 0; step < 8; ++step) {
    auto r = net.train_step(x.clone(), y.clone(), /*micro_batches=*/2, step).get();
    std::printf("step %llu  loss %.4f\n", static_cast<unsigned long long>(step), r.loss);
    (step == 0 ? first : last) = r.loss;
  }
  const std::string kind(g.node("silu1").layer->kind());
  std::printf("silu1 (%s): hook ran %d times\n", kind.c_str(), calls);
  return calls == 8 * 2 && last < first ? 0 : 1;  // once per micro-batch; and it learned
}

// Layer actors wired with a skip connection, trained for a few steps on random data.
//
//   input ─► fc1 ─► relu1 ─┬─► fc2 ─► relu2 ─► fc3 ─► add1 ─► fc4 ─► loss
//                          └──────────────────────────┘   (skip connection)
//
// Every layer is an actor; `spread` puts them round-robin on the runtime's two loops,
// so forward and backward messages cross between threads. relu1 fans out (its two
// consumers' gradients are summed), add1 fans in (joined by micro-batch id).
#include <cstdio>
#include <memory>
#include <random>

#include "layers/activation.hpp"
#include "layers/join.hpp"
#include "layers/linear.hpp"
#include "layers/network.hpp"

namespace nl = nerve::layers;

int main() {
  nl::graph_builder b;
  b.input("input", {32});
  b.add("fc1", nl::linear(32, 64), {"input"});
  b.add("relu1", nl::relu(), {"fc1"});
  b.add("fc2", nl::linear(64, 64), {"relu1"});
  b.add("relu2", nl::relu(), {"fc2"});
  b.add("fc3", nl::linear(64, 64), {"relu2"});
  b.add("add1", nl::add(), {"fc3", "relu1"});
  b.add("fc4", nl::linear(64, 4), {"add1"});
  nl::graph g = b.build(/*seed=*/1);  // a wrong shape throws here, naming both layers

  // Random data with something to learn: class c lifts feature c.
  constexpr int batch = 128;
  std::mt19937 rng(7);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  nl::tensor x(batch, {32});
  nl::targets y;
  for (int i = 0; i < batch; ++i) {
    y.labels.push_back(i % 4);
    for (int j = 0; j < 32; ++j) x.row(i)[j] = noise(rng) + (j == i % 4 ? 3.0f : 0.0f);
  }

  nerve::actors::runtime rt({.loops = 2});
  nl::network_options placement;
  placement.spread = true;
  nl::network net(rt, g, std::make_shared<nl::cross_entropy>(),
                  [] { return std::make_unique<nl::sgd>(nl::sgd_options{.lr = 0.05, .momentum = 0.9}); },
                  placement);
  double first = 0, last = 0;
  for (std::uint64_t step = 0; step < 10; ++step) {
    // 4 micro-batches in flight through the actors; the future answers after the update.
    auto r = net.train_step(x.clone(), y.clone(), /*micro_batches=*/4, step).get();
    std::printf("step %2llu  loss %.4f  correct %lld/%lld\n", static_cast<unsigned long long>(step), r.loss,
                static_cast<long long>(r.correct), static_cast<long long>(r.samples));
    (step == 0 ? first : last) = r.loss;
  }
  const auto t = net.traffic();
  std::printf("bus: %llu forwards, %llu backwards\n", static_cast<unsigned long long>(t.forward),
              static_cast<unsigned long long>(t.backward));
  return last < first ? 0 : 1;  // training must have lowered the loss
}

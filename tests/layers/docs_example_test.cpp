// The example of docs/layers.md, compiled and run: keep the two in step.
#include <doctest/doctest.h>

// [docs-example]
#include "actors/runtime.hpp"
#include "layers/activation.hpp"
#include "layers/join.hpp"
#include "layers/linear.hpp"
#include "layers/loss.hpp"
#include "layers/network.hpp"
#include "layers/optimizer.hpp"

namespace nl = nerve::layers;

//   input ─► fc1 ─► relu1 ─┬─► fc2 ─► relu2 ─► fc3 ─► add1 ─► fc4 ─► logits
//                          └──────────────────────────┘   (skip connection)
nl::graph make_network(std::uint64_t seed) {
  nl::graph_builder b;
  b.input("input", {784});
  b.add("fc1", nl::linear(784, 128), {"input"});
  b.add("relu1", nl::relu(), {"fc1"});
  b.add("fc2", nl::linear(128, 128), {"relu1"});
  b.add("relu2", nl::relu(), {"fc2"});
  b.add("fc3", nl::linear(128, 128), {"relu2"});
  b.add("add1", nl::add(), {"fc3", "relu1"});  // fan-in; relu1 fans out
  b.add("fc4", nl::linear(128, 10), {"add1"});
  return b.build(seed);  // shapes checked, weights drawn (PyTorch's default init)
}

double train_a_little(nl::graph& g, const nl::tensor& images, const nl::targets& labels) {
  nerve::actors::runtime rt({.loops = 2});  // two event loops
  // One layer actor per node, spread over the loops: fc2..fc3 and the skip run at once.
  nl::network net(rt, g, std::make_shared<nl::cross_entropy>(),
                  [] { return nl::make_optimizer<float>("sgd", 0.1, 0.9); },  // one optimizer per layer
                  {.spread = true});
  double last = 0;
  for (std::uint64_t step = 0; step < 20; ++step) {
    // 4 micro-batches, gradients accumulated, one optimizer step; a future of its figures.
    auto r = net.train_step(images.clone(), labels.clone(), /*micro_batches=*/4, step).get();
    last = r.loss;
  }
  return last;
}
// [docs-example]

TEST_SUITE("layers.docs") {
  TEST_CASE("the docs example builds, names its parameters and trains") {
    auto g = make_network(1);
    CHECK(g.parameters()[0].name == "fc1.weight");
    nl::tensor images(32, {784});
    nl::targets labels;
    for (int i = 0; i < 32; ++i) {
      labels.labels.push_back(i % 10);
      for (int j = 0; j < 784; ++j) images.row(i)[j] = float((i * 7 + j * (i % 10 + 1)) % 97) / 97.0f;
    }
    CHECK(train_a_little(g, images, labels) < 1.0);
  }
}

#pragma once
// The small chain the pipeline suites cut into stages (CPU pipelines in
// tests/pipeline, device stages in tests/gpu).
#include <cstdint>
#include <random>
#include <string>

#include "layers/activation.hpp"
#include "layers/dropout.hpp"
#include "layers/graph.hpp"
#include "layers/linear.hpp"

namespace nerve::test {

/// input [12] → fc1 → relu1 → … → fc4 → relu4 [→ drop] → fc5 [4]: nine layers (ten with
/// the dropout, which has no device twin).
inline layers::graph small_chain(std::uint64_t seed = 7, bool with_dropout = false) {
  layers::graph_builder b;
  b.input("input", layers::shape{12});
  std::string prev = "input";
  for (int i = 1; i <= 4; ++i) {
    const std::string fc = "fc" + std::to_string(i), relu = "relu" + std::to_string(i);
    b.add(fc, layers::linear(i == 1 ? 12 : 16, 16), {prev});
    b.add(relu, layers::relu(), {fc});
    prev = relu;
  }
  if (with_dropout) {
    b.add("drop", layers::dropout(0.5), {prev});
    prev = "drop";
  }
  b.add("fc5", layers::linear(16, 4), {prev});
  return b.build(seed);
}

/// A batch of `n` normal samples for `g`'s input and random labels for its output, from `seed`.
struct batch {
  layers::tensor x;
  layers::targets t;
};
inline batch make_batch(const layers::graph& g, std::int64_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d;
  const auto& shape = g.nodes()[g.inputs()[0]].output_shape;
  batch b{layers::tensor(n, shape), {}};
  for (std::int64_t i = 0; i < b.x.size(); ++i) b.x.data()[i] = d(rng);
  const auto classes = g.nodes()[g.output()].output_shape.numel();
  for (std::int64_t i = 0; i < n; ++i) b.t.labels.push_back(std::int32_t(rng() % std::uint64_t(classes)));
  return b;
}

}  // namespace nerve::test

#pragma once
// A language model small enough for every suite (sanitizers included): the `gpt` preset's
// layout, one causal block of width 8, and its head tied to the token embedding. What the
// tied-weight tests train directly, through a network and cut into pipeline stages.
#include <cstdint>
#include <random>
#include <string>

#include "layers/activation.hpp"
#include "layers/attention.hpp"
#include "layers/embedding.hpp"
#include "layers/graph.hpp"
#include "layers/join.hpp"
#include "layers/linear.hpp"
#include "layers/loss.hpp"
#include "layers/norm.hpp"

namespace nerve::test {

inline constexpr std::int64_t tiny_lm_vocab = 11, tiny_lm_context = 6;

/// input [6] token ids → wte (11×8) → wpe → blocks.0 (ln1, causal attention of 2 heads,
/// add1, ln2, mlp.fc 8→16, GELU, mlp.proj 16→8, add2) → ln_f → head 8→11 without bias,
/// tied to wte (`tie` false: the head has a weight of its own, started from wte's).
inline layers::graph tiny_lm(std::uint64_t seed = 5, bool tie = true) {
  constexpr std::int64_t width = 8;
  layers::graph_builder b;
  b.input("input", layers::shape{tiny_lm_context});
  b.add("wte", layers::embedding(tiny_lm_vocab, width, 0.02), {"input"});
  b.add("wpe", layers::positional_embedding(tiny_lm_context, width), {"wte"});
  b.add("blocks.0.ln1", layers::layer_norm(layers::shape{width}), {"wpe"});
  b.add("blocks.0.attn", layers::multihead_attention(width, 2, true), {"blocks.0.ln1"});
  b.add("blocks.0.add1", layers::add(), {"wpe", "blocks.0.attn"});
  b.add("blocks.0.ln2", layers::layer_norm(layers::shape{width}), {"blocks.0.add1"});
  b.add("blocks.0.mlp.fc", layers::linear(width, 2 * width), {"blocks.0.ln2"});
  b.add("blocks.0.mlp.act", layers::gelu(), {"blocks.0.mlp.fc"});
  b.add("blocks.0.mlp.proj", layers::linear(2 * width, width), {"blocks.0.mlp.act"});
  b.add("blocks.0.add2", layers::add(), {"blocks.0.add1", "blocks.0.mlp.proj"});
  b.add("ln_f", layers::layer_norm(layers::shape{width}), {"blocks.0.add2"});
  b.add("head", layers::linear(width, tiny_lm_vocab, false), {"ln_f"});
  if (tie) b.tie("head", "wte");
  auto g = b.build(seed);
  if (!tie) {  // the same start as the tied model's: the head begins as the embedding
    auto& from = g.layer<layers::embedding>("wte").weight();
    auto& to = g.layer<layers::linear>("head").weight();
    std::copy(from.data(), from.data() + from.size(), to.data());
  }
  return g;
}

/// `n` windows of random token ids and, per token, a random next token, from `seed`.
struct token_batch {
  layers::tensor x;
  layers::targets t;
};
inline token_batch tiny_lm_batch(std::int64_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  token_batch b{layers::tensor(n, layers::shape{tiny_lm_context}), {}};
  for (std::int64_t i = 0; i < b.x.size(); ++i) b.x.data()[i] = float(rng() % std::uint64_t(tiny_lm_vocab));
  for (std::int64_t i = 0; i < n * tiny_lm_context; ++i)
    b.t.labels.push_back(std::int32_t(rng() % std::uint64_t(tiny_lm_vocab)));
  b.t.labels_per_sample = tiny_lm_context;
  return b;
}

}  // namespace nerve::test

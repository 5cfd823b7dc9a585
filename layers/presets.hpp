#pragma once
/// \file
/// The preset networks: `mlp`, `deep-mlp`, `lenet`, `resmlp`, named as a PyTorch user would.

#include <cstdint>
#include <optional>
#include <string_view>

#include "layers/graph.hpp"

namespace nerve::layers {

/// What a preset is built for: samples of `input` (none: the preset's own, [784] or
/// [1, 28, 28]) in `classes` classes (the head's outputs). The MLPs take samples of any
/// shape, flattened: their input is `[input.numel()]`; `lenet` takes [1, 28, 28] only.
struct preset_shape {
  std::optional<shape> input;
  std::int64_t classes = 10;
};

/// A builder holding preset `name` for `data`, with one graph input called `"input"`
/// (the sizes below are Fashion-MNIST's, the default; 784 and 10 are `data`'s otherwise):
///
/// - `mlp`: [784] → fc1 784→256 → relu1 → fc2 256→10.
/// - `deep-mlp`: [784] → fc1 784→1024 → relu1 → fc2, fc3, fc4 1024→1024 (each
///   followed by relu2…relu4) → fc5 1024→10.
/// - `lenet`: [1, 28, 28] → conv1 6@5×5 pad 2 → relu1 → pool1 (max 2) → conv2
///   16@5×5 → relu2 → pool2 (max 2) → flatten → fc1 400→120 → relu3 → fc2 120→84
///   → relu4 → fc3 84→10.
/// - `resmlp`: [784] → fc1 784→256 → relu1, then two residual blocks
///   (fc 256→256 → relu → fc 256→256 → add with the block input → relu), then
///   a head 256→10: fc2…fc5 in the blocks, fc6 the head; add1, add2 the joins.
/// - `vit`: [1, 28, 28] → 7×7 patches (`patch`), class token (`cls`), positions (`pos`),
///   4 pre-LayerNorm blocks (`blocks.{i}.ln1, attn, add1, ln2, mlp.fc, mlp.act,
///   mlp.proj, add2`) of width 64, 4 heads and an MLP ×2, `ln_f`, the class token
///   (`select`) into `head` 64→10.
/// - `gpt`: [T] token ids (T = `gpt_context` unless the data's samples say otherwise) →
///   `wte` (the embedding, vocab = `data.classes` rows) → `wpe` (learned positions) → 4
///   blocks as `vit`'s but causal, width 128, 4 heads and an MLP ×4 → `ln_f` → `head`
///   128→vocab without bias, its weight tied to `wte`'s (`graph_builder::tie`): [T, vocab]
///   logits, a token's each.
///
/// Parameterised layers are `fc1`, `fc2`, … and `conv1`, `conv2`, … in order,
/// so parameters are `fc1.weight`, `fc1.bias` as in PyTorch. Throws
/// `std::invalid_argument` for an unknown name, fewer than 2 classes, or samples the preset
/// cannot take (naming both shapes).
template <class Scalar>
basic_graph_builder<Scalar> preset_builder(std::string_view name, const preset_shape& data = {});

/// Tokens per window of the `gpt` preset: its context.
inline constexpr std::int64_t gpt_context = 64;

/// Whether preset `model` reads text (the `fortunes` corpus, layers/data/text.hpp) rather
/// than images: `gpt`.
inline bool reads_text(std::string_view model) noexcept { return model == "gpt"; }

/// `preset_builder(name, data).build(seed)`.
template <class Scalar = float>
basic_graph<Scalar> make_preset(std::string_view name, std::uint64_t seed = 0, const preset_shape& data = {}) {
  return preset_builder<Scalar>(name, data).build(seed);
}

/// Whether `g` is preset `name` (built for `g`'s input shape and outputs) as far as a
/// message can tell: the same nodes, in order,
/// with the same names, output shapes and parameter counts (the weights aside). False
/// for a name that is no preset. What `train` asks before it names a model in an error:
/// `train_options::model` keeps its default (`mlp`) under a user's own graph.
bool is_preset(const basic_graph<float>& g, std::string_view name);

}  // namespace nerve::layers

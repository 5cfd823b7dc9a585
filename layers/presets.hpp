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
///
/// Parameterised layers are `fc1`, `fc2`, … and `conv1`, `conv2`, … in order,
/// so parameters are `fc1.weight`, `fc1.bias` as in PyTorch. Throws
/// `std::invalid_argument` for an unknown name, fewer than 2 classes, or samples the preset
/// cannot take (naming both shapes).
template <class Scalar>
basic_graph_builder<Scalar> preset_builder(std::string_view name, const preset_shape& data = {});

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

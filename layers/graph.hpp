#pragma once
/// \file
/// `basic_graph`: a validated network of named layers (a DAG), and `basic_graph_builder` that makes one.
///
/// ```
///   input ──► fc1 ──► relu1 ──► fc2 ──► relu2 ──► fc3 ──► add1 ──► fc4
///                          └──────────────────────────────┘   (skip connection)
/// ```
/// The graph is plain data: nodes in insertion order, each with its layer
/// object, its producers (inputs), its consumers and its output shape, plus a
/// topological order. The direct executor (executor.hpp) runs it in that order;
/// an actor executor can spawn one actor per node from the same description.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "layers/layer.hpp"

namespace nerve::layers {

/// A wiring or configuration error found while building a graph: a shape
/// mismatch (naming both layers and both shapes), a cycle, an unknown name, an
/// unconnected input or output, a duplicate name.
class wiring_error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// What a hook is told about the call it observes.
struct hook_context {
  /// The node's name (`"fc1"`).
  std::string_view node;
  /// The micro-batch the call belongs to (0…M−1 within a step).
  std::uint64_t micro_batch = 0;
  /// The optimizer step the micro-batch belongs to (`train_step`'s `step`; 0 in
  /// evaluation, which belongs to no step).
  std::uint64_t step = 0;
  /// True when the call is part of training (a forward whose backward follows, and
  /// every backward); false in evaluation (`predict`, `evaluate`), where only forward
  /// hooks run.
  bool training = true;
};

/// Runs after a node's forward, in training and in evaluation (`ctx.training` says
/// which); may change (or replace) the output in place.
///
/// Thread: the one that runs the node's layer. Under `network`, the loop thread of
/// the node's `layer_actor` (nodes on different loops run their hooks at the same
/// time, so a hook shared by several nodes must synchronise what it shares); under
/// `direct_executor`, the caller's thread. A hook that throws fails the call (under
/// `network`: the run, see docs/layers.md "Failures").
template <class Scalar>
using basic_forward_hook = std::function<void(const hook_context&, basic_tensor<Scalar>& output)>;
/// Runs after a node's backward (B) with the gradients for its inputs (empty
/// where not computed, e.g. for a graph input) and the gradient that arrived at
/// its output; may change the input gradients in place, as PyTorch's
/// `register_full_backward_hook`. Runs in training only; on the same thread as
/// the node's forward hooks (see `basic_forward_hook`).
template <class Scalar>
using basic_backward_hook = std::function<void(const hook_context&, std::vector<basic_tensor<Scalar>>& grad_inputs,
                                               const basic_tensor<Scalar>& grad_output)>;

/// One node of a graph: a graph input (no layer) or a layer with its producers.
template <class Scalar>
struct basic_node {
  std::string name;
  /// Null for a graph input.
  std::unique_ptr<basic_layer<Scalar>> layer;
  /// Producer node indices, in the layer's input order.
  std::vector<std::size_t> inputs;
  /// Consumer node indices, once per edge (a node feeding both inputs of an Add appears twice).
  std::vector<std::size_t> consumers;
  /// The sample shape this node outputs.
  shape output_shape;
  std::vector<basic_forward_hook<Scalar>> forward_hooks;
  std::vector<basic_backward_hook<Scalar>> backward_hooks;

  bool is_input() const noexcept { return layer == nullptr; }
};

/// A built, validated network. Owns its layers. Moveable, not copyable.
///
/// Thread safety: none; the graph and its layers are used by one thread at a
/// time (or, under an actor executor, each node's layer by its own actor only).
template <class Scalar>
class basic_graph {
 public:
  using node_type = basic_node<Scalar>;
  using tensor_type = basic_tensor<Scalar>;
  using parameter_ref = basic_parameter_ref<Scalar>;
  using buffer_ref = basic_buffer_ref<Scalar>;

  basic_graph(basic_graph&&) noexcept = default;
  basic_graph& operator=(basic_graph&&) noexcept = default;

  /// Every node, in the order they were added.
  const std::vector<node_type>& nodes() const noexcept { return nodes_; }
  std::vector<node_type>& nodes() noexcept { return nodes_; }
  /// The node called `name`; throws `wiring_error` when there is none.
  node_type& node(std::string_view name) { return nodes_[index_of(name)]; }
  const node_type& node(std::string_view name) const { return nodes_[index_of(name)]; }
  std::size_t index_of(std::string_view name) const;
  /// The layer of node `name` cast to `L`; throws when it is not an `L`.
  template <class L>
  L& layer(std::string_view name) {
    auto* l = dynamic_cast<L*>(node(name).layer.get());
    if (!l) throw std::invalid_argument("graph: node '" + std::string(name) + "' is not of the requested layer type");
    return *l;
  }

  /// Node indices in a topological order (producers before consumers; ties by insertion).
  const std::vector<std::size_t>& order() const noexcept { return order_; }
  /// The graph inputs, in the order they were declared (forward takes tensors in this order).
  const std::vector<std::size_t>& inputs() const noexcept { return inputs_; }
  /// The node whose output is the graph's output.
  std::size_t output() const noexcept { return output_; }

  /// Every trainable tensor, named node.parameter (`fc1.weight`), in node order. A tied
  /// weight is listed once, under its owner's name: see `ties`.
  std::vector<parameter_ref> parameters();
  /// Every buffer, named `<node>.<buffer>` (`bn1.running_mean`).
  std::vector<buffer_ref> buffers();
  /// Total trainable scalars (a tied weight counted once).
  std::int64_t parameter_count();

  /// Node `copy` holds a copy of node `owner`'s parameters, the same names and shapes (a
  /// language model's head and its token embedding: one weight, PyTorch's
  /// `head.weight = wte.weight`). Each node runs with its own copy (on its own stage, say),
  /// and the two are summed before every update, each copy's gradient into the owner's
  /// (`sum_tied_gradients`; a runtime all-reduces them as it does replicas'), so both make
  /// the same update and stay equal. Weights files hold the owner's tensor alone.
  struct tie {
    std::size_t copy = 0, owner = 0;
  };
  const std::vector<tie>& ties() const noexcept { return ties_; }
  /// Whether node `i` is a tied copy (its parameters are another node's).
  bool is_tied_copy(std::size_t i) const noexcept;
  /// Sets every copy's parameters to its owner's (after weights were loaded into the owners).
  void copy_tied();
  /// Adds every copy's gradients into its owner's: what one update of the shared weight
  /// takes (`copy_tied` after the update brings the copies along).
  void sum_tied_gradients();
  /// Zeroes every gradient.
  void zero_grad();
  /// Training or evaluation mode for every layer.
  void set_training(bool training);

  /// Adds a forward hook to node `name` (see `basic_forward_hook`).
  void register_forward_hook(std::string_view name, basic_forward_hook<Scalar> hook);
  /// Adds a backward hook to node `name` (see `basic_backward_hook`).
  void register_backward_hook(std::string_view name, basic_backward_hook<Scalar> hook);
  /// Removes every hook of every node.
  void clear_hooks();

  /// One line per node: name, kind, inputs, output shape, parameter count.
  std::string summary();

 private:
  template <class>
  friend class basic_graph_builder;
  basic_graph() = default;

  std::vector<node_type> nodes_;
  std::map<std::string, std::size_t, std::less<>> by_name_;
  std::vector<std::size_t> order_;
  std::vector<std::size_t> inputs_;
  std::size_t output_ = 0;
  std::vector<tie> ties_;
};

/// Builds a `basic_graph`: declare inputs, add named layers with the names of
/// their producers, say which node is the output, then `build()`.
///
/// Nodes may be added in any order (a producer can be named before it is
/// added); everything is checked in `build()`, which throws `wiring_error`
/// before any data flows. Not thread-safe.
template <class Scalar>
class basic_graph_builder {
 public:
  using layer_type = basic_layer<Scalar>;

  /// Declares a graph input called `name` whose samples have `sample_shape`.
  basic_graph_builder& input(std::string name, shape sample_shape);
  /// Adds node `name` running `layer` on the outputs of `inputs` (in order).
  basic_graph_builder& add(std::string name, std::unique_ptr<layer_type> layer_object, std::vector<std::string> inputs);
  /// Adds a layer given by value: `b.add("fc1", linear(784, 256), {"input"})`, or a
  /// named one moved in: `b.add("fc1", std::move(fc1), {"input"})`. Layers cannot be
  /// copied (the graph owns its layer), so a named layer passed as it is (an lvalue)
  /// stops the build at a `static_assert` that says so, instead of at the deleted copy
  /// constructor deep inside this function.
  template <class L>
    requires std::is_base_of_v<layer_type, std::remove_cvref_t<L>>
  basic_graph_builder& add(std::string name, L&& layer_object, std::vector<std::string> inputs) {
    if constexpr (std::is_reference_v<L> || std::is_const_v<L>) {
      static_assert(std::is_reference_v<L> && !std::is_reference_v<L>,
                    "graph_builder::add takes a layer by value: write b.add(\"fc1\", linear(784, 256), {...}) "
                    "or move a named layer in with b.add(\"fc1\", std::move(layer), {...})");
      return *this;
    } else {
      return add(std::move(name), std::unique_ptr<layer_type>(new L(std::move(layer_object))), std::move(inputs));
    }
  }
  /// Names the output node. Optional when exactly one node has no consumer.
  basic_graph_builder& output(std::string name);
  /// Ties node `copy`'s parameters to node `owner`'s (`basic_graph::tie`): `build` checks
  /// that both have parameters of the same names and shapes, and starts the copy from the
  /// owner's initial values. A node is tied as a copy at most once, and an owner is no copy.
  basic_graph_builder& tie(std::string copy, std::string owner);

  /// Validates and builds. Shapes are inferred from the inputs along the
  /// topological order; every parameterised layer is then initialised with
  /// PyTorch's default scheme from one `std::mt19937_64(seed)` stream, in
  /// insertion order. Throws `wiring_error` on any problem. The builder is empty afterwards.
  basic_graph<Scalar> build(std::uint64_t seed = 0);

 private:
  struct pending {
    std::string name;
    std::unique_ptr<layer_type> layer;
    std::vector<std::string> inputs;
    shape input_shape;  // graph inputs only
  };
  std::vector<pending> pending_;
  std::string output_;
  std::vector<std::pair<std::string, std::string>> ties_;  // (copy, owner)
};

using node = basic_node<float>;
using graph = basic_graph<float>;
using graph_builder = basic_graph_builder<float>;
using forward_hook = basic_forward_hook<float>;
using backward_hook = basic_backward_hook<float>;

}  // namespace nerve::layers

#pragma once
/// \file
/// `basic_layer`: the math of one layer (forward, split backward, parameters), no runtime.

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "layers/shape.hpp"
#include "layers/tensor.hpp"

namespace nerve::layers {

template <class Scalar>
class basic_op_layer;

/// Thrown when a layer cannot take the shapes it is given. `input()` says which
/// input, `expected()` what the layer wanted there; `what()` names the layer and
/// the shapes. The graph builder rethrows it as a `wiring_error` naming both layers.
class shape_error : public std::invalid_argument {
 public:
  shape_error(std::string message, std::size_t input, std::string expected)
      : std::invalid_argument(std::move(message)), input_(input), expected_(std::move(expected)) {}
  std::size_t input() const noexcept { return input_; }
  const std::string& expected() const noexcept { return expected_; }

 private:
  std::size_t input_;
  std::string expected_;
};

/// What a forward call needs to know besides its inputs.
struct forward_context {
  /// The micro-batch this call belongs to; the runtime keys stashes by it.
  std::uint64_t micro_batch = 0;
  /// The optimizer step the micro-batch belongs to. Dropout draws its mask from
  /// (layer seed, step, micro_batch), so a replay gives the same mask.
  std::uint64_t step = 0;
};

/// What `forward` leaves for `backward` of one micro-batch: the tensors and
/// indices the layer chose to keep. Owned by the caller between the two calls,
/// so any number of micro-batches can be in flight through one layer.
template <class Scalar>
struct basic_stash {
  std::vector<basic_tensor<Scalar>> tensors;
  /// Integer side data, e.g. max-pool arg-max positions.
  std::vector<std::int32_t> indices;
  /// The sample shapes of the inputs, for the gradients' shapes.
  std::vector<layers::shape> input_shapes;
  /// The batch size of the forward call.
  std::int64_t batch = 0;
  /// What a layer keeps in a form of its own (an op layer's tape), and its bytes.
  std::shared_ptr<void> extra;
  std::size_t extra_bytes = 0;
  /// Scalar payload held (memory accounting per micro-batch slot).
  std::size_t payload_bytes() const noexcept {
    std::size_t b = indices.size() * sizeof(std::int32_t) + extra_bytes;
    for (const auto& t : tensors) b += t.payload_bytes();
    return b;
  }
};

/// A trainable tensor of a layer and its gradient, under its PyTorch name.
template <class Scalar>
struct basic_parameter_ref {
  /// `"weight"` on the layer; `"fc1.weight"` when listed by a graph.
  std::string name;
  basic_tensor<Scalar>* value;
  basic_tensor<Scalar>* grad;
  /// PyTorch's shape for the tensor (`[out, in]`, `[out]`, `[out, in, kh, kw]`).
  std::vector<std::int64_t> torch_shape;
};

/// A non-trainable state tensor (BatchNorm running statistics), under its PyTorch name.
template <class Scalar>
struct basic_buffer_ref {
  std::string name;
  basic_tensor<Scalar>* value;
  std::vector<std::int64_t> torch_shape;
};

/// Which inputs want a gradient: bit `i` for input `i`.
using input_mask = std::uint64_t;
/// Every input wants a gradient.
inline constexpr input_mask all_inputs = ~input_mask{0};

/// The math of one layer, separate from any actor.
///
/// Calls: `forward` returns the output and a stash; `backward_input` (B) turns
/// the output gradient into input gradients; `backward_weight` (W) accumulates
/// parameter gradients; `backward` does both and consumes the stash. B and W may
/// run at different times (zero-bubble schedules) as long as the stash lives.
/// Parameter gradients accumulate over calls until `zero_grad()`.
///
/// Thread safety: none inside; call from one thread at a time (the owning actor's
/// loop). The layer holds no per-micro-batch state, so several micro-batches may
/// be between forward and backward at once.
template <class Scalar>
class basic_layer {
 public:
  using scalar_type = Scalar;
  using tensor_type = basic_tensor<Scalar>;
  using stash_type = basic_stash<Scalar>;
  using parameter_ref = basic_parameter_ref<Scalar>;
  using buffer_ref = basic_buffer_ref<Scalar>;

  /// The output of one forward call and what its backward needs.
  struct forward_result {
    tensor_type output;
    stash_type stash;
  };

  basic_layer() = default;
  basic_layer(const basic_layer&) = delete;
  basic_layer& operator=(const basic_layer&) = delete;
  virtual ~basic_layer() = default;

  /// The PyTorch-like class name: `"Linear"`, `"Conv2d"`, …
  virtual std::string_view kind() const noexcept = 0;
  /// The layer's name in its graph (`"fc1"`); empty until named.
  const std::string& name() const noexcept { return name_; }
  void set_name(std::string name) { name_ = std::move(name); }
  /// `fc1 (Linear)`, or `Linear` when unnamed: how errors refer to the layer.
  std::string label() const { return name_.empty() ? std::string(kind()) : name_ + " (" + std::string(kind()) + ")"; }

  /// Fewest and most inputs the layer takes (1 and 1 for most).
  virtual std::size_t min_inputs() const noexcept { return 1; }
  virtual std::size_t max_inputs() const noexcept { return 1; }

  /// The output sample shape for these input sample shapes. Throws `shape_error`
  /// (naming this layer, the input and both shapes) when it cannot take them.
  shape output_shape(std::span<const shape> inputs) const {
    if (inputs.size() < min_inputs() || inputs.size() > max_inputs())
      throw shape_error(label() + ": takes " + arity_text() + ", got " + std::to_string(inputs.size()),
                        inputs.size(), arity_text());
    return infer_shape(inputs);
  }

  /// Forward one micro-batch. Takes its inputs by value (moved in) so the layer
  /// can keep them in the stash without a copy. Checks the input shapes.
  forward_result forward(std::vector<tensor_type> inputs, const forward_context& context = {}) {
    std::vector<shape> shapes;
    shapes.reserve(inputs.size());
    for (const auto& t : inputs) shapes.push_back(t.sample_shape());
    (void)output_shape(shapes);
    for (std::size_t i = 1; i < inputs.size(); ++i)
      if (inputs[i].batch() != inputs[0].batch())
        throw std::invalid_argument(label() + ": input " + std::to_string(i) + " has batch " +
                                    std::to_string(inputs[i].batch()) + ", input 0 has " +
                                    std::to_string(inputs[0].batch()));
    const std::int64_t batch = inputs.empty() ? 0 : inputs[0].batch();
    forward_result r = do_forward(inputs, context);
    r.stash.input_shapes = std::move(shapes);
    r.stash.batch = batch;
    return r;
  }
  /// Forward a single input.
  forward_result forward(tensor_type input, const forward_context& context = {}) {
    std::vector<tensor_type> v;
    v.push_back(std::move(input));
    return forward(std::move(v), context);
  }

  /// B: the gradients with respect to the inputs selected by `wanted` (others
  /// come back empty). Does not touch parameter gradients.
  std::vector<tensor_type> backward_input(const stash_type& saved, const tensor_type& grad_output,
                                          input_mask wanted = all_inputs) {
    check_grad(saved, grad_output);
    return do_backward_input(saved, grad_output, wanted);
  }
  /// W: adds this micro-batch's parameter gradients to `gradients()`.
  void backward_weight(const stash_type& saved, const tensor_type& grad_output) {
    check_grad(saved, grad_output);
    do_backward_weight(saved, grad_output);
  }
  /// B then W, consuming the stash.
  std::vector<tensor_type> backward(stash_type saved, const tensor_type& grad_output, input_mask wanted = all_inputs) {
    auto g = backward_input(saved, grad_output, wanted);
    if (has_parameters()) do_backward_weight(saved, grad_output);
    return g;
  }

  /// The trainable tensors with their gradients, PyTorch names and shapes.
  virtual std::vector<parameter_ref> parameters() { return {}; }
  /// Non-trainable state (BatchNorm running statistics).
  virtual std::vector<buffer_ref> buffers() { return {}; }
  /// True when the layer has trainable tensors (W has work to do).
  bool has_parameters() { return !parameters().empty(); }
  /// Sets every parameter gradient to zero.
  void zero_grad() {
    for (auto& p : parameters()) p.grad->set_zero();
  }
  /// Draws fresh parameters (PyTorch's default scheme for the layer) from `rng`.
  virtual void reset_parameters(std::mt19937_64& /*rng*/) {}

  /// The layer as one written with ops (layers/ops.hpp), which every backend runs; null
  /// for a layer written for the CPU alone.
  virtual basic_op_layer<Scalar>* as_op_layer() noexcept { return nullptr; }

  /// Training (default) or evaluation mode: Dropout and BatchNorm differ.
  void set_training(bool training) noexcept { training_ = training; }
  bool training() const noexcept { return training_; }

 protected:
  // Layers move into a graph builder by value (`b.add("fc1", linear(784, 256), …)`).
  basic_layer(basic_layer&&) = default;
  basic_layer& operator=(basic_layer&&) = default;

  /// Shape inference after the input count is checked.
  virtual shape infer_shape(std::span<const shape> inputs) const = 0;
  virtual forward_result do_forward(std::vector<tensor_type>& inputs, const forward_context& context) = 0;
  virtual std::vector<tensor_type> do_backward_input(const stash_type& saved, const tensor_type& grad_output,
                                                     input_mask wanted) = 0;
  virtual void do_backward_weight(const stash_type& /*saved*/, const tensor_type& /*grad_output*/) {}

  /// `output`, with the tensors its backward needs (moved in) as the stash's `tensors`.
  template <class... Kept>
  static forward_result with_stash(tensor_type output, Kept... kept) {
    forward_result r{std::move(output), {}};
    (r.stash.tensors.push_back(std::move(kept)), ...);
    return r;
  }

  /// A `shape_error` for input `i`: "<label>: input i has <got>, expected <want>".
  shape_error mismatch(std::size_t i, const shape& got, const std::string& want) const {
    return shape_error(label() + ": input " + std::to_string(i) + " has shape " + got.to_string() + ", expected " +
                           want,
                       i, want);
  }

 private:
  std::string arity_text() const {
    if (min_inputs() == max_inputs()) return std::to_string(min_inputs()) + (min_inputs() == 1 ? " input" : " inputs");
    return "at least " + std::to_string(min_inputs()) + " inputs";
  }
  void check_grad(const stash_type& saved, const tensor_type& grad_output) const {
    if (grad_output.batch() != saved.batch)
      throw std::invalid_argument(label() + ": output gradient has batch " + std::to_string(grad_output.batch()) +
                                  " but the stashed forward had " + std::to_string(saved.batch));
  }

  std::string name_;
  bool training_ = true;
};

using layer = basic_layer<float>;
using parameter_ref = basic_parameter_ref<float>;

}  // namespace nerve::layers

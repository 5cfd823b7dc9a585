#pragma once
/// \file
/// The messages that flow between layer actors: activations forward, gradients backward,
/// and the reports the coordinator collects.

#include <cstdint>
#include <memory>
#include <string_view>

#include "layers/backend.hpp"
#include "layers/loss.hpp"
#include "layers/optimizer.hpp"
#include "layers/tensor.hpp"

namespace nerve::layers {

/// Activations of one micro-batch into input `port` of a layer actor: what a node's
/// output signal carries (the bus stamps `port` with the subscribing edge's input port).
/// `x` is a host tensor, or a device value that stays on the device (layers/backend.hpp).
struct forward_msg {
  static constexpr std::string_view kind = "forward";
  std::int64_t micro_batch = 0;
  std::uint64_t step = 0;
  std::uint32_t port = 0;
  std::uint32_t micro_batches = 1;  ///< in this step: a node steps its optimizer after that many backwards
  bool train = true;                ///< false: evaluation, no stash, no backward
  double lr = -1;                   ///< the step's learning rate (negative: unchanged)
  value x;
  std::size_t payload_bytes() const noexcept { return x.payload_bytes(); }
  /// A copy for one more consumer of the same output (fan-out).
  forward_msg clone() const { return {micro_batch, step, port, micro_batches, train, lr, x.clone()}; }
};

/// The gradient of the loss with respect to one consumer edge of a node's output: what a
/// consumer's input gradient signal carries back to the producer.
struct backward_msg {
  static constexpr std::string_view kind = "backward";
  std::int64_t micro_batch = 0;
  std::uint64_t step = 0;
  std::uint32_t port = 0;  ///< which consumer edge of the receiving node it came back along (bus-stamped)
  value grad;
  std::size_t payload_bytes() const noexcept { return grad.payload_bytes(); }
  backward_msg clone() const { return {micro_batch, step, port, grad.clone()}; }
};

/// A layer actor finished every backward of step `step` and applied its optimizer.
struct node_done {
  static constexpr std::string_view kind = "node_done";
  std::uint64_t step = 0;
  std::uint32_t node = 0;
};

/// A request to an actor that owns an optimizer (a layer actor, a pipeline stage), between
/// steps: its optimizer's state, for a checkpoint.
struct get_optimizer_state {
  static constexpr std::string_view kind = "get_optimizer_state";
};
/// A request to the same, between steps: replace the optimizer's state; answered with true.
struct set_optimizer_state {
  static constexpr std::string_view kind = "set_optimizer_state";
  optimizer_state state;
};

}  // namespace nerve::layers

#pragma once
/// \file
/// `layer_actor`: runs one graph node's layer as an actor.
///
/// On `forward` it joins the inputs of a micro-batch (fan-in by micro-batch id), runs the
/// layer, stashes what backward needs under the micro-batch id and sends the output to
/// every consumer (a clone to all but the last, which gets it moved). On `backward` it
/// waits for the gradient from every consumer edge (fan-out), sums them in the same order
/// as the direct executor, computes the input gradients (B) and sends them upstream, then
/// accumulates the weight gradients (W) in micro-batch order, so the sums are the same
/// bits as sequential training. After the step's last backward it applies its optimizer,
/// zeroes its gradients and reports `node_done` to the coordinator.

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "actors/actor.hpp"
#include "layers/graph.hpp"
#include "layers/messages.hpp"
#include "layers/optimizer.hpp"

namespace nerve::layers {

using graph = basic_graph<float>;
using stash = basic_stash<float>;

class layer_actor : public actors::actor {
 public:
  /// Where a node's outputs and gradients go.
  struct wiring {
    std::vector<actors::address> consumers;      ///< one per consumer edge
    std::vector<std::uint32_t> consumer_ports;   ///< the input port at that consumer
    std::vector<actors::address> producers;      ///< one per input port; empty for a graph input
    std::vector<std::uint32_t> producer_edges;   ///< which consumer edge of the producer this input is
    std::vector<std::uint32_t> grad_order;       ///< consumer edges in the order their gradients are summed
    actors::address coordinator;
  };

  /// `node` (of a graph that outlives the actor) is used by this actor only.
  layer_actor(graph::node_type& node, std::uint32_t index, std::unique_ptr<optimizer> opt);

  /// Wiring, before messages flow.
  void wire(wiring w) { w_ = std::move(w); }

  /// Micro-batches stashed now, the most at once, and the most stash bytes (memory bound).
  std::size_t stashed() const noexcept { return mbs_.size(); }
  std::size_t peak_stashed() const noexcept { return peak_stashed_; }
  std::size_t peak_stash_bytes() const noexcept { return peak_bytes_; }

 private:
  struct micro_batch_state {
    std::vector<tensor> inputs;
    std::uint32_t inputs_got = 0;
    stash st;
    bool forwarded = false;
    std::vector<tensor> grads;
    std::uint32_t grads_got = 0;
  };
  void on_forward(forward_msg& m);
  void on_backward(backward_msg& m);
  void finish_weight_grads();

  graph::node_type& node_;
  std::uint32_t index_;
  std::unique_ptr<optimizer> opt_;
  wiring w_;
  std::map<std::int64_t, micro_batch_state> mbs_;
  // W in micro-batch order: backwards that arrived early wait here with their stash.
  struct pending_weight {
    stash st;
    tensor grad;
  };
  std::map<std::int64_t, pending_weight> pending_w_;
  std::int64_t next_w_ = 0;
  std::uint64_t step_ = 0;
  std::uint32_t step_micro_batches_ = 0;
  std::uint32_t backwards_done_ = 0;
  std::size_t peak_stashed_ = 0, peak_bytes_ = 0, bytes_ = 0;
};

}  // namespace nerve::layers

#pragma once
/// \file
/// `layer_actor`: runs one graph node's layer as an actor, its edges bus signals.
///
/// ```
///   producer.out ──forward (port k)──► on_forward ── layer.forward ──► out ──► consumers
///   producer ◄── grad[k] ◄── on_backward ◄── backward (port e) ◄── each consumer edge e
/// ```
/// The node's output is a `bus::signal<forward_msg>` (`out`) that every consumer edge
/// subscribes to, on its input port; input k's gradient goes back on
/// `grad[k]`, which the producer subscribes to on the edge's index among its edges.
/// On `forward` the actor joins the inputs of a micro-batch (fan-in by micro-batch id),
/// runs the layer, stashes what backward needs under the micro-batch id and emits the
/// output (the bus clones it for all consumers but the last). On `backward` it waits for
/// the gradient from every consumer edge (fan-out), sums them in the plan's order (the
/// direct executor's), computes the input gradients (B) and emits them upstream, then
/// accumulates the weight gradients (W) in micro-batch order, so the sums are the same
/// bits as sequential training. After the step's last backward it applies its optimizer,
/// zeroes its gradients and reports `node_done` to the coordinator.
///
/// The math goes to the node's `layer_kernels` (layers/backend.hpp): Eigen on the CPU, or
/// enqueued on a device's stream, where the step's end comes back as a `backend_done`
/// message and only then is `node_done` sent. Hooks see host tensors (on a device, a
/// download made only when a hook is registered, run once it is done).
///
/// In a pipeline stage the stage's gate decides when (`layer_gating`, opt-in at wiring):
/// forwards that enter the actor's piece and gradients that come back into it from a
/// later piece wait until the gate admits their micro-batch (the actor tells the gate
/// they arrived), W may wait for its own admission (split backward), and so may the
/// optimizer step; each F, B and W done is reported to the gate. A value that comes from
/// another stage is adopted by the kernels (uploaded to a device stage, say), and one that
/// leaves for a stage of another device (or the CPU) is handed over first (`crossing`),
/// so the edges of the graph carry what each side can use. With a replica group
/// the weight gradients are all-reduced (`bus::all_reduce`) before the optimizer step; on
/// a device they stay there (`device_contribution`, summed by the backend's reducer).
///
/// With the recorder on, each edge's credits are recorded as a counter on this actor's
/// track (`credits`, `available`, id = the edge's global index): the step's micro-batches
/// less those forwarded on the edge whose gradient has not come back.

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <string_view>
#include <vector>

#include "actors/actor.hpp"
#include "bus/all_reduce.hpp"
#include "bus/signal.hpp"
#include "layers/backend.hpp"
#include "layers/graph.hpp"
#include "layers/messages.hpp"
#include "layers/plan.hpp"

namespace nerve::layers {

using graph = basic_graph<float>;
using stash = basic_stash<float>;

/// Tells a layer actor to pass non-finite gradients to its optimizer
/// (`train_options::allow_nonfinite`); by default a NaN or Inf gradient fails the run,
/// naming the layer and the step, before the optimizer writes it into the weights.
struct allow_nonfinite_gradients {
  static constexpr std::string_view kind = "allow_nonfinite_gradients";
  bool allow = true;
};

/// What a pipeline stage's gate lets a layer actor do next (the schedule's F, B, W, and
/// the optimizer step), and what the actor tells the gate.
enum class stage_op : std::uint8_t { forward, backward, weight, step };

/// From the gate: run `op` of `micro_batch` (held forwards or gradients, a deferred W;
/// for `step`, the optimizer step once its gradients are complete).
struct admit {
  static constexpr std::string_view kind = "admit";
  stage_op op = stage_op::forward;
  std::int64_t micro_batch = 0;
};

/// To the gate: a held forward or gradient of `micro_batch` arrived (`arrived`), or the
/// actor ran its `op` of it. `stash_bytes`: what the actor holds for backward now.
struct layer_event {
  static constexpr std::string_view kind = "layer_event";
  stage_op op = stage_op::forward;
  bool arrived = false;
  std::int64_t micro_batch = 0;
  std::uint32_t piece = 0, node = 0;
  std::size_t stash_bytes = 0;
  /// An evaluation forward left the actor (its output emitted, handed over where it
  /// crosses): the gate answers an evaluation once its layers have sent all of theirs.
  bool evaluated = false;
};

/// How a node's value leaves for another pipeline stage: as it is (a host tensor, or a
/// value of the same stream), as a device copy the other stage's stream waits for (same
/// device), or downloaded to the host (a CPU stage, the loss, another device).
enum class crossing : std::uint8_t { none, device, host };

/// A layer actor's part in a pipeline stage (see `layer_actor::gate`).
struct layer_gating {
  actors::address gate;                ///< hears `layer_event`s
  std::uint32_t piece = 0;             ///< the piece the node is in
  input_mask hold_forward = 0;         ///< input ports whose forward waits for `admit{forward}`
  std::vector<bool> hold_backward;     ///< per edge: its gradient waits for `admit{backward}`
  bool defer_weight = false;           ///< W waits for `admit{weight}` (split backward)
  bool defer_step = false;             ///< the optimizer step waits for `admit{step}`
  crossing output = crossing::none;    ///< how the forward output leaves
  std::vector<crossing> gradients;     ///< per input port: how its gradient leaves
  actors::address reducer;             ///< replicas: the node's all-reduce (empty: none)
  std::uint32_t rank = 0;              ///< this replica's rank in it
};

class layer_actor : public actors::actor {
 public:
  /// `node` (of a graph that outlives the actor) is used by this actor only; `plan` is
  /// the node's wiring (copied); `kernels` run its math (and own its optimizer).
  layer_actor(graph::node_type& node, std::uint32_t index, const node_plan& plan,
              std::unique_ptr<layer_kernels> kernels);

  /// The node's output: forward messages to every consumer edge.
  bus::signal<forward_msg>& output() noexcept { return out_; }
  /// The gradient of input `port`, back to its producer.
  bus::signal<backward_msg>& input_gradient(std::size_t port) { return *grad_.at(port); }
  /// Wiring, before messages flow: who hears of finished steps, and the global index of
  /// each of the node's edges (the credits counters' ids; empty: no counters).
  void wire(actors::address coordinator, std::vector<std::int32_t> edge_ids = {});
  /// Wiring, for a pipeline stage: the gate that decides when (see the file comment).
  void gate(layer_gating g);

  /// The most micro-batches stashed at once, and the most stash bytes (memory bound).
  std::size_t peak_stashed() const noexcept { return peak_stashed_; }
  std::size_t peak_stash_bytes() const noexcept { return peak_bytes_; }
  /// Any thread, a sample: forwards, gradients and admits this actor handled, and the
  /// steps it finished (`node_done` sent). A stall watch compares two samples.
  std::uint64_t handled() const noexcept { return handled_.load(std::memory_order_relaxed); }
  std::uint64_t steps_done() const noexcept { return steps_done_.load(std::memory_order_relaxed); }

 private:
  struct micro_batch_state {
    std::vector<value> inputs;
    std::uint32_t inputs_got = 0;
    kept st;
    bool forwarded = false;
    std::vector<value> grads;
    std::uint32_t grads_got = 0;
  };
  // One writer (this actor's loop): a load and a store, no read-modify-write.
  static void bump(std::atomic<std::uint64_t>& n) noexcept {
    n.store(n.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
  void on_forward(forward_msg& m, bool admitted = false);
  void on_backward(backward_msg& m, bool admitted = false);
  void finish_weight_grads();
  void maybe_step();
  void on_admit(const admit& a);
  void report(stage_op op, std::int64_t mb, bool arrived = false);
  void record_credits(std::size_t edge);
  /// Emits `m` on `sig` once its value (`m.*field`) crossed toward the next stage as `c` says.
  /// Then runs `after` (once emitted).
  template <class Msg>
  void emit_across(bus::signal<Msg>& sig, crossing c, Msg m, value Msg::*field, std::function<void()> after = {});

  graph::node_type& node_;
  std::uint32_t index_;
  node_plan plan_;
  std::unique_ptr<layer_kernels> kernels_;
  bus::signal<forward_msg> out_{*this, "out"};
  std::vector<std::unique_ptr<bus::signal<backward_msg>>> grad_;  // by input port
  actors::address coordinator_;
  input_mask wanted_ = 0;  // inputs whose producer is a layer (subscribed to their gradient)
  // Credits: per edge, micro-batches forwarded whose gradient has not come back.
  std::vector<std::int32_t> edge_ids_;
  std::vector<std::uint32_t> outstanding_;
  const char* credits_name_ = nullptr;
  std::map<std::int64_t, micro_batch_state> mbs_;
  // W in micro-batch order: backwards that arrived early wait here with their stash.
  struct pending_weight {
    kept st;
    value grad;
  };
  std::map<std::int64_t, pending_weight> pending_w_;
  std::int64_t next_w_ = 0;
  std::uint64_t step_ = 0;
  std::uint32_t step_micro_batches_ = 0;
  std::uint32_t backwards_done_ = 0;
  // The next step's forwards that came before this layer issued step_'s update (a backend
  // with several steps in flight): run once it has.
  bool step_open_ = false;
  std::vector<forward_msg> next_step_;
  std::size_t peak_stashed_ = 0, peak_bytes_ = 0, bytes_ = 0;
  bool allow_nonfinite_ = false;
  // Pipeline stages (layer_gating): held messages by micro-batch, admitted Ws, step state.
  layer_gating gating_;
  std::map<std::int64_t, std::vector<forward_msg>> held_forward_;
  std::map<std::int64_t, std::vector<backward_msg>> held_backward_;
  std::set<std::int64_t> weight_admitted_;
  std::size_t pending_bytes_ = 0;
  bool step_admitted_ = false, contributed_ = false;
  std::shared_ptr<const std::vector<float>> reduced_sum_;
  std::shared_ptr<backend_data> device_sum_;  // replicas on a device: the group's sum there
  std::atomic<std::uint64_t> handled_{0}, steps_done_{0};
};

}  // namespace nerve::layers

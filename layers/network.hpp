#pragma once
/// \file
/// `network`: runs a graph as actors, one `layer_actor` per layer node, on a runtime; its
/// edges are bus signals (`graph_plan` says which).
///
/// ```
///   train_step ──► coordinator ══input══► fc1 ══out══► relu1 ══out══► fc2 ══out══╗
///        ▲          (the loss) ◄═══════════════════════════════════════════════════╝
///        └── future ──┘ ▲ ╚═grad═► fc2 ══grad══► … ══grad══► fc1
///                       └── node_done (each layer)
///   (══ a bus signal: forward on each node's output, gradients on each input's signal)
/// ```
/// The coordinator is the one every run goes through (a pipeline stage's too:
/// layers/pipeline/stage_gate.hpp), here without admission: it splits a mini-batch into
/// micro-batches (the same split as the direct executor), sends each one's input to the
/// graph's first layers, computes each one's loss when the output arrives and sends its
/// gradient back, and answers the step once the loss of every micro-batch is in and every
/// layer has applied its optimizer. The weights after a step are bitwise those of
/// `direct_executor::train_step` on the same graph, data and optimizer settings.
///
/// Thread-safety: `network`'s members may be called from any thread outside the runtime's
/// loops; steps run one after the other (a second request waits for the first).

#include <exception>
#include <functional>
#include <atomic>
#include <future>
#include <stdexcept>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "actors/runtime.hpp"
#include "layers/backend.hpp"
#include "layers/executor.hpp"
#include "layers/graph.hpp"
#include "layers/layer_actor.hpp"
#include "layers/loss.hpp"
#include "layers/optimizer.hpp"
#include "layers/plan.hpp"

namespace nerve::pipeline {
class own_failure;
}

namespace nerve::layers {

/// Messages delivered through the network's bus signals so far (read between steps).
struct bus_traffic {
  std::uint64_t feed = 0;      ///< micro-batches into the graph's inputs, one per input edge
  std::uint64_t forward = 0;   ///< activations along edges out of layers (into the loss included)
  std::uint64_t backward = 0;  ///< gradients back along the same edges
};

/// Where the network's actors go.
struct network_options {
  /// Loop of each graph node, by node index (graph inputs ignored). Empty: `spread` says.
  /// The coordinator (which computes the loss) is on loop 0.
  std::vector<unsigned> loops;
  /// Without `loops`: false puts every actor on loop 0; true spreads layers over the
  /// runtime's loops round-robin in topological order (independent branches then run at once).
  bool spread = false;
  /// Where the layers' kernels go (layers/backend.hpp). Null: the CPU, with an optimizer
  /// per layer from the network's factory. A device backend's actors share one loop.
  std::shared_ptr<layers::backend> backend;
  /// Seconds a training step may go with no layer handling a message before its future
  /// throws a `stall_error` naming the layers that have not finished the step (0: wait for
  /// ever). The network is stopped afterwards.
  double stall_timeout_s = 60;
};

/// A step stopped moving for its stall timeout; the text says who waits on whom
/// (`network_options::stall_timeout_s`, `pipeline_options::stall_timeout_s`).
class stall_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The optimizer state of the layer actors `by_node` (by node index of `g`; empty addresses
/// skipped), named as in the graph (`fc1.weight`, counters `fc1.steps`). Waits for the
/// actors: off the loops, between steps.
optimizer_state ask_optimizer_state(actors::runtime& rt, const graph& g, const std::vector<actors::address>& by_node);

/// The node of `g` with an actor in `by_node` whose name prefixes `name` (`fc1` of
/// `fc1.weight`), or `g.nodes().size()` if none.
std::size_t owner_of(const graph& g, const std::vector<actors::address>& by_node, const std::string& name);

class network {
 public:
  /// Spawns the actors for `g` (which must outlive the network) on `rt`. Sets the training
  /// heap policy (`keep_freed_memory`, layers/memory.hpp) so steps reuse their pages.
  /// `make_optimizer` may be empty when `options.backend` brings its own optimizers.
  network(actors::runtime& rt, graph& g, std::shared_ptr<const loss> criterion, optimizer_factory make_optimizer,
          network_options options = {});
  /// Stops the network's actors.
  ~network();
  network(const network&) = delete;
  network& operator=(const network&) = delete;

  /// One optimizer step over `input` split into `micro_batches` micro-batches.
  /// `lr` (when not negative) becomes every layer's learning rate from this step on.
  ///
  /// A failure in the runtime (a layer or hook that threw, here or in another network on
  /// the same runtime) stops every actor, this network's included, for good. From then on
  /// `train_step`, `evaluate` and `predict` return at once a future holding a
  /// `std::runtime_error` that quotes the first failure (nested in it) and says the
  /// network must be rebuilt.
  std::future<step_result> train_step(tensor input, targets t, std::size_t micro_batches = 1, std::uint64_t step = 0,
                                      double lr = -1);
  /// Loss and correct count of a batch, in evaluation mode (no stash, no update).
  std::future<step_result> evaluate(tensor input, targets t);
  /// The network's output for a batch, in evaluation mode.
  std::future<tensor> predict(tensor input);

  /// What went through the bus so far: one step of M micro-batches adds
  /// `plan().gradient_edges * M` forwards and as many backwards, `plan().input_edges * M` feeds.
  bus_traffic traffic() const;
  /// The graph's plan the actors were wired from.
  const graph_plan& plan() const noexcept { return plan_; }

  /// Every layer's optimizer state, parameters named as in the graph (`fc1.weight`) and
  /// counters prefixed with the node (`fc1.steps`). Between steps (waits for the actors).
  optimizer_state optimizer_state_of() const;
  /// Gives each layer's optimizer its part of `state` (as `optimizer_state_of` made it).
  /// Between steps. Throws naming a buffer no layer owns.
  void load_optimizer_state(const optimizer_state& state);

  /// The actor running node `name`.
  actors::address actor_of(std::string_view name) const;
  /// Every layer actor, in node order (graph inputs skipped).
  std::vector<actors::address> layer_actors() const;
  graph& model() noexcept { return graph_; }
  actors::runtime& system() noexcept { return rt_; }
  /// Training steps that run at once when asked for back to back (the backend's).
  std::size_t steps_in_flight() const noexcept { return backend_->steps_in_flight(); }

 private:
  actors::runtime& rt_;
  graph& graph_;
  graph_plan plan_;
  std::shared_ptr<backend> backend_;
  std::vector<actors::address> node_actors_;  // by node index; empty for graph inputs
  std::vector<actors::address> reducers_;     // a tied weight's sum (graph::tie), one per tie
  actors::address coordinator_;  // the step coordinator, without admission (stage_gate.hpp)
  std::shared_ptr<pipeline::own_failure> coordinator_failed_;  // what it failed with itself
  std::exception_ptr failure_at_start_;  // the runtime's error when the network was built (if any)
  double stall_timeout_s_ = 0;
  std::uint64_t trains_ = 0;         // training steps asked for (the caller's thread)
  std::atomic<bool> stalled_{false};  // a step stalled: the actors are told to stop

  /// Waits for `f`, the answer to the `k`-th training step, throwing a `stall_error` once no
  /// layer handled a message for the stall timeout (on the thread that waits for it).
  template <class F>
  void watch_step(F& f, std::uint64_t k);

  /// Null while the network can run; else why it cannot (see `train_step`).
  std::exception_ptr stopped_error() const;
};

}  // namespace nerve::layers

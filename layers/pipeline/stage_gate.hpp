#pragma once
/// \file
/// `stage_gate`: the one step coordinator. Every run goes through one: a `network` (one
/// stage, no admission) and each stage of a `pipeline` (a schedule's list or the emergent
/// credit policy). It feeds the graph input on its signal, owns the loss node (the loss of
/// each micro-batch on its backend, the gradient back on its signal), collects what its
/// layers report and answers the step. What differs between a network and a pipeline stage
/// is only the **admission policy** (`admission`):
///
/// - `none` (a network): the coordinator splits the batch into micro-batches, feeds them all,
///   and the layers run each message as it comes (forward, B and W, then their optimizer
///   step once the step's last backward ran). Training steps overlap up to
///   `config::steps_in_flight` (a layer runs the next step's forwards once it issued its
///   update; a device backend has 2); evaluations and predictions run alone. Answers go out
///   in request order. A layer's failure stops the runtime, which stops the coordinator:
///   whoever waits hears of it (`on_stop`).
/// - `schedule` and `emergent` (a pipeline stage):
///
/// ```
///   stage s-1 layers ══forward══► entry layers ══► … ══► exit layers ══forward══► stage s+1
///                      arrived ┐   ▲ admit F mb          ▲ admit B mb   ┌ arrived
///                              └─► stage gate (list or emergent policy) ◄┘ ◄══gradient══
///                                  ▲  └─ admit W mb, admit step ─► every layer of the stage
///                                  └── F, B, W done ── each layer
/// ```
/// Activations and gradients go from layer actor to layer actor on bus signals, inside a
/// stage and across stages. A forward that enters a piece from an earlier one (or a
/// gradient that comes back into it from a later one) is held by the layer that gets it,
/// which tells the gate it arrived; the gate runs its actions one at a time in the
/// schedule's order: it admits an action once everything it needs has arrived and starts
/// the next once every layer of the piece reported it done. The gate of the stage with
/// piece 0 feeds the graph input on its own signal; the gate of the stage with the last
/// piece is the loss: it computes it when the output arrives (part of that F; on the device
/// of a device stage) and sends its gradient back on its signal at that micro-batch's B. After the last action it admits
/// every layer's optimizer step and answers the step with the stage's figures.
///
/// A layer actor that fails reports to its gate (its supervisor): the gate ends the step
/// with that error, tells every other gate to abort, and stops its layers.
///
/// `pipeline` and its gates talk in `detail::step_msg` (a step request per stage), the
/// stage's `detail::stage_report`, and `detail::abort_msg`, which ends a failed step everywhere.
///
/// **Evaluation and prediction** (`step_msg::train` false) take the same layer actors, in
/// evaluation mode, with no schedule: the gate of piece 0 feeds every micro-batch at once,
/// the layers run each forward as it comes (nothing is held, stashed or reported), and
/// the gate of the last piece computes each micro-batch's loss (on its device, for a
/// device stage) and answers once all are in. Every gate answers once each of its layers
/// sent on every micro-batch's output: across ranks the values are then with the transport
/// before the ranks exchange their figures.
///
/// Thread safety: an actor; `wire` and the signals' wiring before messages flow.

#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "actors/actor.hpp"
#include "bus/signal.hpp"
#include "layers/executor.hpp"
#include "layers/layer_actor.hpp"
#include "layers/loss.hpp"
#include "layers/pipeline/pipeline.hpp"
#include "layers/pipeline/stall_watch.hpp"

namespace nerve::pipeline {

namespace detail {

/// Starts a step on a stage (a request; the stage answers with its `stage_report`).
struct step_msg {
  static constexpr std::string_view kind = "pipeline_step";
  std::uint64_t step = 0;
  double lr = -1;
  std::int64_t t0_ns = 0;  ///< the step's start on the recorder clock
  /// Every stage of every replica: replica r's stage s at r * S + s.
  std::shared_ptr<const std::vector<actors::address>> stages;
  std::uint32_t replica = 0;
  std::vector<layers::tensor> inputs;    ///< stage 0: one per micro-batch
  std::vector<layers::targets> targets;  ///< the last stage: one per micro-batch
  std::vector<double> shares;            ///< the last stage: nᵢ/N per micro-batch (N: all replicas' samples)
  /// False: evaluation (no update); the last stage then answers with the micro-batches'
  /// figures, and with their outputs when `want_output` (prediction).
  bool train = true;
  bool want_output = false;
  std::uint32_t evaluations = 0;  ///< evaluation: this replica's micro-batches (every stage's)
};

/// Another stage failed with `what`: end the step and stop. Carries text, not the
/// exception: every stage fails its own request with its own `stage_aborted`, so no
/// exception object is shared between loop threads and the caller.
struct abort_msg {
  static constexpr std::string_view kind = "abort";
  std::uint32_t from = 0;
  std::string what;
};

/// The error of a stage that stopped because another stage failed.
class stage_aborted : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A run of a coordinator without admission (a network's step, evaluation or prediction):
/// the whole batch, which the coordinator splits. Answered with a `run_outcome`.
struct run_msg {
  static constexpr std::string_view kind = "step";
  layers::tensor input;
  layers::targets t;
  std::size_t micro_batches = 1;
  std::uint64_t step = 0;
  bool train = true;
  bool want_output = false;
  double lr = -1;
};

/// What a coordinator without admission answers: the figures, and the output of a prediction.
struct run_outcome {
  layers::step_result result;
  layers::tensor output;
};

struct stage_report {
  std::vector<double> losses;  // last stage: per micro-batch
  std::vector<std::int64_t> correct;
  std::int64_t begin_ns = 0, end_ns = 0;
  std::int64_t busy_ns = 0, input_wait_ns = 0, backpressure_ns = 0, optimizer_ns = 0;
  std::size_t peak_stashed = 0, peak_bytes = 0;
  std::vector<timed_action> actions;  // seconds from the step's t0
  std::vector<layers::tensor> outputs;  // evaluation with `want_output`: per micro-batch
};

}  // namespace detail

/// One piece of a stage, as its gate drives it.
struct gate_piece {
  std::vector<actors::address> layers;   ///< every layer actor of the piece (W admits, done reports)
  std::vector<actors::address> entries;  ///< layers that hold forwards entering the piece
  std::vector<actors::address> exits;    ///< layers that hold gradients coming back into it
  std::uint32_t forwards_in = 0;         ///< held forwards per micro-batch
  std::uint32_t gradients_in = 0;        ///< held gradients per micro-batch
};

/// What a coordinator without admission failed with itself, for whoever asks later (a
/// network's next step): its actor may be gone by then, and its failure may not have
/// reached the runtime yet (an actor's `on_stop` runs first). Any thread.
class own_failure {
 public:
  void set(std::exception_ptr e) {
    std::lock_guard lk(m_);
    if (!e_) e_ = std::move(e);
  }
  std::exception_ptr get() const {
    std::lock_guard lk(m_);
    return e_;
  }

 private:
  mutable std::mutex m_;
  std::exception_ptr e_;
};

/// How a coordinator lets work into its layers (see the file comment).
enum class admission : std::uint8_t {
  schedule,  ///< the plan's action list, one action at a time
  emergent,  ///< per-edge credits, gradients before forwards
  none,      ///< no gate: the layers run each message as it comes (a network)
};

class stage_gate : public actors::actor {
 public:
  struct config {
    std::uint32_t stage = 0;
    /// Shared: a stopping actor may outlive its pipeline. Null with `admission::none`.
    std::shared_ptr<const ::nerve::pipeline::schedule> plan;
    std::shared_ptr<const layers::loss> criterion;  // used by the stage of the last piece
    admission policy = admission::schedule;
    std::uint32_t credits = 1;
    /// What computes the last piece's loss: its stage's backend (a device on its stream,
    /// the figures back as a `backend_done`; the CPU at once), or the CPU's where a device
    /// cannot run the loss.
    std::shared_ptr<layers::backend> loss_backend;
    /// Where the gate counts its messages and publishes its state (null: nowhere).
    std::shared_ptr<stage_watch> watch;
    /// `admission::none`: training steps that may run at once (the backend's), the
    /// layers that report each step done, and the actor's name.
    std::size_t steps_in_flight = 1;
    std::size_t layer_count = 0;
    std::string name;
    /// Where it keeps its own failure (null: nowhere but its runs).
    std::shared_ptr<own_failure> failed;
  };
  explicit stage_gate(config c);

  /// Wiring: the stage's pieces (by chunk) and every layer actor of the stage.
  void wire(std::vector<gate_piece> chunks, std::vector<actors::address> members);
  /// The graph input, fed at F of piece 0 (subscribed by its consumers).
  bus::signal<layers::forward_msg>& input() noexcept { return input_; }
  /// The loss gradient, sent back at B of the last piece (subscribed by the output layer).
  bus::signal<layers::backward_msg>& loss_gradient() noexcept { return loss_grad_; }
  /// `admission::none`: fails whoever waits (the runtime stopped, or a layer failed).
  void on_stop() override;

 private:
  using key = std::pair<std::int64_t, std::uint32_t>;  // (micro-batch, piece)
  template <class F>
  void guarded(F&& f);
  void fail(std::exception_ptr e, bool aborted);
  void on_step(detail::step_msg& m);
  void on_evaluate();
  void on_evaluated(layers::forward_msg& m);
  void finish_evaluation();
  void on_event(const layers::layer_event& e);
  void on_output(layers::forward_msg& m);
  bool ready(const action& a) const;
  std::optional<action> emergent_next(bool& blocked_by_credits, std::uint64_t seen) const;
  void advance();
  void run(const action& a);
  void complete();
  void finish_step();
  void block(bool credits);
  void unblock();
  /// Publishes the gate's state to `c_.watch` (at each start, block, step and failure).
  void publish();
  std::int64_t now();
  // Without admission (a network): the runs queued, the first `free_running_` running.
  struct free_job {
    detail::run_msg req;
    actors::deferred_reply<detail::run_outcome> reply;
    std::vector<layers::micro_batch_rows> split;
    layers::step_result result{};
    std::int64_t start_ns = -1;  // recorder time the step began (-1: not recording)
    std::size_t reports = 0, nodes_done = 0;
    layers::tensor output{};  // a prediction's, which runs one micro-batch
  };
  bool free() const noexcept { return c_.policy == admission::none; }
  /// Runs `f`; a failure goes on to the runtime, and to the runs waiting (`on_stop`).
  template <class F>
  void free_guarded(F&& f);
  free_job& free_running(std::uint64_t step);
  void free_start_more();
  bool free_start(free_job& j);
  void free_output(layers::forward_msg& m);
  void free_finish();

  config c_;
  std::uint32_t S_ = 1, P_ = 1;
  bool emergent_ = false;
  std::vector<gate_piece> chunks_;
  std::vector<actors::address> members_;
  bus::signal<layers::forward_msg> input_{*this, "input"};
  bus::signal<layers::backward_msg> loss_grad_{*this, "loss_grad"};
  // The step.
  detail::step_msg req_;  // its request: the other stages, the inputs, targets and shares
  actors::deferred_reply<detail::stage_report> reply_;
  detail::stage_report rep_;
  std::map<key, std::uint32_t> forwards_, gradients_;  // held at the layers, not yet admitted
  // Emergent mode: when each gradient set was complete (arrival number), and the arrivals
  // before the action running began: what a stage that handles one message at a time sees.
  std::map<key, std::uint64_t> gradients_complete_;
  std::uint64_t arrivals_ = 0, seen_ = 0;
  std::map<std::int64_t, layers::value> loss_grads_;
  std::uint32_t loss_reports_due_ = 0;  // device losses whose figures have not come back
  std::uint32_t outputs_due_ = 0;       // evaluation: micro-batches whose output has not come
  // Evaluation forwards the stage's layers sent on (counted before the request may have
  // come), and how many the evaluation running needs: its micro-batches by the layers.
  std::size_t evaluated_ = 0, evaluations_due_ = 0;
  bool evaluating_ = false;
  // Outputs of an evaluation whose request has not come yet: across ranks, the stages
  // before this one start it on their rank's request, which may come first.
  std::vector<layers::forward_msg> early_outputs_;
  // The action running, and where the list is.
  std::size_t cursor_ = 0;
  action cur_;
  std::uint32_t cur_piece_ = 0, done_ = 0;
  std::int64_t cur_start_ = 0;
  bool active_ = false, running_ = false, loss_pending_ = false, stepping_ = false, failed_ = false;
  bool waiting_ = false, wait_credits_ = false;
  std::int64_t wait_since_ = 0, step_start_ = 0;
  std::size_t nodes_done_ = 0;
  std::uint32_t next_f_ = 0, in_flight_ = 0;  // emergent mode
  std::uint32_t out_ = 0;                     // micro-batches sent to the next stage, gradient not back
  std::size_t held_ = 0, bytes_ = 0;           // micro-batch·chunks between F and W, and the stage's stash bytes
  std::map<std::uint32_t, std::size_t> layer_bytes_;
  std::deque<free_job> free_jobs_;
  std::size_t free_running_ = 0;
  std::exception_ptr own_failure_;  // what this coordinator failed with, for on_stop
};

}  // namespace nerve::pipeline

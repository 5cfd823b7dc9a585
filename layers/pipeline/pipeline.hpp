#pragma once
/// \file
/// `pipeline`: pipeline-parallel training — each stage a `bus::group` of layer actors on
/// its own loop, whose `stage_gate` runs the stage's list of a `schedule`.
///
/// ```
///   train_step ──step──► gate 0                gate 1 ──── … gate S-1 (the loss)
///                          │ input, admits       │ admits        │
///                    [fc1 ══► relu1 ══► fc2] ══► [fc3 ══► … ══► fc5] ══► loss
///                    stage 0 (a group)   ◄══gradients══  stage 1     ◄══
///        ▲                                                (══ bus signals, layer to layer)
///        └── reports ◄── each gate, after its layers' optimizer steps
/// ```
/// One layer actor per layer node, as in a `network`: forwards and gradients go from
/// layer to layer on bus signals, inside a stage and across stages. A stage's gate admits
/// the micro-batches into its pieces in the schedule's order (an F once its activations
/// arrived, a B once its gradients did, a W when its turn comes) and, after its last
/// action, the optimizer step of every layer (see stage_gate.hpp). The weights after a
/// step are bitwise those of `direct_executor::train_step` with the same micro-batches:
/// each layer sums its gradients in the executor's order and runs W in micro-batch order.
///
/// `emergent` mode runs no list: per-edge credits bound the micro-batches a stage lets
/// into the next one, and gradients run before forwards.
///
/// A device stage is the same: its layer actors' kernels go to the stage's backend
/// (`pipeline_options::backends`, one stream of a device), and a value that crosses to a
/// stage of another device or the CPU is copied over by the layer that sends it (see
/// `layers::crossing`); a device last stage's gate enqueues the loss on its stream.
///
/// **Across processes** (`pipeline_options::link`): every rank builds the same pipeline
/// and spawns the gates and layer actors of its own stages only; an edge between stages
/// of two ranks is a bus subscription through the link's endpoint (a `forward_msg` or
/// `backward_msg` on the wire), and a layer's replicas on several ranks sum through the
/// link's all-reduce, in the in-process member order. So the weights are bitwise those of
/// one process. A device stage's replicas one per rank sum with NCCL where every member's
/// backend can (CUDA devices, NCCL built: within R·2⁻²⁴·Σ|gᵢ|), else their gradients cross
/// through the host to the link's all-reduce and back (bitwise the replicas on one device).
/// After each step the ranks exchange their stages' reports, so every rank returns the
/// whole step's figures; `download` brings every stage's weights into every rank's graph.
///
/// Thread safety: `train_step` and the accessors are called from one thread outside the
/// runtime's loops; a step returns once every stage reported. Across ranks, `train_step`,
/// `download`, `optimizer_state_of` are collectives: every rank calls them in the same order.

#include <cstdint>
#include <functional>
#include <future>
#include <stdexcept>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "actors/runtime.hpp"
#include "bus/group.hpp"
#include "layers/executor.hpp"
#include "layers/network.hpp"
#include "layers/pipeline/partition.hpp"
#include "layers/pipeline/ranks.hpp"
#include "layers/pipeline/schedule.hpp"

namespace nerve::pipeline {

namespace detail {
struct stage_report;
struct step_msg;
}
class stage_watch;

/// Figures of one stage, summed over the steps since construction or `reset_metrics`.
struct stage_metrics {
  std::uint32_t stage = 0;
  /// Seconds running actions (and the loss, and the optimizer).
  double busy_s = 0;
  /// Seconds of the steps' wall time the stage was not busy, and why:
  double idle_s = 0;
  double idle_input_s = 0;         ///< waiting for an activation or a gradient
  double idle_backpressure_s = 0;  ///< waiting for credits of the next stage (emergent mode)
  double idle_optimizer_s = 0;     ///< before its first action and after its optimizer step, until the step ended
  /// Wall time of the steps.
  double wall_s = 0;
  std::int64_t steps = 0;
  /// `idle_s / wall_s`.
  double bubble_fraction() const noexcept { return wall_s > 0 ? idle_s / wall_s : 0; }
  /// Most micro-batch·chunks held between F and the end of W at once, and their bytes.
  std::size_t peak_stashed = 0;
  std::size_t peak_stash_bytes = 0;
  std::int64_t actions = 0;
  /// Of `busy_s`: seconds in F actions (the last stage's include the loss), in B actions
  /// (all of backward when the schedule does not split it), in W actions and in the
  /// optimizer step; and how many actions of each kind ran.
  double f_s = 0, b_s = 0, w_s = 0, optimizer_s = 0;
  std::int64_t f_count = 0, b_count = 0, w_count = 0;
};

/// One action as it ran, times in seconds from the step's start.
struct timed_action {
  action a;
  double start = 0, end = 0;
};

/// Makes the backend of a device stage over `nodes` of `g` (off the loops).
using stage_backend_factory =
    std::function<std::shared_ptr<layers::backend>(layers::graph& g, const std::vector<std::size_t>& nodes)>;

struct pipeline_options {
  /// Loop of each stage; empty: stage s on loop `s % loop_count`.
  std::vector<unsigned> loops;
  /// Emergent mode: no schedule list (the schedule's counts still give S, M, chunks).
  bool emergent = false;
  /// Emergent mode: micro-batches a stage may have in the next stage (per edge) at once;
  /// 0: S - s for stage s, 1F1B's bound.
  std::uint32_t credits = 0;
  /// Device stages: one factory per stage (empty: every stage on its loop's CPU; a null
  /// entry: that stage on the CPU), called with the graph and the stage's layer nodes. Its
  /// backend's kernels run the stage's layer actors (docs/gpu.md). With replicas the
  /// factory is called once per replica, with that replica's graph: each replica's stage
  /// gets a backend of its own (a stream of its own, several may share a device). Or give
  /// S·R factories, replica r's stage s at r * S + s (one device per replica, say). The
  /// replicas of a stage are all on devices or all on the CPU; on devices their gradients
  /// are summed there (`backend::spawn_reducer`: on one device in member order, NCCL across
  /// devices); each on a rank of its own, among the ranks (`backend::spawn_rank_reducer`:
  /// NCCL, or through the host). Across ranks a factory is called only where its replica's
  /// stage runs, but every rank gives the same entries (null or not).
  std::vector<stage_backend_factory> backends;
  /// Across processes: the transport between ranks (null: every stage in this process).
  std::shared_ptr<rank_link> link;
  /// With `link`: the rank of replica r's stage s at r * S + s (empty: rank r * S + s, for
  /// exactly S·R ranks). The replicas of one stage are all on one rank or each on its own.
  std::vector<int> ranks;
  /// Seconds a step may go with no message handled by any of this process's stages before
  /// it ends with a `stall_error` that says what each stage waits for and from whom
  /// (0: wait for ever). See docs/pipeline.md, "A run that stops moving".
  double stall_timeout_s = 60;
  /// Called with the stall report on the thread that waits, before `train_step` throws it.
  /// Across ranks an app ends the job here: unwinding would wait on collectives that a
  /// stopped rank never joins (apps/common/run_control.hpp).
  std::function<void(const std::string&)> on_stall;
};

/// A step stopped moving for `pipeline_options::stall_timeout_s`: its text names, per
/// stage (and rank), the action it runs or is admitted to run next, what it waits for and
/// from which stage, and the credits of its edge to the next stage. The pipeline is failed.
using layers::stall_error;

class pipeline {
 public:
  /// Spawns one gate and its layer actors per stage of `plan` on `rt`. `pieces` has
  /// `plan.stages * plan.chunks` entries (piece p = chunk p / S of stage p % S).
  /// Validates the plan (throws `schedule_error`) and the pieces.
  pipeline(actors::runtime& rt, layers::graph& g, partition pieces, schedule plan,
           std::shared_ptr<const layers::loss> criterion, layers::optimizer_factory make_optimizer,
           pipeline_options options = {});
  /// Data parallelism: one pipeline per graph in `replicas` (equal graphs with equal
  /// weights, e.g. built with the same seed). A step splits its batch into one part per
  /// replica (the micro-batch rule), each replica runs it through its own stages, and the
  /// replicas of each layer form a bus group whose `bus::all_reduce` sums its gradients,
  /// started as soon as the layer's last W ran — while the rest of backward goes on.
  /// Every replica then steps the same summed gradients. Device stages (`options.backends`)
  /// give each replica's stage its own backend and sum on the device.
  pipeline(actors::runtime& rt, std::vector<layers::graph*> replicas, partition pieces, schedule plan,
           std::shared_ptr<const layers::loss> criterion, layers::optimizer_factory make_optimizer,
           pipeline_options options = {});
  /// Stops the gates and layer actors.
  ~pipeline();
  pipeline(const pipeline&) = delete;
  pipeline& operator=(const pipeline&) = delete;

  /// One optimizer step over `input` split into the plan's M micro-batches (the direct
  /// executor's split). `lr` (when not negative) becomes the learning rate. Throws the
  /// first error of a stage (a layer's exception), after which every stage is stopped
  /// and the pipeline refuses further steps.
  layers::step_result train_step(layers::tensor input, const layers::targets& t, std::uint64_t step = 0,
                                 double lr = -1);

  /// Loss and correct count of a batch in evaluation mode (no update, nothing stashed):
  /// the batch is split over the replicas and each part into the plan's micro-batches (as
  /// a step's), and they run through the same layer actors, on the same loops, devices and
  /// ranks, with no schedule. Layers such as BatchNorm and Dropout run as in evaluation.
  /// Across ranks a collective; every rank returns the figures. Throws as `train_step`.
  layers::step_result evaluate(layers::tensor input, const layers::targets& t);
  /// The network's output for a batch, in evaluation mode (as `evaluate`, rows in order).
  layers::tensor predict(layers::tensor input);

  const schedule& plan() const noexcept { return plan_; }
  const partition& pieces() const noexcept { return pieces_; }
  /// Per-stage figures since construction or `reset_metrics` (of replica 0).
  std::vector<stage_metrics> metrics() const { return metrics_; }
  void reset_metrics();
  /// The actions of the last step as they ran, per stage (the measured schedule).
  const std::vector<std::vector<timed_action>>& last_step() const noexcept { return last_step_; }
  /// The stage gates: replica r's stage s at r * S + s (empty where it runs on another rank).
  const std::vector<actors::address>& stage_actors() const noexcept { return stages_; }
  /// The layer actors of replica r's stage s.
  const bus::group& stage_group(std::uint32_t replica, std::uint32_t stage) const {
    return groups_.at(std::size_t(replica) * plan_.stages + stage);
  }
  /// What went through the layer actors' bus signals so far: one step of M
  /// micro-batches adds `gradient_edges * M` forwards and as many backwards of the graph's
  /// plan, per replica. Across ranks: what this rank's actors emitted (to local or remote
  /// subscribers).
  layers::bus_traffic traffic() const;
  std::uint32_t replicas() const noexcept { return replicas_; }
  /// The optimizer state of every stage, parameters named as in the graph (replica 0's:
  /// the replicas step the same sums). Between steps, off the loops.
  layers::optimizer_state optimizer_state_of() const;
  /// Across ranks, between steps: every rank's `mine` (`rank_link::all_gather`), ended by a
  /// `stall_error` (and `on_stall`) when a rank does not join within the stall timeout, so a
  /// stopped rank cannot leave the others waiting for ever. `waiting_for` says what the
  /// ranks gather, for the report ("the reports of the step").
  std::vector<std::string> gather_watched(const std::string& mine, const std::string& waiting_for);
  /// Gives every stage of every replica its part of `state`. Between steps, off the loops.
  void load_optimizer_state(const layers::optimizer_state& state);
  /// Copies the weights of the device stages into the graph (waits for their streams:
  /// call between steps, never on a loop). CPU stages train the graph's layers in place.
  /// Across ranks, every rank's replica-0 graph then gets every other rank's stages too.
  void download();
  /// The backend of each stage here (the CPU's for a CPU stage; null for another rank's):
  /// replica r's stage s at r * S + s.
  const std::vector<std::shared_ptr<layers::backend>>& backends() const noexcept { return backends_; }
  /// The replica groups' all-reduce actors (one per layer with parameters; none for one replica).
  const std::vector<actors::address>& reducers() const noexcept { return reducers_; }
  /// True once every gate and layer actor stopped (after a failure, or never while running).
  bool stopped() const noexcept;
  /// `nerve.stages` and `nerve.schedule` for `runtime::write_trace` (docs/trace-format.md).
  nlohmann::json trace_metadata() const;

 private:
  /// The rank of replica r's stage s, and whether it is this one.
  int rank_of(std::uint32_t r, std::uint32_t s) const noexcept { return ranks_.empty() ? 0 : ranks_[r * plan_.stages + s]; }
  bool here(std::uint32_t r, std::uint32_t s) const noexcept { return rank_of(r, s) == me_; }
  /// Across ranks: every stage's report from the local ones (a collective).
  void exchange(std::vector<detail::stage_report>& reports, const std::vector<bool>& local);
  /// The same for the outputs of a prediction (the reports' `outputs`).
  void exchange_outputs(std::vector<detail::stage_report>& reports, const std::vector<bool>& local);
  /// The backend factory of replica r's stage s (null: the CPU), the same on every rank.
  const stage_backend_factory* factory_of(std::uint32_t r, std::uint32_t s) const;
  /// Across ranks, replicas one per rank: for each stage on devices whose replicas are
  /// spread, member 0's id of a group that sums among its ranks (`backend::new_rank_id`),
  /// or empty (through the host). Collectives, every rank at wiring: one, then one per
  /// stage that sums among its ranks.
  std::vector<std::string> agree_rank_sums();
  void spawn_groups(const std::vector<layers::graph*>& replicas, std::shared_ptr<const layers::loss> criterion,
                    const layers::optimizer_factory& make_optimizer);
  void stop_all();
  /// Asks this rank's stages for `msgs` (replica r's stage s at r * S + s, `local` ones
  /// only) and waits for their reports; rethrows the first stage's error after stopping all.
  std::vector<detail::stage_report> run_stages(std::vector<detail::step_msg>& msgs, const std::vector<bool>& local);
  /// `evaluate` and `predict`: figures, and the outputs when `out` is given.
  layers::step_result forward_only(layers::tensor input, const layers::targets* t, layers::tensor* out);
  /// Waits for `futures` (the local ones), ending the wait with a `stall_error` once no
  /// local gate handled a message for the stall timeout.
  void watch_stages(std::vector<std::future<detail::stage_report>>& futures, const std::vector<bool>& local);
  /// The stall report of this process's stages.
  std::string stall_report(double seconds, const std::vector<bool>& local) const;
  /// Fails the pipeline with `report`: tells the stages, calls `on_stall`, throws `stall_error`.
  [[noreturn]] void stall(const std::string& report);

  actors::runtime& rt_;
  layers::graph* graph_ = nullptr;  // replica 0's
  std::uint32_t replicas_ = 1;
  partition pieces_;
  schedule plan_;
  pipeline_options options_;
  std::vector<actors::address> stages_, reducers_;
  std::vector<actors::address> layers_;  // replica r's node i at r * nodes + i (none for inputs)
  std::vector<bus::group> groups_;       // replica r's stage s at r * S + s
  std::vector<std::shared_ptr<layers::backend>> backends_;  // replica r's stage s at r * S + s; null: the CPU
  std::vector<std::uint32_t> node_stage_;                   // by node index (inputs: stage 0)
  std::vector<stage_metrics> metrics_;
  std::vector<std::vector<timed_action>> last_step_;
  std::vector<int> ranks_;  // by r * S + s; empty: one process
  std::vector<std::shared_ptr<stage_watch>> watches_;  // by r * S + s; null for another rank's
  int me_ = 0;
  bool failed_ = false;
};

/// The bubble each stage would have if its actions took what they took on average in
/// `m` and messages were free: `simulate` with the measured per-stage costs, each
/// stage's optimizer step after its last action, the step ending when the last optimizer
/// does. `bubble_theory` assumes equal stages; this is the theory for the stages as cut,
/// so an uneven cut shows up here and not as a gap between measurement and theory.
/// `m` has one entry per stage of `plan`; stages that ran nothing predict 0.
std::vector<double> predicted_bubbles(const schedule& plan, const std::vector<stage_metrics>& m);

/// The trace track of stage `s` (replica r's stage s: `r * S + s`), where its actions and
/// idle spans are recorded (docs/trace-format.md).
constexpr std::uint32_t stage_track(std::uint32_t s) noexcept { return 2000000 + s; }

/// Names the stage tracks in `rt`'s recorder ("stage s", or "replica r stage s"), sorted
/// before the actors' lanes, so viewers show one lane per stage.
void name_stage_tracks(actors::runtime& rt, const pipeline& p);

/// Writes `rt`'s trace with the pipeline's metadata and its stage tracks named.
void write_trace(actors::runtime& rt, const pipeline& p, const std::string& path);

/// The measured timeline of `p.last_step()` as a stage × time table of `columns` columns.
std::string measured_table(const pipeline& p, std::size_t columns = 80);

}  // namespace nerve::pipeline

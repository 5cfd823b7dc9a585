#pragma once
/// \file
/// Indexes over a `timeline` that the summary, the critical path and the HTML page
/// share: handler runs per actor in time order, which handler each flow starts in
/// and ends in, the time span of each process, and the training steps.

#include "apps/trace/timeline.hpp"

#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>

namespace nerve::trace {

/// A time range [start, end] in µs.
struct window {
  double start = 0;
  double end = 0;
  [[nodiscard]] double length() const { return end - start; }
  [[nodiscard]] bool contains(double t) const { return t >= start && t <= end; }
};

/// One training step of one process.
struct step_window {
  std::int64_t pid = 0;
  std::int32_t step = 0;
  window span;
};

/// Which part of a trace to look at: everything, one step, or a time range.
struct selection {
  std::optional<std::int32_t> step;        ///< a step number (`--step N`)
  std::optional<window> range;             ///< an explicit time range (`--window A:B`), µs
};

using track = std::pair<std::int64_t, std::int64_t>;  ///< (pid, tid)

/// Read-only indexes over a timeline (which must outlive it).
class trace_index {
 public:
  explicit trace_index(const timeline& t);

  const timeline& tl;
  /// True when the trace marks handler runs (`cat == "handler"`); otherwise every
  /// top-level complete slice counts as one (traces from other tools).
  bool nerve_handlers = false;
  /// Handler runs per track, as event indices sorted by start.
  std::map<track, std::vector<std::uint32_t>> handlers;
  /// Per flow (same order as `timeline::flows`): the handler run the send happened
  /// in, and the one that handled the message; -1 when none.
  std::vector<std::int64_t> flow_sender_run;
  std::vector<std::int64_t> flow_handler_run;
  /// Per event: the flow index that delivered the message a handler run handles (-1 if none).
  std::vector<std::int64_t> incoming_flow;
  /// Per pid: from the first event's start to the last event's end.
  std::map<std::int64_t, window> process_span;
  /// Training steps, per pid in time order (from `cat == "step"` slices). A process
  /// without step markers has one step 0 spanning the whole process.
  std::map<std::int64_t, std::vector<step_window>> steps;
  /// Evaluation phases per pid (`cat == "evaluation"` slices, docs/trace-format.md): the
  /// engine on the test set between epochs, in time order. Not training time: the summary
  /// counts it apart from busy and bubble.
  std::map<std::int64_t, std::vector<std::pair<double, double>>> evaluations;
  /// The evaluation time inside `w` that counts against `pid`, disjoint and ascending: its
  /// own evaluation slices, and in a job every rank's (evaluation is a collective there: a
  /// rank that is done waits for the others).
  [[nodiscard]] std::vector<std::pair<double, double>> evaluation_in(std::int64_t pid, const window& w) const;
  /// Stage of each action/idle event: `args.stage`, else the stage of its track's actor.
  [[nodiscard]] std::int32_t stage_of(const event& e) const;

  /// True for the ranks of one job (a merged trace, `timeline::ranks`, of two or more
  /// processes): their numbers cover one window, the job's, and one critical path follows
  /// arrows across them (`step_window::pid` -1).
  bool job = false;

  /// The window a selection means for `pid` (the whole process when nothing is chosen; in
  /// a job, the union of that window over the job's processes).
  /// Returns nullopt when the chosen step does not exist in that process.
  [[nodiscard]] std::optional<window> window_for(std::int64_t pid, const selection& sel) const;
  /// The step used for the critical path: the chosen one, else the last complete step. In
  /// a job, any `pid` gives the job's step (pid -1): the union of the ranks' steps of that
  /// number (or of their last steps).
  [[nodiscard]] std::optional<step_window> step_for(std::int64_t pid, const selection& sel) const;

  /// The handler run on `tr` whose span contains `ts` (ends inclusive), or -1.
  [[nodiscard]] std::int64_t run_at(const track& tr, double ts) const;
  /// The first handler run on `tr` starting at or after `ts`, or -1.
  [[nodiscard]] std::int64_t run_from(const track& tr, double ts) const;
};

/// Nearest-rank percentile of `values` (sorted in place): the value at rank
/// ceil(p/100 * n), 1-based. 0 for an empty list.
double percentile(std::vector<double>& values, double p);

/// Total length of the union of intervals [start, end], clipped to `w`.
double union_length(std::vector<std::pair<double, double>> intervals, const window& w);

/// The union of intervals [start, end] clipped to `w`: disjoint, ascending, empty ones dropped.
std::vector<std::pair<double, double>> disjoint_union(std::vector<std::pair<double, double>> intervals, const window& w);

/// Length of the overlap of two disjoint, ascending interval lists (`disjoint_union`'s form).
double overlap_length(const std::vector<std::pair<double, double>>& a, const std::vector<std::pair<double, double>>& b);

}  // namespace nerve::trace

#pragma once
/// \file
/// Turns the planned schedule (`nerve.schedule`: per stage, the order of F/B/W
/// actions) into a planned timeline, so the page can overlay it on the measured one
/// and the summary can compare planned and measured bubbles. The schedule code is the
/// pipeline's own (`nerve::schedule`, `layers/pipeline/schedule.hpp`); this is the
/// viewer's view of it.

#include "apps/trace/analysis.hpp"
#include "apps/trace/timeline.hpp"

#include <array>
#include <optional>
#include <string>
#include <vector>

namespace nerve::trace {

/// One planned action placed in time (µs from the plan's start).
struct planned_run {
  std::int32_t stage = 0;
  char op = 'F';
  std::int32_t mb = 0;
  std::int32_t chunk = 0;
  double start = 0;
  double end = 0;
};

/// A schedule played out with fixed durations and no communication delay.
struct plan {
  std::vector<planned_run> runs;
  double makespan = 0;
  std::vector<double> bubbles;  ///< per stage: the share of the makespan it idles
  std::string error;            ///< non-empty when the schedule cannot run (why, and where)

  /// Planned bubble fraction of a stage: 1 - busy / makespan.
  [[nodiscard]] double bubble(std::size_t stage) const { return stage < bubbles.size() ? bubbles[stage] : 0; }
};

/// Durations of F, B and W per stage (µs).
using op_durations = std::vector<std::array<double, 3>>;

/// The processes whose `action` slices time `pid`'s plan: `pid` alone, or in a job (the
/// ranks of a merged trace) every rank the schedule was planned for, since each rank runs
/// and records only its own stages while the plan needs every stage's durations.
std::vector<std::int64_t> plan_sources(const trace_index& index, const schedule_info& schedule, std::int64_t pid);

/// The mean measured F, B and W durations of each stage of `schedule`, from the `action`
/// slices of `pids` that start inside `w` (anywhere when `w` is empty). Nullopt when a stage
/// that has planned actions has no measured one: played as taking no time, it would hide
/// the bubble it causes in the others.
std::optional<op_durations> measured_durations(const trace_index& index, const schedule_info& schedule,
                                               const std::vector<std::int64_t>& pids, const std::optional<window>& w);

/// Plays the schedule with `pipeline::simulate`: each stage runs its list in order, an
/// action starting when the stage is free and its inputs are done (chunk c of stage s
/// is piece c * stages + s). The schedule is checked first (`pipeline::validate`); one
/// that cannot run comes back with `error` set and no runs. The counts default to the
/// actions' when `schedule` leaves them 0; W actions make B the input gradient only.
/// Stages without durations get F 1, B 2, W 1.
plan play_schedule(const schedule_info& schedule, const op_durations& durations);

/// The 1F1B order for one stage, as `pipeline::make_schedule` makes it:
/// min(stages - stage - 1, microbatches) forwards, then alternating F and B, then the
/// remaining backwards. Empty when a count is below 1 or `stage` is out of range.
std::vector<planned_action> one_f_one_b(std::int32_t stages, std::int32_t stage, std::int32_t microbatches);

}  // namespace nerve::trace

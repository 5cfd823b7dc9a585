#pragma once
/// \file
/// Turns the planned schedule (`nerve.schedule`: per stage, the order of F/B/W
/// actions) into a planned timeline, so the page can overlay it on the measured one
/// and the summary can compare planned and measured bubbles.

#include "apps/trace/timeline.hpp"

#include <array>
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
  std::vector<double> busy;  ///< per stage
  std::string error;         ///< non-empty when the schedule deadlocks or is malformed

  /// Planned bubble fraction of a stage: 1 - busy / makespan.
  [[nodiscard]] double bubble(std::size_t stage) const {
    return makespan > 0 && stage < busy.size() ? 1.0 - busy[stage] / makespan : 0;
  }
};

/// Durations of F, B and W per stage (µs).
using op_durations = std::vector<std::array<double, 3>>;

/// Plays the schedule: each stage runs its list in order, an action starting when the
/// stage is free and its inputs are done. With chunks (interleaved schedules) chunk c
/// of stage s is virtual stage c * stages + s. F(mb, v) needs F(mb, v-1); B(mb, v)
/// needs F(mb, v) and B(mb, v+1); W(mb, v) needs B(mb, v).
plan play_schedule(const schedule_info& schedule, const op_durations& durations);

/// The 1F1B order for one stage: min(stages - stage - 1, microbatches) forwards, then
/// alternating F and B, then the remaining backwards.
std::vector<planned_action> one_f_one_b(std::int32_t stages, std::int32_t stage, std::int32_t microbatches);

}  // namespace nerve::trace

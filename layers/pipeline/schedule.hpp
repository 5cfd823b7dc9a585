#pragma once
/// \file
/// `schedule`: a pipeline schedule as data — one list of actions (F, B, W for a
/// micro-batch and a model chunk) per stage, in the order the stage runs them.
///
/// ```
///   1f1b, 2 stages, 4 micro-batches (unit-time table, `.` = bubble):
///   stage 0 | F0 F1 .  B0 F2 B1 F3 B2 .  B3
///   stage 1 | .  F0 B0 F1 B1 F2 B2 F3 B3 .
/// ```
/// The model is cut into `stages * chunks` pieces; piece `p` is chunk `p / stages`
/// of stage `p % stages` (Megatron's interleaving; one chunk per stage otherwise).
/// F of piece p needs F of piece p-1 (its activation); B of piece p needs B of
/// piece p+1 (its gradient) and its own F; W needs its own B. When
/// `split_backward` is false, B does input and weight gradients at once and no W
/// appears. Schedules are made by `make_schedule`, printed by `to_table`, saved
/// and loaded as text (`to_text`/`parse_schedule`), and checked by `validate`
/// before a run. Plain values: no thread-safety concerns.

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace nerve::pipeline {

/// What a stage does: forward, backward (input gradient, or all of backward when
/// the schedule does not split it) or weight gradient.
enum class op : char { F = 'F', B = 'B', W = 'W' };

/// One step of a stage: `op` for `micro_batch` on model chunk `chunk` of the stage.
struct action {
  pipeline::op op = op::F;
  std::uint32_t micro_batch = 0;
  std::uint32_t chunk = 0;
  friend bool operator==(const action&, const action&) = default;
};

/// `F3`, or `F3.1` for chunk 1.
std::string to_string(const action& a, bool with_chunk = false);

/// The named schedules.
enum class schedule_kind { gpipe, one_f_one_b, interleaved, zb_h1 };
/// `gpipe`, `1f1b`, `interleaved`, `zb-h1`.
std::string_view to_string(schedule_kind k) noexcept;

/// Per-stage action lists and their shape.
struct schedule {
  std::string name;
  std::uint32_t stages = 1;
  std::uint32_t micro_batches = 1;
  std::uint32_t chunks = 1;
  /// True when B is the input gradient only and W actions follow (zero-bubble schedules).
  bool split_backward = false;
  /// `actions[s]`: stage s's actions in the order it runs them.
  std::vector<std::vector<action>> actions;

  /// Model pieces (`stages * chunks`).
  std::uint32_t pieces() const noexcept { return stages * chunks; }
  /// The piece that chunk `chunk` of stage `stage` runs.
  std::uint32_t piece(std::uint32_t stage, std::uint32_t chunk) const noexcept { return chunk * stages + stage; }
};

/// Makes a named schedule for `stages` stages and `micro_batches` micro-batches.
///
/// - `gpipe`: every F, then every B (stage s holds all M micro-batches).
/// - `1f1b` (PipeDream-flush): S-1-s warm-up forwards, then one F and one B in
///   turn, then the remaining Bs; stage s holds at most S-s micro-batches.
/// - `interleaved`: 1F1B over `chunks` model chunks per stage (Megatron-LM's order:
///   forwards in groups of S micro-batches per chunk, backwards the reverse way)
///   when S divides M; otherwise the same priorities by a unit-time list
///   simulation (valid, with a larger bubble). Needs `chunks >= 2`.
/// - `zb-h1`: 1F1B's F and B order with backward split into B and W; stage s
///   defers the W of its first s micro-batches into the cool-down, where they fill
///   the waits for gradients. Every stage holds at most S micro-batches between F
///   and W; with equal costs the bubble is (S-1)/(3M+S-1), a third of 1F1B's.
/// Throws `std::invalid_argument` on a zero count or `chunks` that do not fit the kind.
schedule make_schedule(schedule_kind kind, std::uint32_t stages, std::uint32_t micro_batches,
                       std::uint32_t chunks = 1);
/// The same by the kind's name; an unknown name throws `std::invalid_argument` listing the names.
schedule make_schedule(std::string_view name, std::uint32_t stages, std::uint32_t micro_batches,
                       std::uint32_t chunks = 1);

/// A schedule that cannot run: `stage()` and `step()` (index in that stage's
/// list; the list's size when something is missing) say where.
class schedule_error : public std::invalid_argument {
 public:
  schedule_error(const std::string& what, int stage, int step)
      : std::invalid_argument(what), stage_(stage), step_(step) {}
  int stage() const noexcept { return stage_; }
  int step() const noexcept { return step_; }

 private:
  int stage_, step_;
};

/// Checks that `s` can run: counts and ranges; every micro-batch and chunk has
/// exactly one F, one B (and one W when split) on every stage, in the order F,
/// B, W; every activation or gradient a stage waits for is sent by some action;
/// and, simulating the run, no set of stages waits on each other (a wait cycle).
/// Throws `schedule_error` naming the stage and step at fault.
void validate(const schedule& s);

/// Costs for `simulate`, in any time unit: per action of one chunk.
struct action_costs {
  double f = 1, b = 1, w = 1;
};

/// The timeline of a schedule run with fixed action costs (a non-split B costs b + w).
struct simulation {
  /// `start[s][i]`: when stage s starts its i-th action; `end` likewise.
  std::vector<std::vector<double>> start, end;
  /// When the last action ends.
  double makespan = 0;
  /// Per stage: the share of the makespan the stage is idle.
  std::vector<double> bubble;
  /// Per stage: the most micro-batch·chunks held between F and the last of B/W.
  std::vector<std::uint32_t> peak_in_flight;
};

/// Runs `s` (which must be valid) with `costs`: each action starts as soon as its
/// stage is free and what it waits for has ended. Message transfer is free.
simulation simulate(const schedule& s, action_costs costs = {});
/// The same with costs per stage (`per_stage[s]` for every chunk of stage s): the
/// timeline of stages cut unevenly. Throws `std::invalid_argument` unless there is one
/// entry per stage.
simulation simulate(const schedule& s, const std::vector<action_costs>& per_stage);

/// The bubble the schedule's kind has in theory with equal stages and unit costs: GPipe and
/// 1F1B (S-1)/(M+S-1); interleaved (S-1)/(v·M+S-1), reached when S divides M; zb-h1 with
/// F = B = W (S-1)/(3M+S-1); any other schedule the largest bubble `simulate` finds.
double bubble_theory(const schedule& s);

/// The schedule as a stage × time table on unit costs (B and W one unit each; a
/// non-split B two), `'.'` where the stage idles: what `--print-schedule` prints.
std::string to_table(const schedule& s);
/// The schedule as a stage × step table: the i-th action of each stage in column i.
std::string to_step_table(const schedule& s);

/// The text form: `#` comments, `name`, `stages`, `microbatches`, `chunks`,
/// `split` header lines, then one `stage N: F0 F1 B0 ...` line per stage
/// (`F0.1` for chunk 1).
std::string to_text(const schedule& s);
/// Parses `to_text`'s form; throws `std::invalid_argument` naming the line. Does not validate.
schedule parse_schedule(std::string_view text);
/// Writes `to_text(s)` to `path`; throws on I/O errors.
void save_schedule(const schedule& s, const std::filesystem::path& path);
/// Reads and parses `path` (errors name the file and line). Does not validate.
schedule load_schedule(const std::filesystem::path& path);

}  // namespace nerve::pipeline

#pragma once
/// \file
/// Synthetic nerve traces of a 1F1B pipeline with known bubbles, for tests and for
/// load checks of the viewer while the real recorder is being written.
///
/// ```
///   data ──forward──▶ stage 0 [a0 → a1] ──forward──▶ … ──▶ stage S-1 [a0 → a1]
///                     stage 0 [a0 ← a1] ◀──backward── … ◀──backward─┘ (loss)
///   after the last backward: `step` (the optimizer) on every actor
/// ```
/// Each stage is one loop running `actors_per_stage` actors in a chain. Every
/// handler run, send (flow arrow), mailbox depth, credit count, schedule action and
/// stage idle gap (with its cause) is written, as the recorder would.

#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

namespace nerve::trace {

/// Shape and timing of a synthetic run.
struct synth_options {
  std::size_t events = 0;         ///< write whole steps until at least this many events (0: `steps` steps)
  std::int32_t steps = 1;         ///< minimum number of training steps
  std::int32_t stages = 4;
  std::int32_t microbatches = 8;
  std::int32_t actors_per_stage = 2;
  double forward_us = 100;        ///< per actor
  double backward_us = 200;       ///< per actor
  double load_us = 10;            ///< the data actor, per micro-batch
  double optimizer_us = 20;       ///< per actor, once per step
  double jitter = 0;              ///< durations vary by up to ± this fraction (deterministic, `seed`)
  std::uint64_t seed = 1;
  std::int64_t pid = 0;
};

/// What the generator knows by construction, for tests to compare against.
struct synth_truth {
  std::size_t events = 0;   ///< events written (metadata included)
  std::size_t handler_runs = 0;
  std::size_t flows = 0;
  std::int32_t steps = 0;
  double span_us = 0;       ///< first event to last event
  std::vector<double> step_start_us;
  std::vector<double> step_end_us;
  std::vector<double> stage_busy_us;                         ///< per stage, all steps
  std::vector<std::map<std::string, double>> stage_idle_us;  ///< per stage, by cause, all steps
  std::map<std::int64_t, double> actor_busy_us;              ///< by actor id
  std::map<std::int64_t, std::size_t> actor_messages_in;
  std::map<std::int64_t, std::size_t> actor_messages_out;
};

/// The ranges `synth_options` may take (inclusive). Each keeps the generator's
/// memory and output sane; together they keep every time of the trace finite and
/// within `max_time_us`, which `check` also verifies for the whole run.
struct synth_limits {
  static constexpr std::size_t max_events = 10000000;
  static constexpr std::size_t max_handler_runs = 2000000;  ///< the whole run: bounds the size of the file
  static constexpr std::int32_t max_steps = 100000;
  static constexpr std::int32_t max_stages = 1024;
  static constexpr std::int32_t max_microbatches = 4096;
  static constexpr std::int32_t max_actors_per_stage = 64;
  static constexpr double max_time_us = 1e7;  ///< any one handler run (forward, backward, load, optimizer)
  static constexpr double max_jitter = 0.99;
};

/// Throws `std::invalid_argument` naming the first field of `options` outside
/// `synth_limits` (and its range), or saying that the run as a whole would outlast
/// the latest time a trace may hold.
void check(const synth_options& options);

/// Writes a synthetic nerve trace (object form) to `out` and returns its ground truth.
/// Checks `options` first (see `check`).
synth_truth write_synthetic_trace(const synth_options& options, std::ostream& out);

}  // namespace nerve::trace

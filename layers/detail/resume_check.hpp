#pragma once
/// \file
/// What a checkpoint's training state (`nerve.train_state`, read by `resume_options` and
/// `train`) must hold before a run goes on from it (not public API): settings the command
/// line would have taken, and a position inside the run those settings describe. A forged
/// or damaged checkpoint is refused naming the file and the field, never run with a number
/// converted into another (a seed of -1 as 2^64-1, a step of 1e300) or out of the run's
/// range (a step of -1, more samples correct than seen).
///
/// Every refusal is a `std::invalid_argument` reading `--resume FILE: the checkpoint's
/// <part> '<field>' ...`. Any thread.

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "layers/trainer.hpp"

#include <nlohmann/json_fwd.hpp>

namespace nerve::layers::detail {

/// Checks the kind of every value of a train state's `settings` object before it becomes
/// a `train_options` (whose conversion would wrap a negative number into an unsigned one,
/// or cut a fraction): whole numbers in the range their command-line option takes, numbers,
/// true or false, text. `resume` is the checkpoint's path.
void check_settings_json(const nlohmann::json& settings, const std::string& resume);

/// Runs `check_options` on settings read from the checkpoint `resume` (not its outputs,
/// which the app checks once they are given), naming the field a refusal is about.
void check_restored_settings(const train_options& restored, const std::string& resume);

/// Checks the kinds of a train state's `position`, `epochs` and `optimizer_counters`:
/// whole numbers of 0 or more, a finite loss sum, an array of epochs.
void check_state_json(const nlohmann::json& state, const std::string& resume);

/// Where a checkpoint says its run stands (the trainer's position, as read).
struct resumed_position {
  std::int64_t step = 0;
  int epoch = 0;
  std::size_t batch = 0;
  double loss_sum = 0;
  std::int64_t correct = 0, seen = 0, epoch_steps = 0;
  std::size_t epochs_done = 0;       ///< the epochs it reports as finished
  std::int64_t steps_done = 0;       ///< their steps, summed
};

/// The run a position must lie in: its settings and what its data and engine make of them.
struct run_extent {
  std::int64_t total_steps = 0;
  std::size_t batches_per_epoch = 0;
};

/// Checks that `at` is a place of the run `o` (resumed from `o.resume`) with `extent`,
/// and that every optimizer counter (a layer's steps, Adam's per-parameter step) lies
/// between 0 and the position's step.
void check_resumed_position(const resumed_position& at, const std::map<std::string, std::int64_t, std::less<>>& counters,
                            const train_options& o, const run_extent& extent);

}  // namespace nerve::layers::detail

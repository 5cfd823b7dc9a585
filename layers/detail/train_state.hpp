#pragma once
// The training state a checkpoint holds beside the weights (optimizer buffers, the run's
// settings, its position): what the trainer writes between steps and resumes from.
// Internal to layers/ (train_state.cpp; its user is trainer.cpp).

#include <cstdint>
#include <filesystem>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "layers/checkpoint/checkpoint.hpp"
#include "layers/trainer.hpp"

namespace nerve::layers {

// A checkpoint is one safetensors file: the weights and buffers under their PyTorch
// names (what --save writes), the optimizer's buffers as `optimizer.<parameter>.<buffer>`,
// and the rest as JSON in the metadata entry `nerve.train_state`: the settings (`app`: the
// app's own), the position, the epochs before and the optimizer's counters.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(train_options, model, epochs, steps, batch, micro_batches, optimizer, lr, momentum,
                                   nesterov, weight_decay, schedule, device, threads, spread, seed, shuffle, data,
                                   evaluate, trace_exact, checkpoint_every, allow_nonfinite)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(epoch_stats, epoch, steps, train_loss, train_accuracy, test_loss, test_accuracy,
                                   seconds, samples_per_s)

}  // namespace nerve::layers

namespace nerve::layers::detail {

/// Where a run stands between two steps.
struct run_position {
  std::int64_t step = 0;
  int epoch = 0;           // the epoch under way (0-based)
  std::size_t batch = 0;   // its next batch
  double loss_sum = 0;     // this epoch's figures so far
  std::int64_t correct = 0, seen = 0, epoch_steps = 0;
  std::vector<epoch_stats> done;  // the epochs before (stored beside the position, as "epochs")
  // The limits the checkpoint's run was given (its settings, not stored with the position):
  // a resume may raise them, not lower them.
  int planned_epochs = 0;
  std::int64_t planned_steps = -1;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(run_position, step, epoch, batch, loss_sum, correct, seen, epoch_steps)

/// The options as a checkpoint stores them (with the app's own settings).
nlohmann::json settings_of(const train_options& o);
/// Writes `g`'s weights, `opt` and the run's settings and position to `path` (atomically).
void write_train_state(const std::filesystem::path& path, graph& g, const optimizer_state& opt,
                       const train_options& o, const run_position& pos);
/// The training state stored in `d` (read from `path`, which messages name); throws
/// `std::invalid_argument` where there is none or it is unreadable.
nlohmann::json read_state(const checkpoint::state_dict& d, const std::filesystem::path& path);
/// Loads the checkpoint's weights into `g` and returns its optimizer state and position.
/// Its weights and optimizer buffers must be finite unless the run allows otherwise.
std::pair<optimizer_state, run_position> read_train_state(const std::filesystem::path& path, graph& g,
                                                          bool allow_nonfinite);

}  // namespace nerve::layers::detail

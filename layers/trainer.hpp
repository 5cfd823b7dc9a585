#pragma once
/// \file
/// `train`: the training driver behind `nerve-train` — Fashion-MNIST (or any IDX pair),
/// a preset network run as actors, a loader actor that prepares the next batch while the
/// network trains on the current one, per-epoch evaluation, checkpoints.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "layers/graph.hpp"
#include "layers/network.hpp"
#include "layers/optimizer.hpp"

namespace nerve::layers {

/// Everything a training run is told.
struct train_options {
  std::string model = "mlp";
  int epochs = 1;
  std::int64_t steps = -1;          ///< stop after this many optimizer steps (-1: no limit)
  std::size_t batch = 256;
  std::size_t micro_batches = 1;
  std::string optimizer = "sgd";    ///< sgd, adam, adamw
  double lr = 0.1;
  double momentum = 0.0;
  bool nesterov = false;
  double weight_decay = 0.0;
  std::string schedule = "none";    ///< none, step (÷10 every third of the run), cosine
  unsigned threads = 1;             ///< event loops, and threads per matrix product
  bool spread = false;              ///< spread layers over the loops (else all on loop 0)
  std::uint64_t seed = 0;
  bool shuffle = true;
  std::filesystem::path data = "/usr/share/datasets/fashion-mnist";
  std::filesystem::path init;       ///< start from these weights (safetensors)
  std::filesystem::path save;       ///< write the weights here at the end (safetensors, atomic)
  std::filesystem::path trace;      ///< write the message trace here (Chrome trace JSON)
  bool trace_exact = false;         ///< time every handler run alone (recorder::timing::exact)
  bool evaluate = true;             ///< test accuracy after every epoch
};

/// Defaults that reach the accuracy targets for a preset (batch, lr, optimizer, ...),
/// applied before the user's explicit choices.
train_options preset_defaults(std::string_view model);

/// One epoch's figures.
struct epoch_stats {
  int epoch = 0;
  std::int64_t steps = 0;
  double train_loss = 0;
  double train_accuracy = 0;
  double test_loss = 0;
  double test_accuracy = 0;
  double seconds = 0;
  double samples_per_s = 0;
};

/// Progress inside an epoch, for a progress bar.
struct train_progress {
  int epoch = 0;
  std::size_t batch = 0, batches = 0;
  double loss = 0;  ///< running mean of this epoch so far
  double samples_per_s = 0;
};

struct train_report {
  std::vector<epoch_stats> epochs;
  std::int64_t parameters = 0;
  std::int64_t steps = 0;
};

/// Runs a training job. `on_progress` is called from the calling thread after each step;
/// `on_epoch` after each epoch. Throws on bad options, bad data files, and failures of the
/// run (a layer's exception, named).
train_report train(const train_options& options, const std::function<void(const train_progress&)>& on_progress = {},
                   const std::function<void(const epoch_stats&)>& on_epoch = {});

/// The optimizer `options` asks for, as a factory (one per layer actor).
optimizer_factory make_optimizer_factory(const train_options& options);

/// A graph's parameters and buffers as a PyTorch-named state dict, and back (strict: the
/// names must match exactly, shapes are checked).
void save_weights(graph& g, const std::filesystem::path& path, const std::string& model);
void load_weights(graph& g, const std::filesystem::path& path);

}  // namespace nerve::layers

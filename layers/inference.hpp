#pragma once
/// \file
/// Evaluation and prediction without training: a test set through a `train_engine` in
/// evaluation mode, on the same layer actors (and devices, stages, ranks) that train.
///
/// ```
///   weights (--init: weights or a checkpoint) ──► graph ──► engine (actors | device | stages)
///   test set ── chunks of evaluation_rows ──► evaluate ──► loss, accuracy
///                                        └──► predict  ──► confusion matrix, predictions CSV
/// ```
/// `evaluate_set` is the trainer's per-epoch evaluation itself, so the figures of
/// `evaluate` on saved weights are bitwise those of the run that saved them (same data,
/// engine and `threads`).

#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>

#include "layers/data/dataset.hpp"
#include "layers/shape.hpp"
#include "layers/trainer.hpp"

namespace nerve::layers {

/// A test set's loss and accuracy.
struct test_figures {
  double loss = 0;      ///< mean over the samples
  double accuracy = 0;  ///< `correct` over the labels: the samples, or every sample's tokens
  std::int64_t correct = 0, samples = 0;
};

/// Runs `set` through `engine.evaluate` in chunks of `evaluation_rows` rows, each sample of
/// shape `sample`: what `train` reports after every epoch. The trainer's thread.
test_figures evaluate_set(train_engine& engine, const data::dataset& set, const shape& sample);

/// Runs `set` through `engine.predict` in chunks of `evaluation_rows` rows and calls
/// `row(index, outputs)` for each sample in order. The trainer's thread.
void predict_set(train_engine& engine, const data::dataset& set, const shape& sample,
                 const std::function<void(std::size_t index, std::span<const float> outputs)>& row);

/// `predict_set` counted against `set`'s labels.
class_counts count_classes(train_engine& engine, const data::dataset& set, const shape& sample);

/// What `evaluate` found.
struct evaluation_report {
  test_figures test;
  class_counts classes;
  std::int64_t parameters = 0;
};

/// Loads `options.init` into `g` (weights or a checkpoint's weights; required), then runs
/// the test set of `options.data` through the engine `make_engine` makes (default: the one
/// `options.device` names): its loss, accuracy and class counts. With `predictions`, also
/// writes a CSV there (atomically): a header line, then per test sample its index, the
/// predicted class and the softmax of the outputs (`index,predicted,p0,p1,...`). Reads
/// `data`, `normalize`, `threads`, `spread`, `device`, `trace`, `trace_exact`,
/// `stall_timeout`, `allow_nonfinite` and `lead` of `options`; nothing is trained. Throws
/// as `train` does, and `std::invalid_argument` when `init` is empty or `predictions` names
/// no regular file.
evaluation_report evaluate(graph& g, const train_options& options, const std::filesystem::path& predictions = {},
                           engine_factory make_engine = {});

}  // namespace nerve::layers

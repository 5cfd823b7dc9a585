#pragma once
/// \file
/// The data a training run reads: the in-memory sets of `train_options`, else the `.npy`
/// pairs it names, else Fashion-MNIST under `train_options::data`; and the preset a run's
/// own data asks for (its sample shape and its classes).

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string_view>

#include "layers/data/dataset.hpp"
#include "layers/graph.hpp"
#include "layers/presets.hpp"
#include "layers/trainer.hpp"

namespace nerve::layers {

/// The training set of a run with `options`: `train_set`, else the `.npy` pair
/// `train_data` (labels checked against `classes`; 0: the largest label + 1), else
/// Fashion-MNIST's training split. Throws naming the file for what a loader refuses.
std::shared_ptr<const data::dataset> run_training_set(const train_options& options, std::size_t classes = 0);

/// The test set of a run with `options`: `test_set`, else `test_data` (labels checked
/// against `classes`), else Fashion-MNIST's test split.
std::shared_ptr<const data::dataset> run_test_set(const train_options& options, std::size_t classes = 0);

/// Loads `options.train_data` and `options.test_data` (where given and not loaded yet) into
/// `options.train_set` and `options.test_set`, the test labels checked against the training
/// set's classes, and checks `options.augment` against the samples: what an app does once,
/// before it builds the preset for the data (`preset_for`). Nothing for Fashion-MNIST.
void load_own_data(train_options& options);

/// What the preset of a run is built for: the shape of a sample of `options.train_set`
/// (else `test_set`) and its classes; none (the preset's own) without in-memory data.
std::optional<preset_shape> own_data_shape(const train_options& options);

/// The classes of the weights in `weights` (a `--save` file or a checkpoint) for preset
/// `model` on samples of `input`: the rows of its head's bias (the last layer with
/// parameters); none when the file has no such tensor. What `--evaluate` builds the preset
/// for, so that the test labels are checked against the model's classes.
std::optional<std::int64_t> classes_of_weights(const std::filesystem::path& weights, std::string_view model,
                                               const shape& input);

/// The preset `options.model` built for the run's data (`own_data_shape`) from `options.seed`.
graph make_preset_for(const train_options& options);

/// Throws `std::invalid_argument` when the test set's samples differ in shape from the
/// training set's, naming both (the files where the options give them).
void check_test_samples(const data::dataset& train, const data::dataset& test, const train_options& options);

/// The classes a graph's output tells apart (its output's values per sample).
std::size_t output_classes(const graph& g);

}  // namespace nerve::layers

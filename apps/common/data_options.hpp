#pragma once
/// \file
/// `--train-data`, `--test-data` and `--augment`: your own `.npy` data in place of
/// Fashion-MNIST, and augmentation of the training batches (docs/data.md), as nerve-train
/// and nerve-pipeline read them. Header-only.

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "layers/data/augment.hpp"
#include "layers/data/dataset.hpp"
#include "layers/data/text.hpp"
#include "layers/train_data.hpp"
#include "layers/trainer.hpp"

namespace nerve::apps {

/// The own-data options of nerve-train and nerve-pipeline, as given on the command line.
struct own_data_options {
  std::string train, test, augment;

  /// Declares `--train-data`, `--test-data` and `--augment` on `app`.
  void add_to(CLI::App& app) {
    app.add_option("--train-data", train,
                   "Train on your own data in place of Fashion-MNIST: INPUTS.npy,LABELS.npy as np.save writes them "
                   "(float32 or uint8 inputs of any shape [N, ...], integer labels [N]); the model's input shape "
                   "and classes come from the data");
    app.add_option("--test-data", test, "Evaluate on INPUTS.npy,LABELS.npy (with --train-data)");
    app.add_option("--augment", augment,
                   "Augment the training batches: crop=N (a random crop after zero padding by N) and flip (a random "
                   "horizontal flip), e.g. crop=4,flip; seeded by --seed, the epoch and the sample");
  }

  /// `INPUTS.npy,LABELS.npy` as given to `flag`: two names, each a file there is.
  static data::npy_files pair_of(const std::string& flag, const std::string& text) {
    const auto comma = text.find(',');
    const std::string inputs = text.substr(0, comma), labels = comma == std::string::npos ? "" : text.substr(comma + 1);
    if (comma == std::string::npos || inputs.empty() || labels.empty() || labels.find(',') != std::string::npos)
      throw std::invalid_argument(flag + " '" + text + "': give two files, INPUTS.npy,LABELS.npy");
    for (const auto& f : {inputs, labels}) {
      std::error_code ec;
      if (!std::filesystem::is_regular_file(f, ec))
        throw std::invalid_argument(flag + ": '" + f + "' " +
                                    (std::filesystem::exists(f, ec) ? "is not a regular file" : "does not exist"));
    }
    return {inputs, labels};
  }

  /// Puts them into `o` (a fresh run's options, or a resumed run's from its checkpoint) and
  /// checks them together with `--data`. A resumed run takes the data's files again (moved
  /// to another place) only where its checkpoint names own data; its augmentation is the
  /// checkpoint's (the caller refuses `--augment` beside `--resume`).
  void apply(const CLI::App& app, layers::train_options& o, bool resumed) const {
    const bool has_train = app.count("--train-data") > 0, has_test = app.count("--test-data") > 0;
    if (app.count("--data") > 0 && (has_train || has_test))
      throw std::invalid_argument(std::string("--data cannot be given with ") + (has_train ? "--train-data" : "--test-data") +
                                  ": --data names Fashion-MNIST's directory, --train-data and --test-data your own "
                                  ".npy files");
    if (has_test && !has_train && !(resumed && !o.train_data.empty()))
      throw std::invalid_argument("--test-data needs --train-data: the run would train on Fashion-MNIST and test on "
                                  "your data");
    if (resumed && (has_train || has_test) && o.train_data.empty())
      throw std::invalid_argument(std::string(has_train ? "--train-data" : "--test-data") +
                                  " cannot be given with --resume of a run on Fashion-MNIST: the run goes on with the "
                                  "data its checkpoint holds");
    if (has_train) o.train_data = pair_of("--train-data", train);
    if (has_test) o.test_data = pair_of("--test-data", test);
    if (!resumed && app.count("--augment") > 0) o.augment = data::parse_augment(augment);
  }

  /// Refuses `--train-data` and `--augment` beside `--evaluate` or `--predict` (`mode`):
  /// nothing is trained, so they would be ignored unseen.
  static void refuse_for_evaluation(const CLI::App& app, const std::string& mode) {
    for (const char* own : {"--train-data", "--augment"})
      if (app.count(own))
        throw std::invalid_argument(std::string(own) + " cannot be given with " + mode +
                                    ": nothing is trained (--test-data names the data to evaluate on)");
  }

  /// For `--evaluate` or `--predict`: with `--test-data`, loads the test set into `o` (its
  /// `model` and `init` set), the preset then built for its samples and for the classes of
  /// the `--init` weights; the test labels are checked against those classes as they load.
  void apply_for_evaluation(const CLI::App& app, layers::train_options& o) const {
    if (app.count("--test-data") == 0) return;
    if (app.count("--data"))
      throw std::invalid_argument("--data cannot be given with --test-data: --data names Fashion-MNIST's directory, "
                                  "--test-data your own .npy files");
    o.test_data = pair_of("--test-data", test);
    const auto peek = layers::run_test_set(o, 0);
    const layers::shape input(std::vector<std::int64_t>(peek->sample_shape.begin(), peek->sample_shape.end()));
    const auto classes = layers::classes_of_weights(o.init, o.model, input);
    o.test_set = classes && std::size_t(*classes) != peek->classes ? layers::run_test_set(o, std::size_t(*classes)) : peek;
  }

  /// The banner's line on a run's own data (`o` after `layers::load_own_data`): the
  /// training file, its samples, their shape and classes, and the augmentation; for
  /// Fashion-MNIST only the augmentation; empty when there is neither.
  static std::string banner_line(const layers::train_options& o) {
    if (o.train_set && o.train_set->labels_per_sample > 1 && o.train_data.empty()) {  // a text model's corpus
      const auto& t = *o.train_set;
      const auto dir = o.data == data::fashion_mnist_default_dir ? std::string(data::fortunes_default_dir) : o.data.string();
      return "data: " + dir + ", " + std::to_string(t.size()) + " windows of " + std::to_string(t.labels_per_sample) +
             " bytes for training, " + (o.test_set ? std::to_string(o.test_set->size()) : std::string("none")) +
             " for validation, a vocabulary of " + std::to_string(t.classes) + " bytes";
    }
    if (o.train_set) {
      const auto d = layers::own_data_shape(o);
      return "data: " + o.train_data.inputs.string() + ", " + std::to_string(o.train_set->size()) + " samples of " +
             d->input->to_string() + " in " + std::to_string(d->classes) + " classes" +
             (o.augment.any() ? ", augmented: " + data::augment_text(o.augment) : "");
    }
    return o.augment.any() ? "augmented: " + data::augment_text(o.augment) : "";
  }
};

}  // namespace nerve::apps

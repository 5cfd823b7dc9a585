#pragma once
/// \file
/// `--train-data`, `--test-data` and `--augment`: your own `.npy` data in place of
/// Fashion-MNIST, and augmentation of the training batches (docs/data.md). Header-only.

#include <filesystem>
#include <stdexcept>
#include <string>

#include <CLI/CLI.hpp>

#include "layers/data/augment.hpp"
#include "layers/data/dataset.hpp"
#include "layers/trainer.hpp"

namespace nerve::apps {

/// The own-data options of nerve-train, as given on the command line.
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
};

}  // namespace nerve::apps

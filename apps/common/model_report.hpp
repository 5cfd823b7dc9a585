#pragma once
/// \file
/// What nerve-train and nerve-pipeline share for `--summary`, `--evaluate` and `--predict`:
/// the refusal of training options that have no use without training, and the class
/// counts as JSON. Header-only; each app includes it once.

#include <initializer_list>
#include <stdexcept>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "layers/inference.hpp"
#include "layers/summary.hpp"
#include "layers/trainer.hpp"

namespace nerve::apps {

/// Refuses each of `options` given on `app` beside `mode` (`--evaluate`): nothing is
/// trained, so a training option would be ignored unseen.
inline void refuse_beside(CLI::App& app, const std::string& mode, std::initializer_list<const char*> options) {
  for (const char* opt : options)
    if (app.get_option_no_throw(opt) != nullptr && app.count(opt) > 0)
      throw std::invalid_argument(std::string(opt) + " cannot be given with " + mode +
                                  ": nothing is trained (it evaluates the --init weights)");
}

/// The training options `--evaluate` and `--predict` refuse (`refuse_beside`; an app skips
/// those it does not have, and nerve-pipeline's `--schedule` and `--microbatches`, which
/// shape its stages, are not among them).
inline constexpr std::initializer_list<const char*> training_only = {
    "--epochs", "--steps", "--batch", "--microbatches", "--lr", "--optimizer", "--momentum", "--nesterov",
    "--weight-decay", "--schedule", "--no-shuffle", "--save", "--checkpoint", "--checkpoint-every", "--resume",
    "--metrics", "--no-eval", "--early-stop", "--save-best", "--lr-find", "--lr-find-steps", "--lr-find-range"};

/// `{"accuracy": [per class], "samples": [per class], "confusion": [[true class][predicted]]}`.
/// What `--evaluate`, `--predict` and `--summary` ask for (both apps).
struct model_actions {
  bool evaluate = false, summary = false;
  std::string predict;
};

/// Adds `--evaluate`, `--predict` and `--summary` to `app`; `through` says where the
/// evaluation runs and `place` what the summary's place column is.
inline void add_model_actions(CLI::App& app, model_actions& a, const std::string& through, const std::string& place) {
  app.add_flag("--evaluate", a.evaluate,
               "Evaluate the --init weights on the test set" + through +
                   " (loss, accuracy; per class with --json) and exit: nothing is trained");
  app.add_option("--predict", a.predict,
                 "Write the test set's predictions to this CSV file (a header, then per sample: index, predicted "
                 "class, each class's probability) and exit; evaluates the --init weights as --evaluate does");
  app.add_flag("--summary", a.summary,
               "Print each layer's output shape, parameters, stash per micro-batch and " + place +
                   ", with the totals, and exit");
}

inline nlohmann::json classes_json(const layers::class_counts& c) {
  return {{"accuracy", c.accuracy()}, {"samples", c.samples()}, {"confusion", c.confusion}};
}

/// `--summary --json`: the nodes (name, kind, output, parameters, stash_bytes, place) and the totals.
/// The figures of an `--evaluate`/`--predict` run that both apps print under `--json`.
inline void add_evaluation_json(nlohmann::json& j, const layers::evaluation_report& e, const std::string& predict) {
  j["parameters"] = e.parameters;
  j["test_loss"] = e.test.loss;
  j["test_accuracy"] = e.test.accuracy;
  j["correct"] = e.test.correct;
  j["samples"] = e.test.samples;
  j["classes"] = classes_json(e.classes);
  if (!predict.empty()) j["predictions"] = predict;
}

inline nlohmann::json summary_json(const layers::model_summary& s) {
  nlohmann::json nodes = nlohmann::json::array();
  for (const auto& n : s.nodes) {
    std::vector<std::int64_t> dims(n.output.dims().begin(), n.output.dims().end());
    nodes.push_back({{"name", n.name}, {"kind", n.kind}, {"output", dims}, {"parameters", n.parameters},
                     {"stash_bytes", n.stash_bytes}, {"place", n.place}});
  }
  return {{"nodes", nodes},
          {"micro_batch", s.micro_batch},
          {"parameters", s.parameters},
          {"parameter_bytes", s.parameter_bytes()},
          {"stash_bytes", s.stash_bytes}};
}

/// `--evaluate`'s figures as a line: `test loss 0.4321  test acc 85.12% (8512 of 10000)`.
inline std::string test_line(double loss, double accuracy, std::int64_t correct, std::int64_t samples) {
  char b[128];
  std::snprintf(b, sizeof b, "test loss %.4f  test acc %6.2f%% (%lld of %lld)", loss, 100 * accuracy,
                static_cast<long long>(correct), static_cast<long long>(samples));
  return b;
}

}  // namespace nerve::apps

#pragma once
/// \file
/// `--early-stop`, `--save-best` and `--lr-find`: the training helpers of the one trainer
/// (`train_options::early_stop`, `save_best`, `lr_find`), declared once for the apps.
/// Their ranges are the trainer's (`check_options`); what is checked here is what the
/// command line alone can say. Header-only.

#include <algorithm>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "apps/common/options.hpp"
#include "layers/trainer.hpp"

namespace nerve::apps {

struct stopping_options {
  long long early_stop = 0;
  std::string save_best;
  bool lr_find = false;
  long long lr_find_steps = 100;
  std::vector<double> lr_find_range;

  /// Declares `--early-stop` and `--save-best`, and with `range_test` `--lr-find`,
  /// `--lr-find-steps` and `--lr-find-range`.
  void add_to(CLI::App& app, bool range_test) {
    add_whole(app, "--early-stop", early_stop,
              "Stop when the test loss has not improved for PATIENCE evaluations in a row (the figure: the test "
              "loss after each epoch); --save is still written")
        ->type_name("PATIENCE");
    app.add_option("--save-best", save_best,
                   "After each evaluation that is the best so far (lowest test loss), write its weights here "
                   "(safetensors, like --save)");
    if (!range_test) return;
    app.add_flag("--lr-find", lr_find,
                 "Learning-rate range test instead of training: the rate rises geometrically over --lr-find-steps "
                 "steps through --lr-find-range, stopping when the loss passes 4x its lowest; prints rate and loss "
                 "and suggests a tenth of the rate at the lowest loss (--metrics: a step line each)");
    add_whole(app, "--lr-find-steps", lr_find_steps, "Steps of the --lr-find range test (default 100)");
    app.add_option("--lr-find-range", lr_find_range, "Lowest and highest rate of --lr-find (default 1e-7,10)")
        ->delimiter(',')
        ->expected(2)
        ->type_name("MIN,MAX");
  }

  /// Puts them into `o`; refuses the range test's own options without `--lr-find`.
  void apply(const CLI::App& app, layers::train_options& o) const {
    if (app.count("--early-stop")) {
      if (early_stop < 1)
        throw std::invalid_argument("--early-stop must be at least 1 evaluation without improvement (got " +
                                    std::to_string(early_stop) + ")");
      o.early_stop = int(std::min<long long>(early_stop, std::numeric_limits<int>::max()));
    }
    o.save_best = save_best;
    if (!lr_find) {
      for (const char* opt : {"--lr-find-steps", "--lr-find-range"})
        if (app.get_option_no_throw(opt) && app.count(opt))
          throw std::invalid_argument(std::string(opt) + " is an option of --lr-find, which was not given");
      return;
    }
    layers::lr_range r;
    r.steps = lr_find_steps;
    if (lr_find_range.size() == 2) {
      r.min_lr = lr_find_range[0];
      r.max_lr = lr_find_range[1];
    }
    o.lr_find = r;
    o.evaluate = false;  // a range test trains only: its epochs have no test figures to show
  }
};

/// `--lr-find`'s table: a line per step (rate, loss), then the suggested rate.
inline void print_lr_find(const layers::lr_find_result& f) {
  std::printf("%14s  %12s\n", "lr", "loss");
  for (const auto& p : f.points) std::printf("%14.6g  %12.6g\n", p.lr, p.loss);
  if (f.diverged)
    std::printf("stopped at lr %g: the loss diverged\n", f.points.empty() ? 0.0 : f.points.back().lr);
  if (f.suggested_lr > 0)
    std::printf("suggested lr %g: a tenth of the rate at the lowest loss (%g)\n", f.suggested_lr, f.min_loss_lr);
  else
    std::printf("no rate to suggest: no step had a finite loss\n");
}

}  // namespace nerve::apps

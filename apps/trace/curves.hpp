#pragma once
/// \file
/// `nerve-trace curves`: the training curves a run wrote with `--metrics` (JSON lines,
/// docs/trace.md "Training curves"), read and checked line by line, and drawn as one
/// self-contained HTML page (inline SVG drawn by an inline script, nothing loaded).

#include "apps/trace/diagnostic.hpp"

#include <cstdint>
#include <filesystem>
#include <istream>
#include <ostream>
#include <string>
#include <vector>

namespace nerve::trace {

/// Lines longer than this are refused: the trainer writes a few hundred bytes a line.
inline constexpr std::size_t max_metrics_line = 1 << 20;
/// Nesting deeper than this is refused (a run line nests three levels).
inline constexpr int max_metrics_depth = 64;

/// One `run` line: a run of the trainer started (or resumed) here.
struct curves_run {
  std::int64_t line = 0;
  std::string time;          ///< as written (UTC), or empty
  std::string description;   ///< model, optimizer, lr, schedule, batch, device, from `settings`
  std::int64_t resume_step = -1;  ///< a resumed run replays from this step (-1: a fresh run)
  std::int64_t resume_epoch = -1;
  bool lr_find = false;  ///< a learning-rate range test (`lr_find` in the run line): loss against rate is drawn
};

/// One `step` line. Non-finite figures (written as null) are NaN.
struct curves_step {
  std::int64_t step = 0;  ///< 0-based, as the trainer and the schedule count
  std::int64_t epoch = 0;
  double loss = 0, accuracy = 0, lr = 0, samples_per_s = 0;
};

/// One `epoch` line. Figures written as null (not evaluated, not finite) are NaN.
struct curves_epoch {
  std::int64_t epoch = 0;
  std::int64_t step = 0;  ///< steps done when the epoch ended
  double train_loss = 0, train_accuracy = 0, test_loss = 0, test_accuracy = 0, seconds = 0;
  bool interrupted = false;
};

/// What a metrics file holds, as drawn: per step and per epoch the latest record (a
/// resumed run's `run` line drops the earlier records of the steps and epochs it
/// replays), sorted.
struct training_curves {
  std::vector<curves_run> runs;
  std::vector<curves_step> steps;
  std::vector<curves_epoch> epochs;
  std::size_t superseded = 0;  ///< records replaced by a later run's
};

/// Reads metrics lines from `in` (`name` names it in diagnostics). Every problem is a
/// diagnostic naming the line: not JSON, not an object, a missing or mistyped field, a
/// number out of range; an unknown `kind` is a warning (and skipped), and so is a torn
/// line: the start of a record cut short while it was written (a full disk, a crash),
/// alone or with the next record written straight after it (which is read). Never throws
/// on bad input.
training_curves read_metrics(std::istream& in, const std::string& name, diagnostics& diags);
/// Reads the file at `path`; a file that cannot be read is a diagnostic too.
training_curves read_metrics_file(const std::filesystem::path& path, diagnostics& diags);

/// What went into the page.
struct curves_stats {
  std::size_t steps = 0, epochs = 0, runs = 0, bytes = 0;
};

/// Writes the page drawing `curves` to `out`.
curves_stats write_curves_page(const training_curves& curves, const std::string& title, std::ostream& out);

namespace detail {
/// The page template (apps/trace/curves.html), compiled in.
std::string_view curves_page();
}  // namespace detail

}  // namespace nerve::trace

#pragma once
/// \file
/// What nerve-train and nerve-pipeline share around the one trainer: the options that
/// save and resume a run, `--normalize`, the progress bar and the Ctrl-C / SIGTERM handling.
/// Header-only; each app includes it once.

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>

#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "apps/common/options.hpp"
#include "layers/trainer.hpp"

namespace nerve::apps {

/// Declares `--normalize MEAN,STD` on `app` into `values` (two numbers, or none given).
inline void add_normalize(CLI::App& app, std::vector<double>& values) {
  app.add_option("--normalize", values,
                 "Inputs as (x - MEAN) / STD after scaling to [0, 1], train and test sets alike (torchvision's "
                 "Normalize; Fashion-MNIST's own: 0.2860,0.3530); default: [0, 1] only")
      ->delimiter(',')
      ->expected(2)
      ->type_name("MEAN,STD")
      ->transform(real_in(-1000, 1000));  // STD above 0: check_options
}

/// Declares `--stall-timeout SECONDS` on `app` into `seconds` (range: check_options).
inline void add_stall_timeout(CLI::App& app, double& seconds) {
  app.add_option("--stall-timeout", seconds,
                 "End the run with a report of who waits on whom when a step handles no message for this many "
                 "seconds (0: never)")
      ->capture_default_str();
}

/// The normalisation `--normalize` asked for (none when it was not given).
inline std::optional<data::normalization> normalization_of(const std::vector<double>& values) {
  if (values.size() != 2) return std::nullopt;
  return data::normalization{float(values[0]), float(values[1])};
}

/// The options of a run's state: checkpoints, resume, the training curves.
struct run_state_options {
  std::string checkpoint, resume, metrics;
  long long checkpoint_every = 0;

  /// Declares `--checkpoint`, `--checkpoint-every`, `--resume` and `--metrics` on `app`.
  void add_to(CLI::App& app) {
    app.add_option("--checkpoint", checkpoint,
                   "Write the full training state (weights, optimizer, position, settings) here, atomically, after "
                   "every epoch and every --checkpoint-every steps");
    add_whole(app, "--checkpoint-every", checkpoint_every, "Steps between checkpoints (0: after every epoch only)");
    app.add_option("--resume", resume,
                   "Continue the run saved in this checkpoint with its settings (--save, --trace, --metrics, "
                   "--checkpoint and --json may be given again, --data and --threads for another machine, and "
                   "--epochs and --steps above the checkpoint's to extend the run; --metrics appends to the file)");
    app.add_option("--metrics", metrics,
                   "Write the training curves here as JSON lines (a line per step and per epoch, as the run goes; "
                   "draw them with nerve-trace curves); --resume appends");
  }
  /// Puts them into `o`: a resumed run keeps its checkpoint's path and period unless given.
  void apply(const CLI::App& app, layers::train_options& o) const {
    if (checkpoint_every < 0) throw std::invalid_argument("--checkpoint-every must be 0 or more steps");
    if (resume.empty() || !checkpoint.empty()) o.checkpoint = checkpoint;
    if (resume.empty() || app.count("--checkpoint-every") > 0) o.checkpoint_every = checkpoint_every;
    o.metrics = metrics;
  }
};

/// A progress bar on stderr: redrawn in place on a terminal, a line per quarter otherwise.
class progress_bar {
 public:
  explicit progress_bar(bool quiet) : quiet_(quiet), tty_(isatty(STDERR_FILENO) != 0) {}
  void operator()(const layers::train_progress& p) {
    if (quiet_) return;
    const int pct = static_cast<int>(100.0 * double(p.batch) / double(p.batches));
    if (tty_) {
      if (pct == last_ && p.batch != p.batches) return;
      const int width = 30, fill = pct * width / 100;
      std::fprintf(stderr, "\repoch %d [%.*s%*s] %3d%%  loss %.4f  %.0f samples/s ", p.epoch, fill,
                   "==============================", width - fill, "", pct, p.loss, p.samples_per_s);
      if (p.batch == p.batches) std::fprintf(stderr, "\r%*s\r", 90, "");
    } else if (pct / 25 != last_ / 25 || p.batch == 1) {
      std::fprintf(stderr, "epoch %d: %3d%% (%zu/%zu batches), loss %.4f, %.0f samples/s\n", p.epoch, pct, p.batch,
                   p.batches, p.loss, p.samples_per_s);
    }
    last_ = pct;
    if (p.batch == p.batches) last_ = -1;
  }

 private:
  bool quiet_, tty_;
  int last_ = -1;
};

// Ctrl-C or SIGTERM: the trainer stops before its next step, finishes the engine, writes
// the trace and the figures so far (marked interrupted), and the app exits 128 + signal.
// A second signal ends the process at once (SA_RESETHAND).
inline std::atomic<bool> stop_requested{false};
inline volatile std::sig_atomic_t stop_signal = 0;
static_assert(std::atomic<bool>::is_always_lock_free, "the signal handler needs a lock-free flag");

/// In a multi-rank job, the rank whose signal stopped the run (the lowest one, when several
/// asked); -1 in one process. Set on the trainer's thread when the ranks agree to stop
/// (`pipeline_engine::agree_stop`), which also sets `stop_signal` on the ranks that got none.
inline int stop_rank = -1;

/// What stopped the run, for the app's last line: `SIGTERM`, or `SIGTERM to rank 1` in a
/// multi-rank job.
inline std::string stop_cause() {
  std::string cause = stop_signal == SIGTERM ? "SIGTERM" : "SIGINT";
  if (stop_rank >= 0) cause += " to rank " + std::to_string(stop_rank);
  return cause;
}

extern "C" inline void on_stop_signal(int sig) {
  stop_signal = sig;
  stop_requested.store(true);
}

inline void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sa.sa_flags = SA_RESTART | SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

}  // namespace nerve::apps

#pragma once
/// \file
/// What nerve-train and nerve-pipeline share around the one trainer: the progress bar and
/// the Ctrl-C / SIGTERM handling. Header-only; each app includes it once.

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>

#include "layers/trainer.hpp"

namespace nerve::apps {

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

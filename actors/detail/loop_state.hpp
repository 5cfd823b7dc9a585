#pragma once
/// \file
/// Per-loop state shared by the runtime and the actors on that loop.

#include <atomic>
#include <cstdint>
#include <thread>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

#include "actors/detail/mpsc_queue.hpp"

namespace nerve::actors {
class runtime;
class recorder;
struct type_tag;
}

namespace nerve::actors::detail {
struct recorder_chunk_cursor;

/// A sequentially consistent full fence. ThreadSanitizer does not model
/// `atomic_thread_fence`, so under TSan the same ordering comes from a seq_cst
/// read-modify-write on one shared atomic (slower, but TSan then sees it).
inline void full_fence() noexcept {
#if defined(__SANITIZE_THREAD__)
  static std::atomic<int> fence_word{0};
  fence_word.fetch_add(0, std::memory_order_seq_cst);
#else
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
}

struct loop_state;
/// The loop the calling thread runs, or nullptr on a thread outside every runtime.
/// Set while a worker thread runs its loop and while a manual-mode runtime is stepped.
inline thread_local loop_state* current_loop = nullptr;

/// One event loop: an io_context run by one thread (or stepped by hand in manual mode).
///
/// Actors with messages to handle wait in `ready`, a lock-free MPSC queue the loop thread
/// drains between io_context handlers (timers, posted closures). Scheduling an actor is a
/// push plus, only when the loop thread is asleep in the io_context, one post to wake it:
/// no mutex and no system call while the loop is busy or spinning.
/// `sent` and `handled` are written only by this loop's thread and read by
/// `runtime::synchronize()` (Mattern's counting: quiescent when the sum of handled,
/// read first, equals the sum of sent, read after).
struct loop_state {
  explicit loop_state(runtime* r, unsigned i) : rt(r), index(i), io(1) {}
  runtime* rt;
  unsigned index;
  boost::asio::io_context io;
  std::thread thread;
  alignas(64) std::atomic<std::uint64_t> sent{0};
  std::atomic<std::uint64_t> handled{0};
  alignas(64) mpsc_queue ready;           ///< actors to drain; pushed from any thread
  alignas(64) std::atomic<bool> sleeping{false};  ///< the loop thread blocks (or is about to) in io.run_one()
  /// Written by this loop's thread when it changes: true while the loop found nothing to run
  /// (spinning or asleep). Read by migration's balance decisions (rare).
  alignas(64) std::atomic<bool> idle{false};
  /// Moves decided on this loop (placement::automatic), by reason; written by this loop's thread.
  std::atomic<std::uint64_t> moved_for_affinity{0};
  std::atomic<std::uint64_t> moved_to_balance{0};
  /// The heavy mobile actors living here: the sum of their run times per message (ns), which
  /// migration's balance decisions compare across loops. Added to by each such actor at its
  /// decisions, moved with it, taken off when it stops; any thread (read-modify-writes, rare).
  std::atomic<std::uint64_t> heavy_ns{0};
  // -- loop thread only
  bool idle_seen = false;                 ///< `idle` as this loop's thread last stored it
  alignas(64) std::uint32_t running = 0;  ///< the actor whose drain runs now (0: none)
  bool running_heavy = false;             ///< that actor is heavy (migration): what it sends pulls nobody
  /// Recording: how the drain running now times its handler runs (actor.cpp, invoke).
  /// Sends from the running handler read their stamp here (recorder.hpp, "Send times"):
  /// `mark` and `shared` are its run's start, or its group's start and its place in it.
  struct run_clock {
    std::int64_t mark = 0;         ///< this drain's last clock read, or the running timed run's start (0: none)
    std::uint32_t shared = 0;      ///< runs since `mark` that wait for the next read (a group)
    std::uint32_t exact = 0;       ///< runs left to time one by one (after a group that took long)
    /// What a short run takes on this loop (ticks; 0: not measured yet): the mean of the
    /// short runs in the last batch timed one by one, less 1/64 for each group since. A
    /// group is long when its span, less this for each of its other runs, is
    /// (actor::close_group).
    std::int64_t short_run = 0;
    std::int64_t batch_ticks = 0;  ///< the short runs timed one by one since `exact` was last set: their sum
    std::uint32_t batch_runs = 0;  ///< and their number
    const type_tag* last_tag = nullptr;  ///< the type of the group's last run
    std::uint32_t taken = 0;       ///< the drain's normal-lane count at the group's last run
    recorder_chunk_cursor* cursor = nullptr;  ///< while `mark` is set: the drain's thread's cursor (recorder::cursor)
    bool stamps = false;           ///< sends take `mark` (and `shared`) as their time, not a clock read (set only while `mark` is)
  } clock;

  loop_state(const loop_state&) = delete;
  loop_state& operator=(const loop_state&) = delete;

  /// Any thread: queues `l` to run on this loop and wakes the loop if it sleeps.
  void schedule(ready_link* l) {
    ready.push(l);
    if (current_loop == this) return;  // the loop thread itself is awake
    full_fence();  // pairs with the fence in the loop's sleep path
    if (sleeping.load(std::memory_order_relaxed) && sleeping.exchange(false, std::memory_order_acq_rel)) {
      try {
        boost::asio::post(io, [] {});  // run_one() returns; the loop goes back to `ready`
      } catch (...) {
        // No memory for the wake-up (std::bad_alloc): the loop still sleeps, and says so,
        // so the next schedule (or a shutdown's stop) wakes it.
        sleeping.store(true, std::memory_order_relaxed);
        throw;
      }
    }
  }

  /// Loop thread: runs up to `max` ready entries; returns how many ran.
  std::size_t run_ready(std::size_t max) {
    std::size_t n = 0;
    while (n < max) {
      auto* node = ready.pop();
      if (!node) break;
      if (idle_seen) [[unlikely]] {  // busy from now on, before the first drain (which may be long)
        idle_seen = false;
        idle.store(false, std::memory_order_relaxed);
      }
      auto* l = static_cast<ready_link*>(node);
      l->run(l->owner);
      ++n;
    }
    return n;
  }
  /// Single-writer increments: no read-modify-write needed.
  void count_sent(std::uint64_t n = 1) noexcept {
    sent.store(sent.load(std::memory_order_relaxed) + n, std::memory_order_release);
  }
  void count_handled(std::uint64_t n = 1) noexcept {
    handled.store(handled.load(std::memory_order_relaxed) + n, std::memory_order_release);
  }
};


}  // namespace nerve::actors::detail

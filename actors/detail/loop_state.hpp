#pragma once
/// \file
/// Per-loop state shared by the runtime and the actors on that loop.

#include <atomic>
#include <cstdint>
#include <thread>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

namespace nerve::actors {
class runtime;
class recorder;
}

namespace nerve::actors::detail {

/// One event loop: an io_context run by one thread (or stepped by hand in manual mode).
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
  std::atomic<std::uint64_t> actors{0};  ///< placed here, for placement policies

  /// Single-writer increments: no read-modify-write needed.
  void count_sent(std::uint64_t n = 1) noexcept {
    sent.store(sent.load(std::memory_order_relaxed) + n, std::memory_order_release);
  }
  void count_handled(std::uint64_t n = 1) noexcept {
    handled.store(handled.load(std::memory_order_relaxed) + n, std::memory_order_release);
  }
};

/// The loop the calling thread runs, or nullptr on a thread outside every runtime.
/// Set while a worker thread runs its loop and while a manual-mode runtime is stepped.
inline thread_local loop_state* current_loop = nullptr;

}  // namespace nerve::actors::detail

#pragma once
/// \file
/// `loop_thread`: an event loop (one `io_context`) on a thread of its own, for GPU work
/// driven from outside an actor runtime: the GPU benchmarks and tests.
/// Completions of `stream::async_wait` need a loop to run on; inside a runtime that is
/// the owning actor's loop, here it is this one.
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include <optional>
#include <thread>

namespace nerve::gpu {

class loop_thread {
 public:
  loop_thread() : thread_([this] { ctx_.run(); }) {}
  ~loop_thread() { stop(); }
  loop_thread(const loop_thread&) = delete;
  loop_thread& operator=(const loop_thread&) = delete;

  /// Lets the loop run out of work, then joins it (what is posted before still runs).
  void stop() {
    guard_.reset();
    if (thread_.joinable()) thread_.join();
  }
  boost::asio::io_context::executor_type executor() noexcept { return ctx_.get_executor(); }
  /// True on the loop's own thread.
  bool running_here() noexcept { return ctx_.get_executor().running_in_this_thread(); }

 private:
  boost::asio::io_context ctx_;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> guard_{
      ctx_.get_executor()};
  std::thread thread_;
};

}  // namespace nerve::gpu

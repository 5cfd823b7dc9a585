#pragma once
// Event loops for the gpu tests: an io_context per thread, as the runtime has.
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include <atomic>
#include <optional>
#include <thread>

namespace nerve::gpu::test {

/// One io_context run by one thread until `stop()` (or destruction).
class loop_thread {
 public:
  loop_thread() : guard_(ctx_.get_executor()), thread_([this] {
    thread_id_.store(std::this_thread::get_id());
    ctx_.run();
  }) {}
  ~loop_thread() { stop(); }
  void stop() {
    guard_.reset();
    if (thread_.joinable()) thread_.join();
  }
  boost::asio::any_io_executor executor() { return ctx_.get_executor(); }
  bool running_here() { return ctx_.get_executor().running_in_this_thread(); }

 private:
  boost::asio::io_context ctx_;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> guard_;
  std::atomic<std::thread::id> thread_id_{};
  std::thread thread_;
};

}  // namespace nerve::gpu::test

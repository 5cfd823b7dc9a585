#pragma once
/// \file
/// The completion machinery behind `stream::async_wait`: waiters, and the two
/// queues (the per-device poller and the per-stream blocking waiters).

#include "gpu/completion.hpp"
#include "gpu/detail/backend.hpp"

#include <boost/asio/any_io_executor.hpp>

#include <cstdint>
#include <memory>
#include <system_error>

namespace nerve::actors {
class recorder;
}

namespace nerve::gpu::detail {

/// Calls `work_counter::end` once, when reset or destroyed, unless empty. The counter is
/// the device_core's, which outlives every waiter.
struct end_work {
  void operator()(const work_counter* c) const noexcept { c->end(); }
};
using work_token = std::unique_ptr<const work_counter, end_work>;

/// What the recorder needs of a traced wait (`rec` null: not traced).
struct wait_trace {
  actors::recorder* rec = nullptr;
  const char* name = "gpu";
  std::int64_t start_ns = 0;          ///< the span's start (recorder clock)
  std::int64_t mb = -1;
  std::uint64_t flow_in = 0;          ///< enqueuing handler -> span
  std::uint32_t stream_track = 0;     ///< the span's track
  std::uint32_t completion_track = 0; ///< where the completion handler's run is drawn
  std::int32_t stream = -1, device = -1;
};

/// One registered wait: which event, where to post, what to call.
struct waiter {
  std::shared_ptr<stream_impl> stream;
  std::shared_ptr<event_impl> event;
  boost::asio::any_io_executor executor;
  completion_handler handler;
  work_token token;
  wait_trace trace;
};

/// Posts `handler(ec)` onto the waiter's executor, dropping the event and stream first.
void deliver(waiter&& w, std::error_code ec);

/// Where waiters go. Thread-safe.
class completion_queue {
 public:
  virtual ~completion_queue() = default;
  /// Takes a waiter; after `shutdown` it is cancelled at once.
  virtual void submit(waiter&& w) = 0;
  /// Cancels every pending waiter and joins the thread(s). Idempotent.
  virtual void shutdown() noexcept = 0;
  /// A backend's hint that an event may have completed (the stand-in calls it).
  virtual void wake() noexcept {}
};

std::unique_ptr<completion_queue> make_poller(backend& b, const poller_options& o);
std::unique_ptr<completion_queue> make_blocking_waiter(backend& b);

}  // namespace nerve::gpu::detail

#pragma once
/// \file
/// How GPU completions come back to event loops: the handler type, the two
/// waiting strategies, the poller's back-off and the work-counter hook.
///
/// ```
///  actor's loop            stream (GPU or stand-in)        completion poller thread
///  ------------            ------------------------        ------------------------
///  enqueue kernels  ---->  [k1][k2][k3]
///  async_wait(ex, h) ---->            [event] ---->  per-stream FIFO of waiters
///                                                    query front event (spin, yield,
///                                                    sleep on a condvar when idle)
///  h(error_code) <---- boost::asio::post(ex, ...) <-- event complete (or failed)
/// ```
///
/// Lifetime: an executor handed to `async_wait` must stay valid (its io_context
/// alive) until `device::shutdown` has returned: a completion thread may still be
/// inside `post()` (Asio signals the loop after queueing) just after the handler
/// ran. Shut devices down before destroying their loops.

#include "gpu/detail/unique_function.hpp"

#include <chrono>
#include <functional>
#include <system_error>

namespace nerve::gpu {

/// A completion handler: called once, on the executor it was registered with,
/// with an empty code on success, the CUDA (or stand-in) error, or `errc::cancelled`.
using completion_handler = detail::unique_function<void(std::error_code)>;

/// How a device waits for the events it was handed.
enum class wait_mode {
  poller,    ///< one thread per device queries events in FIFO order per stream (default)
  blocking,  ///< one thread per stream blocks in the backend's event synchronize
};

/// Back-off of the poller thread while some waits are pending and none is ready:
/// spin for `spin`, then `std::this_thread::yield()` until `yield` has passed since
/// the last progress, then sleep `sleep` at a time (woken at once by new waits).
/// With nothing pending the poller sleeps on a condition variable: no busy loop.
struct poller_options {
  std::chrono::microseconds spin{20};
  std::chrono::microseconds yield{2000};
  std::chrono::microseconds sleep{50};
};

/// Optional hook so a runtime's `synchronize()` can count GPU completions in flight.
/// `begin` runs on the registering thread when a wait is registered; `end` runs
/// exactly once per `begin`, after the handler has returned (on the executor's
/// thread), or when the posted handler is destroyed without running (its
/// io_context destroyed). Both must be thread-safe and must not throw.
struct work_counter {
  std::function<void()> begin;
  std::function<void()> end;
};

}  // namespace nerve::gpu

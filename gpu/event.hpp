#pragma once
/// \file
/// A pooled, timing-free event: a point in a stream's work. Recording one is
/// cheap (`stream::record`); when the last handle goes, the event returns to its
/// device's pool. Events travel with device-resident data between actors: the
/// receiver calls `stream::wait(event)` and goes on without a host sync.

#include <memory>
#include <system_error>

namespace nerve::gpu {

namespace detail {
class event_impl;
class backend;
}  // namespace detail

/// A shared handle on a recorded event. Copyable; thread-safe to query from any thread.
class event {
 public:
  event() = default;

  /// True once recorded (a default-constructed event is not).
  bool valid() const noexcept { return static_cast<bool>(impl_); }
  /// Non-blocking: has the work before the event completed (or failed)?
  bool ready() const;
  /// Non-blocking: the error of the work before the event, empty while pending or on success.
  std::error_code status() const;
  /// Blocks the calling thread until the event completes; throws `gpu::error` if the
  /// work failed. Never call it on an event loop: use `stream::async_wait`.
  void wait() const;

  detail::event_impl& impl() const noexcept { return *impl_; }

 private:
  friend class stream;
  event(std::shared_ptr<detail::event_impl> impl, detail::backend* b) : impl_(std::move(impl)), backend_(b) {}
  std::shared_ptr<detail::event_impl> impl_;  // returns to the pool, keeps the device alive
  detail::backend* backend_ = nullptr;
};

}  // namespace nerve::gpu

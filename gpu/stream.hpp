#pragma once
/// \file
/// A stream: an ordered queue of device work (a CUDA stream, or a worker thread
/// running host functions in order on the stand-in). An actor owns one and is
/// told on its own loop when the work it enqueued has completed:
///
/// ```
/// gpu::gemm(s, ...); gpu::bias_add(s, ...);
/// s.async_wait(loop_executor, [](std::error_code ec) { /* on the actor's loop */ });
/// ```

#include "gpu/completion.hpp"
#include "gpu/event.hpp"

#include <boost/asio/any_io_executor.hpp>

#include <cstdint>
#include <memory>

namespace nerve::gpu {

namespace detail {
class stream_impl;
}

/// How a traced wait shows in the trace (when its device records, see
/// `device_options::recorder`): a span on the stream's track named `name`, from
/// `start_ns` (the recorder's clock, `recorder::now()` read before the work was enqueued;
/// -1: the wait itself) to the completion, with `mb` as its micro-batch.
struct span_label {
  const char* name = "gpu";  ///< a static string
  std::int64_t start_ns = -1;
  std::int64_t mb = -1;
};

/// The trace track of stream `id` of device `ordinal`: 1000000 + 1000·ordinal + id.
/// Track 1000000 + 1000·ordinal itself holds the completions of work enqueued from
/// outside any actor.
constexpr std::uint32_t stream_track(int ordinal, std::uint64_t id) noexcept {
  return 1000000u + 1000u * static_cast<std::uint32_t>(ordinal) + static_cast<std::uint32_t>(id);
}

/// A shared handle on a stream. Copyable. Enqueueing calls (record, wait, the
/// kernels, gemm, copies) may come from any thread but from one at a time per
/// stream: a stream belongs to one actor's loop. `async_wait` is thread-safe.
class stream {
 public:
  stream() = default;

  bool valid() const noexcept { return static_cast<bool>(impl_); }
  /// Unique among the streams of its device; the key of its FIFO of waiters.
  std::uint64_t id() const noexcept;

  /// Records a pooled event after the work enqueued so far.
  event record();
  /// Later work on this stream waits for `e` on the device (no host blocking);
  /// `e` must belong to the same device.
  void wait(const event& e);

  /// Records an event and, when it completes, posts `handler(error_code)` onto
  /// `executor`. Handlers of one stream run in the order they were registered.
  /// After `device::shutdown` the handler gets `errc::cancelled`. `label`: the wait in the trace.
  void async_wait(const boost::asio::any_io_executor& executor, completion_handler handler,
                  const span_label& label = {});

  /// Blocks until all enqueued work is done; throws `gpu::error` on failure.
  /// Setup, tests and shutdown only: never on an event loop.
  void synchronize();

  /// Runs `fn` on a host thread once the work before it is done; later work waits
  /// for it (`cudaLaunchHostFunc` on a GPU). `fn` must not call nerve::gpu.
  void enqueue_host(detail::unique_function<void()> fn);

  /// The backend's handle (`cudaStream_t` on CUDA, for NCCL), null on the stand-in.
  void* native_handle() const noexcept;

  detail::stream_impl& impl() const noexcept { return *impl_; }
  const std::shared_ptr<detail::stream_impl>& shared_impl() const noexcept { return impl_; }

 private:
  friend class device;
  explicit stream(std::shared_ptr<detail::stream_impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<detail::stream_impl> impl_;
};

}  // namespace nerve::gpu

#pragma once
/// \file
/// A device: one GPU (or the CPU stand-in), its event pool, its stream-ordered
/// memory pool and its completion thread(s).

#include "gpu/completion.hpp"
#include "gpu/stream.hpp"

#include <cstddef>
#include <memory>
#include <string>

namespace nerve::actors {
class recorder;
}

namespace nerve::gpu {

namespace detail {
class device_core;
}

/// Which implementation runs the work.
enum class backend_kind {
  automatic,  ///< CUDA when built with CUDA and a device is visible, else the stand-in
  cuda,       ///< a CUDA device; throws `errc::no_device` when there is none
  standin,    ///< the CPU stand-in: a worker thread per stream, host memory, plain loops
};

/// How a device is opened.
struct device_options {
  backend_kind backend = backend_kind::automatic;
  int ordinal = 0;                  ///< which CUDA device
  wait_mode waits = wait_mode::poller;
  poller_options poller;
  work_counter counter;             ///< optional; both callbacks or neither
  /// Optional; must outlive the device. While it is enabled, every wait on a stream of
  /// this device is recorded: a `gpu` span on the stream's track (`stream_track`) from
  /// the enqueue to the completion the poller observed, an arrow from the enqueuing
  /// handler to it and one from it to the completion handler's run (docs/trace.md).
  actors::recorder* recorder = nullptr;
};

/// How a stream is created.
struct stream_options {
  bool tf32 = false;                            ///< cuBLAS TF32 tensor-op math (off: exact fp32)
  std::size_t blas_workspace_bytes = 32u << 20; ///< cuBLAS workspace of this stream's handle
};

/// Owns a device. Not copyable; streams, events and buffers keep what they need
/// alive after it is gone. Construct and destroy it off the event loops.
class device {
 public:
  /// Opens a device; throws `gpu::error` (`errc::no_device`, or the CUDA error).
  explicit device(const device_options& options = {});
  /// Shuts down (see `shutdown`).
  ~device();
  device(const device&) = delete;
  device& operator=(const device&) = delete;

  /// CUDA devices visible to this process: 0 without CUDA or when none can be
  /// opened. Never throws. Any thread.
  static int cuda_device_count() noexcept;

  backend_kind kind() const noexcept;
  /// The device's name, e.g. "NVIDIA H100 80GB HBM3" or "cpu stand-in".
  std::string name() const;
  int ordinal() const noexcept;

  /// Creates a stream (a CUDA non-blocking stream with its own cuBLAS handle and
  /// workspace). Setup time: it allocates.
  stream create_stream(const stream_options& options = {});

  /// Stops the completion thread(s): every wait still pending gets
  /// `errc::cancelled`, posted to its executor; later waits are cancelled at once.
  /// Returns without waiting for the device's work. Idempotent; any thread but a
  /// handler of this device's completions.
  void shutdown() noexcept;

  detail::device_core& core() const noexcept { return *core_; }

 private:
  std::shared_ptr<detail::device_core> core_;
};

}  // namespace nerve::gpu

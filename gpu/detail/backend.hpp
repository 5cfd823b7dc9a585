#pragma once
/// \file
/// The small table of functions every backend fills (ggml style): streams,
/// events, memory, copies, matrix products and kernels. Internal to nerve::gpu;
/// the public types (device, stream, event, device_buffer) are thin handles on it.
/// `backend_select.cpp` is the one place that picks an implementation; the CUDA
/// one lives in a module it opens on demand (cuda_module.hpp).

#include "gpu/blas.hpp"
#include "gpu/detail/unique_function.hpp"
#include "gpu/kernels.hpp"
#include "gpu/kernels/ops.hpp"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>

namespace nerve::gpu {
enum class backend_kind;
struct stream_options;
}  // namespace nerve::gpu

namespace nerve::gpu::detail {

class backend;
class device_core;

/// A stream of one backend. Backends derive from it.
class stream_impl {
 public:
  virtual ~stream_impl() = default;
  std::uint64_t id = 0;
  /// Serializes "record event, hand it to the completion queue" so per-stream
  /// FIFO order of records and of waiters agree even with several callers.
  std::mutex submit_mutex;
  /// Keeps the device (backend, event pool, completion queue) alive as long as the stream.
  std::shared_ptr<device_core> core;
  /// The backend's own handle (a `cudaStream_t`), for libraries that enqueue on it (NCCL);
  /// null on the stand-in.
  virtual void* native_handle() const noexcept { return nullptr; }
};

/// An event of one backend (timing disabled). Backends derive from it.
class event_impl {
 public:
  virtual ~event_impl() = default;
};

/// What a query of an event says.
struct event_state {
  bool ready = false;      ///< complete (or failed)
  std::error_code error;   ///< set when the work before it failed
};

/// The table of a backend. Thread-safe unless said otherwise.
class backend {
 public:
  virtual ~backend() = default;

  virtual backend_kind kind() const noexcept = 0;
  virtual std::string name() const = 0;
  virtual int ordinal() const noexcept = 0;

  /// Called by the stand-in each time one of its events completes (wakes the
  /// poller at once); a GPU backend never calls it. Set once before any stream exists.
  virtual void set_completion_hook(std::function<void()> hook) { (void)hook; }
  /// Wakes every blocking event wait (shutdown); a GPU backend cannot.
  virtual void interrupt_waits() noexcept {}

  virtual std::shared_ptr<stream_impl> create_stream(const stream_options& o) = 0;
  virtual void synchronize(stream_impl& s) = 0;
  /// Runs `fn` on a host thread once the work before it on `s` is done; later
  /// work waits for it. `fn` must not call into the backend.
  virtual void enqueue_host(stream_impl& s, unique_function<void()> fn) = 0;

  virtual event_impl* create_event() = 0;
  virtual void destroy_event(event_impl* e) noexcept = 0;
  virtual void record(event_impl& e, stream_impl& s) = 0;
  virtual event_state query(event_impl& e) noexcept = 0;
  /// Blocks until the event completes (or `interrupt_waits`, which reports `errc::cancelled`).
  virtual std::error_code wait(event_impl& e) noexcept = 0;
  /// Later work on `s` waits for `e` on the device; the host does not block.
  virtual void stream_wait(stream_impl& s, event_impl& e) = 0;

  virtual void* allocate(std::size_t bytes, stream_impl& s) = 0;
  virtual void deallocate(void* p, stream_impl& s) noexcept = 0;
  virtual void* allocate_pinned(std::size_t bytes) = 0;
  virtual void deallocate_pinned(void* p) noexcept = 0;
  virtual void copy(void* dst, const void* src, std::size_t bytes, stream_impl& s) = 0;
  virtual void fill_zero(void* dst, std::size_t bytes, stream_impl& s) = 0;

  virtual void gemm_strided_batched(stream_impl& s, transpose ta, transpose tb, int m, int n, int k, float alpha,
                                    const float* a, int lda, std::int64_t stride_a, const float* b, int ldb,
                                    std::int64_t stride_b, float beta, float* c, int ldc, std::int64_t stride_c,
                                    int batch) = 0;

  /// Runs `op` (gpu/kernels/ops.hpp) over elements [0, n), or [0, op.size()) for a window
  /// op; the launchers checked the arguments.
  virtual void launch(stream_impl& s, std::size_t n, const ops::pointwise_op& op) = 0;
  virtual void launch(stream_impl& s, const ops::window_op& op) = 0;
  virtual void column_sums(stream_impl& s, const float* x, std::size_t rows, std::size_t cols, float* out,
                           float beta) = 0;
  virtual void softmax_xent_forward(stream_impl& s, const float* logits, const std::int32_t* labels,
                                    std::size_t rows, std::size_t cols, float* probs, float* loss,
                                    float* correct) = 0;

  /// Test-only: makes the work on `s` fail from here on (a faulting kernel of
  /// `testing::fault_kind` `kind` on a GPU; a throwing host function on the stand-in).
  virtual void enqueue_fault(stream_impl& s, int kind) = 0;
  /// Test-only: later work on `s` waits until `*flag` (pinned host memory) is non-zero.
  virtual void enqueue_gate(stream_impl& s, volatile std::int32_t* flag) = 0;
  /// Test-only: opens a gate (stores 1 into the flag, which is pinned host memory).
  virtual void open_gate(std::int32_t* flag) noexcept {
    std::atomic_ref<std::int32_t>(*flag).store(1, std::memory_order_release);
  }
};

// ---- picked in backend_select.cpp -------------------------------------------
/// CUDA devices visible (0 without CUDA, without its module, or when the driver
/// finds none). The first call opens the CUDA module. Never throws.
int cuda_device_count() noexcept;
/// Opens a backend: the CUDA device `ordinal`, or the CPU stand-in.
std::unique_ptr<backend> make_backend(backend_kind kind, int ordinal);
/// `message()` of cuda_category: "cudaErrorX: description".
std::string cuda_error_text(int code);
/// `message()` of cublas_category.
std::string cublas_status_text(int code);

}  // namespace nerve::gpu::detail

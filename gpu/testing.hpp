#pragma once
/// \file
/// Test-only entry points: a fault planted on purpose and a gate that holds a
/// stream until the host opens it. Not for production code.

#include "gpu/memory.hpp"
#include "gpu/stream.hpp"

namespace nerve::gpu::testing {

/// How a planted GPU fault fails (all are sticky: the whole device context
/// fails, every later event of every stream reports the error).
enum class fault_kind {
  global_address,  ///< a store to global address 0x10: cudaErrorIllegalAddress
  shared_address,  ///< a store far outside shared memory: cudaErrorIllegalInstruction on an H200
  trap,            ///< `__trap()`: cudaErrorLaunchFailure
};

/// Makes the work on `s` fail from here on: on a GPU a kernel faults as `kind`
/// says; on the stand-in a host function throws and the stream reports
/// `errc::stream_failed`.
void enqueue_fault(stream& s, fault_kind kind = fault_kind::global_address);

/// Holds the work enqueued after `enqueue(s)` until `open()`: a one-thread
/// kernel spinning on pinned host memory on a GPU, a blocked worker on the
/// stand-in. The destructor opens it, so nothing stays stuck. Thread-safe.
class gate {
 public:
  explicit gate(device& d);
  ~gate();
  gate(const gate&) = delete;
  gate& operator=(const gate&) = delete;

  /// Later work on `s` waits until the gate opens. A kernel's first launch behind a
  /// closed gate can wait for the gate itself (CUDA loads kernels lazily, see
  /// gpu/kernels/launch.hpp): nerve's kernels are loaded when the device opens; run a
  /// cuBLAS product once before putting it behind a gate.
  void enqueue(stream& s);
  /// Opens the gate (work behind it runs) and returns at once.
  void open() noexcept;
  /// Closes it again for the next `enqueue` (only when nothing waits on it).
  void close() noexcept;

 private:
  pinned_buffer flag_;
  detail::backend* backend_;
};

}  // namespace nerve::gpu::testing

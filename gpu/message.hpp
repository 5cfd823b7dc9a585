#pragma once
/// \file
/// The device-resident message rule: between two GPU actors a tensor travels
/// with its ready event, never through the host.
///
/// ```
///   producer's loop                              consumer's loop
///   fc1 forward on stream A                      on_forward(device_message m)
///   send(device_message::ready_on(A, std::move(y)))  ──►  auto& x = m.accept(B);  // B waits on the event
///                                                       relu forward on stream B  // no host sync
/// ```
/// `accept` makes the receiving stream wait for the event on the device
/// (`cudaStreamWaitEvent`) and makes it the owner of the buffer, so the
/// stream-ordered free comes after the receiver's work. Both calls only enqueue.

#include "gpu/event.hpp"
#include "gpu/memory.hpp"
#include "gpu/stream.hpp"

#include <utility>

namespace nerve::gpu {

/// A device tensor and the event after which its contents are ready. Move-only.
struct device_message {
  device_tensor tensor;
  event ready;

  /// Wraps `t`, whose contents are being written by the work enqueued on
  /// `producer` so far. On the producer's loop.
  static device_message ready_on(stream& producer, device_tensor t) {
    device_message m;
    m.tensor = std::move(t);
    m.ready = producer.record();
    return m;
  }

  /// Later work on `consumer` sees the contents; the buffer now belongs to
  /// `consumer` (freed after its work). On the consumer's loop; never blocks.
  device_tensor& accept(stream& consumer) {
    if (ready.valid()) consumer.wait(ready);
    tensor.buffer().set_stream(consumer);
    return tensor;
  }
};

}  // namespace nerve::gpu

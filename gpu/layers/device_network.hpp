#pragma once
/// \file
/// `device_network`: a `layers::graph` trained on one stream of a device, with
/// every activation and gradient device-resident and the step's completion
/// delivered as an event on the owner's loop.
///
/// ```
///  caller (trainer)        owner's loop (executor)         stream (GPU or stand-in)
///  ----------------        -----------------------         ------------------------
///  async_train_step ──► x, labels → pinned slot ──H2D──► fwd … loss … bwd … optimizer
///                                                        loss, correct ──D2H──► pinned slot
///                                                        [event]
///                           handler(ec, step_result) ◄── completion poller
/// ```
/// The host touches the data twice per step: the batch going in and two numbers
/// (loss sum, correct count) coming back; everything between stays on the device.
///
/// Semantics are the direct executor's (`layers::basic_direct_executor::train_step`):
/// zero the gradients, split the batch into nearly equal micro-batches, scale each
/// loss gradient by nᵢ/N, accumulate, one optimizer step (SGD with momentum,
/// Nesterov and weight decay, Adam, AdamW; PyTorch's formulas).
///
/// Thread safety: `async_train_step`, `async_evaluate` and `train_step`/`evaluate`
/// from one thread at a time; handlers run on the executor. Construct, `download`
/// and destroy off the event loops (they wait for the stream), and destroy only
/// after every handler has run (`in_flight() == 0`): a handler refers to the network.
/// A failed step (the CUDA error, sticky) fails every step after it the same way.

#include "gpu/device.hpp"
#include "gpu/layers/device_layer.hpp"
#include "gpu/layers/device_parameters.hpp"
#include "gpu/memory.hpp"

#include <boost/asio/any_io_executor.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <span>
#include <string>
#include <system_error>
#include <vector>

namespace nerve::layers {
template <class Scalar>
class basic_graph;
}

namespace nerve::gpu {

/// What one step or evaluation reports (as `layers::step_result`).
struct device_step_result {
  double loss = 0;           ///< mean over the batch
  std::int64_t correct = 0;  ///< arg-max equals the label
  std::int64_t samples = 0;
};

/// How a device network is set up.
struct device_network_options {
  std::size_t max_batch = 1024;  ///< rows a step may take (sizes the pinned slots)
  std::size_t slots = 2;         ///< steps in flight at once (pinned staging slots)
  stream_options stream;
};

class device_network {
 public:
  using handler = std::function<void(std::error_code, device_step_result)>;

  /// Mirrors `g` (its current parameters) onto `dev` on a new stream; handlers are
  /// posted to `executor`. The loss is softmax cross-entropy on the graph's output.
  /// Throws `gpu::error` (`not_supported` naming a layer without a twin).
  device_network(device& dev, layers::basic_graph<float>& g, device_optimizer opt,
                 boost::asio::any_io_executor executor, device_network_options options = {});
  ~device_network();
  device_network(const device_network&) = delete;
  device_network& operator=(const device_network&) = delete;

  /// One optimizer step on `rows` samples (`x` is rows × features, host memory,
  /// copied before the call returns), split into `micro_batches`; `lr` < 0 keeps
  /// the optimizer's rate. Enqueues and returns; `h` runs on the executor when the
  /// step is done on the device (or failed: the CUDA error, `errc::cancelled` at
  /// shutdown). Throws `errc::invalid_argument` when every slot is in flight.
  void async_train_step(std::span<const float> x, std::span<const std::int32_t> labels, std::size_t micro_batches,
                        double lr, handler h);
  /// Loss and correct count of a batch, no gradients, no update.
  void async_evaluate(std::span<const float> x, std::span<const std::int32_t> labels, handler h);

  /// The same as futures (never `get()` one on the executor's own thread).
  std::future<device_step_result> train_step(std::span<const float> x, std::span<const std::int32_t> labels,
                                             std::size_t micro_batches = 1, double lr = -1);
  std::future<device_step_result> evaluate(std::span<const float> x, std::span<const std::int32_t> labels);

  /// Copies the device parameters into the graph's layers (waits for the stream).
  void download(layers::basic_graph<float>& g);
  /// Copies the graph's layers' parameters onto the device (waits for the stream).
  void upload(layers::basic_graph<float>& g);
  /// The optimizer's state (checkpoints): buffers in PyTorch's names per parameter as the
  /// graph names it (`fc1.weight`), Adam's step counts. Waits for the stream: not on a loop.
  layers::basic_optimizer_state<float> optimizer_state();
  /// Replaces the optimizer's state with `state` (as `optimizer_state` made it). Waits for
  /// the stream. Throws `std::invalid_argument` for a buffer this optimizer does not have.
  void load_optimizer_state(const layers::basic_optimizer_state<float>& state);
  /// Copies the accumulated gradients of the last step into the graph (tests).
  void download_gradients(layers::basic_graph<float>& g);

  /// Waits until the stream is idle (setup, tests, shutdown; never on a loop).
  void synchronize();
  gpu::stream& stream() noexcept { return stream_; }
  /// Steps whose completion has not run yet. Any thread.
  std::size_t in_flight() const noexcept { return in_flight_.load(std::memory_order_acquire); }
  /// Floating-point operations of one forward+backward per sample (2 per multiply-add
  /// of every matrix product: 3× the forward's), for GFLOP/s.
  double flops_per_sample() const noexcept { return flops_per_sample_; }

 private:
  struct impl;
  void launch(std::span<const float> x, std::span<const std::int32_t> labels, std::size_t micro_batches, double lr,
              bool train, handler h);

  gpu::stream stream_;
  std::unique_ptr<impl> impl_;
  std::atomic<std::size_t> in_flight_{0};
  double flops_per_sample_ = 0;
};

}  // namespace nerve::gpu

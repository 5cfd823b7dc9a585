#pragma once
/// \file
/// `device_backend`: the `standin` and `cuda` backends of `layers::network` — each layer
/// actor's kernels enqueued on one stream of a device (layers/backend.hpp).
///
/// ```
///  coordinator (loop)      layer actors (same loop)                     stream (GPU or stand-in)
///  batch ─► pinned ─H2D─►  value ══bus══► fc1 ══► relu1 ══► … ══► loss   fwd … xent … B, W … update
///                          (device tensors: stream order makes them ready, no host copy)
///  loss figures ─D2H─► pinned ─[event]─► backend_done on the coordinator (the loss node)
///  each layer: update enqueued ─[event]─► backend_done on its loop ─► node_done
/// ```
/// The math is each layer's own, written once with ops (layers/ops.hpp) and run with
/// this device's op set (`device_op_set`); a layer without ops runs on the host in the
/// stream's order. Each layer's optimizer is a `layers::optimizer` from the options'
/// factory, stepping the device parameters with the op set's updates (written once, as
/// on the CPU); the loss is softmax cross-entropy. Every actor of the
/// network enqueues on the one stream, so the network puts them on one loop.
///
/// A pipeline stage on a device is a backend over the stage's nodes (`options.nodes`):
/// its layer actors adopt what comes from other stages (host tensors uploaded through
/// pinned memory; a device copy of another stream waited for on the device) and hand
/// over what leaves (downloaded through pinned memory, sent from the loop once the copy
/// is done; or copied with a ready event for a stage of the same device).
///
/// Thread safety: construct, `download`, the optimizer state and destroy off the loops
/// (they wait for the stream); the kernels belong to their actors' loop. The graph and
/// the device must outlive the backend.

#include "gpu/device.hpp"
#include "gpu/memory.hpp"
#include "layers/backend.hpp"
#include "layers/optimizer.hpp"

#include <memory>
#include <vector>

namespace nerve::gpu {

struct device_backend_options {
  /// Each layer's optimizer (the CPU backend's kind: one per layer, PyTorch's rules).
  layers::optimizer_factory make_optimizer = [] { return layers::make_optimizer<float>("sgd", 0.01); };
  std::size_t max_batch = 1024;  ///< rows a step may take (sizes the pinned staging)
  /// The graph's layer nodes to run (a pipeline stage's); empty: every layer.
  std::vector<std::size_t> nodes;
  stream_options stream;
};

class device_backend final : public layers::backend {
 public:
  /// Mirrors `g`'s parameters onto a new stream of `dev` (waits). Throws `gpu::error`
  /// (`not_supported`) for a graph of more than one input.
  device_backend(device& dev, layers::graph& g, device_backend_options options = {});
  ~device_backend() override;

  std::string_view name() const noexcept override;
  bool on_device() const noexcept override { return true; }
  void check_loss(const layers::loss& criterion) const override;
  std::unique_ptr<layers::layer_kernels> kernels_for(layers::graph::node_type& node) override;
  /// Two: the host enqueues a step while the stream runs the one before.
  std::size_t steps_in_flight() const noexcept override { return kSlots; }
  layers::value feed(layers::tensor& batch, std::int64_t first, std::int64_t count, std::uint64_t step) override;
  void loss(actors::actor& owner, const layers::loss& criterion, layers::value output, const layers::targets& t,
            std::int64_t first, std::uint64_t step, double share, bool train, bool want_output,
            const std::function<void(layers::value)>& gradient,
            std::function<void(layers::loss_figures&)> report) override;

  const void* domain() const noexcept override;
  /// Replicas of a layer: all on this device, a `device_all_reduce` on a reduce stream of
  /// this backend (shared by its stage's layers); one per CUDA device, an `nccl_all_reduce`
  /// (where NCCL was built; else `gpu::error` `not_supported`).
  actors::address spawn_reducer(actors::runtime& rt, actors::spawn_options so, std::string name, bus::group members,
                                const std::vector<layers::backend*>& replicas) override;
  /// Replicas one per rank: CUDA devices sum among the ranks with NCCL where it was built
  /// (one communicator per backend, its layers' reducers share it); otherwise the sums go
  /// through the host (`host_all_reduce`; the stand-in, CUDA without NCCL).
  bool sums_across_ranks() const override;
  std::string new_rank_id() override;
  actors::address spawn_rank_reducer(actors::runtime& rt, actors::spawn_options so, std::string name,
                                     actors::address local, const layers::rank_reduce& how) override;
  /// Copies the device parameters into the graph's layers (waits for the stream).
  void download() override;
  /// Values its layers took from the host or handed over to it (a pipeline stage's
  /// boundaries, the gate's input and loss), since construction. Any thread.
  std::int64_t host_transfers() const noexcept;
  /// Waits until the stream is idle (setup, tests, shutdown; never on a loop).
  void synchronize();
  gpu::stream& stream() noexcept;

  struct impl;  // the stream, the layers' entries, the staging (device_backend.cpp; its kernels share it)

  /// Steps in flight, each with its own pinned staging (inputs, labels, figures).
  static constexpr std::size_t kSlots = 2;

 private:
  std::unique_ptr<impl> impl_;
};

}  // namespace nerve::gpu

#pragma once
// The device backend's insides, shared by its two files: device_backend.cpp (the backend:
// staging, the loss, parameters and state, reducers) and device_kernels.cpp (each layer
// actor's kernels). Private to gpu/layers.

#include "actors/actor.hpp"
#include "gpu/kernels.hpp"
#include "gpu/layers/device_all_reduce.hpp"
#include "gpu/layers/device_backend.hpp"
#include "gpu/layers/device_op_set.hpp"
#include "gpu/layers/nccl_all_reduce.hpp"
#include "layers/graph.hpp"
#include "layers/optimizer.hpp"

#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <vector>

namespace nerve::gpu {
namespace detail {

/// A device tensor on an edge. Consumers only read it, so a fan-out shares it (and so
/// does the producer's stash, which needs its output until backward).
struct device_value final : layers::backend_data {
  std::shared_ptr<device_tensor> t;
  event ready;  ///< set on a copy for another stream (layer_kernels::hand_over): its stream waits for it
  explicit device_value(std::shared_ptr<device_tensor> v, event e = {}) : t(std::move(v)), ready(std::move(e)) {}
  std::unique_ptr<layers::backend_data> clone() const override { return std::make_unique<device_value>(t, ready); }
  std::size_t payload_bytes() const noexcept override { return t->bytes(); }
};

inline const std::shared_ptr<device_tensor>& tensor_of(const layers::value& v) {
  auto* d = dynamic_cast<const device_value*>(v.device.get());
  if (!d) throw std::logic_error("device backend: a host tensor reached a device layer");
  return d->t;
}

inline layers::value wrap(std::shared_ptr<device_tensor> t) { return layers::value(std::make_unique<device_value>(std::move(t))); }

inline shape_t with_batch(std::int64_t n, const layers::shape& sample) {
  shape_t s{std::size_t(n)};
  for (auto d : sample.dims()) s.push_back(std::size_t(d));
  return s;
}

/// A host tensor of `t`'s shape.
inline layers::tensor host_like(const device_tensor& t) {
  std::vector<std::int64_t> dims(t.shape().begin() + 1, t.shape().end());
  return layers::tensor(std::int64_t(t.rows()), layers::shape(std::move(dims)));
}

/// What an op layer keeps for backward of one micro-batch: its run (tape or kept arrays).
struct op_kept final : layers::backend_data {
  std::unique_ptr<layers::basic_op_run<float>> run;
  std::unique_ptr<layers::backend_data> clone() const override {
    throw std::logic_error("device backend: a stash is not cloned");
  }
  std::size_t payload_bytes() const noexcept override { return run->kept_bytes(); }
};

/// A trainable tensor of an op layer on the device and its gradient, with the CPU
/// layer's name for it.
struct device_parameter {
  std::string name;  ///< "weight", "bias"
  device_tensor* value = nullptr;
  device_tensor* grad = nullptr;
};

/// One layer node on the device: an op layer run with the backend's op set, its
/// parameters on the device, and its optimizer, which steps them with the op set's
/// updates. A layer not written with ops runs on the host, in stream order (its inputs
/// copied off the device, its output back on), its optimizer stepping its host tensors.
struct node_entry {
  layers::graph::node_type* node;
  layers::op_layer* op = nullptr;                           // the op layer (the graph's); null: on the host
  std::vector<std::unique_ptr<device_tensor>> op_tensors;  // its parameters' values and gradients, its buffers
  std::vector<device_parameter> parameters;                // in parameters() order
  std::vector<device_tensor*> buffers;                     // in buffers() order (running statistics)
  std::unique_ptr<layers::optimizer> opt;
  /// The device parameters as the optimizer steps them (made once, with `parameters`),
  /// under the layer's names as on the CPU, so checkpoints read the same.
  std::vector<layers::optimizer::parameter> stepped;
  bool on_host() const noexcept { return op == nullptr; }
};

/// The first error of a layer run on the host (its host functions run off the loops);
/// the backend's next completion fails its actor with it.
struct host_failure {
  void set(std::exception_ptr e) {
    std::lock_guard lock(m);
    if (!error) error = std::move(e);
    failed.store(true, std::memory_order_release);
  }
  bool is_set() const noexcept { return failed.load(std::memory_order_acquire); }
  std::exception_ptr get() {
    std::lock_guard lock(m);
    return error;
  }

 private:
  std::mutex m;
  std::exception_ptr error;
  std::atomic<bool> failed{false};
};

/// What a layer run on the host keeps for backward: its CPU stash, filled by the host
/// function of its forward.
struct host_kept final : layers::backend_data {
  std::shared_ptr<layers::basic_stash<float>> stash = std::make_shared<layers::basic_stash<float>>();
  std::vector<shape_t> input_shapes;
  std::size_t bytes = 0;
  std::unique_ptr<layers::backend_data> clone() const override {
    throw std::logic_error("device backend: a stash is not cloned");
  }
  std::size_t payload_bytes() const noexcept override { return bytes; }
};

/// The op layer's parameters and buffers mirrored on `s` (values uploaded, gradients
/// zeroed; waits).
void mirror_parameters(stream& s, node_entry& e);

}  // namespace detail

struct device_backend::impl {
  device& dev;
  gpu::stream s;
  device_backend_options options;
  std::vector<std::unique_ptr<detail::node_entry>> nodes;
  std::int64_t features = 0;
  pinned_buffer in, labels;  // kSlots · max_batch rows of inputs and of labels
  // Labels a row of `labels` holds: the tokens of a graph output of [T, K] samples (a
  // label per token), else 1.
  std::int64_t labels_per_row = 1;
  // Staging of downloads (hooks, predicted outputs, values handed to the host) and uploads
  // (values adopted from the host); shared with the completions that give blocks back.
  std::shared_ptr<pinned_pool> pool;
  std::atomic<std::int64_t> host_transfers{0};
  // Events of other streams this one waits for: a pooled event handed back at once could
  // be recorded again before the wait passed it (the stand-in's wait follows the latest
  // record), so they are kept until the next completion after the wait.
  std::vector<event> waited;
  // Device sums of the replica group this stream copied from: they live until the
  // completion after the copy, as the events above.
  std::vector<std::shared_ptr<layers::backend_data>> sums;
  // Replica 0's backend of a stage: the stream its layers' device all-reduces sum on (and,
  // replicas one per rank, the stream of this rank's copies or NCCL calls).
  gpu::stream reduce;
  // Replicas one per rank with NCCL: this rank's communicator, shared by the layers.
  std::shared_ptr<nccl_rank_group> rank_group;
  // The ops of op layers, on `s`.
  std::unique_ptr<device_op_set> ops;
  // The first error of a layer run on the host.
  std::shared_ptr<detail::host_failure> host_failed = std::make_shared<detail::host_failure>();

  gpu::stream& reduce_stream() {
    if (!reduce.valid()) reduce = dev.create_stream(options.stream);
    return reduce;
  }

  impl(device& d, device_backend_options o)
      : dev(d), s(d.create_stream(o.stream)), options(std::move(o)), pool(std::make_shared<pinned_pool>(d)),
        ops(std::make_unique<device_op_set>(s, d.kind() == backend_kind::cuda ? "cuda" : "standin")) {}

  /// `then` as a `backend_done` in `owner`'s mailbox once the work enqueued so far is done;
  /// `what` names the wait's span in the trace.
  void when_done(actors::actor& owner, std::function<void()> then, const char* what) {
    after_stream(owner, s, "device backend",
                 [then = std::move(then), sums = std::exchange(sums, {}), failed = host_failed] {
                   if (failed->is_set()) std::rethrow_exception(failed->get());
                   then();
                 },
                 std::exchange(waited, {}), span_label{what});
  }

  /// `h` on the device, copied through a pinned block of the pool that goes back once the
  /// copy is done (a completion on `owner`).
  std::shared_ptr<device_tensor> upload(actors::actor& owner, const layers::tensor& h) {
    auto t = std::make_shared<device_tensor>(s, detail::with_batch(h.batch(), h.sample_shape()));
    auto staging = pool->take(t->bytes());
    std::memcpy(staging.data(), h.data(), t->bytes());
    copy_async(s, t->data(), staging.data(), t->bytes());
    s.async_wait(owner.executor(), [pool = pool, b = std::move(staging)](std::error_code) mutable {
      pool->give(std::move(b));
    });
    return t;
  }

  /// Downloads `ts` (null: skipped, left empty) through staging, then `fn` on their host
  /// copies in a completion on `owner` (`what` labels the wait).
  void download(actors::actor& owner, const std::vector<const device_tensor*>& ts, const char* what,
                std::function<void(std::vector<layers::tensor>&)> fn) {
    auto host = std::make_shared<std::vector<layers::tensor>>(ts.size());
    auto blocks = std::make_shared<std::vector<std::pair<layers::tensor*, pinned_buffer>>>();
    for (std::size_t i = 0; i < ts.size(); ++i) {
      if (!ts[i]) continue;
      (*host)[i] = detail::host_like(*ts[i]);
      blocks->emplace_back(&(*host)[i], pool->take(ts[i]->bytes()));
      copy_async(s, blocks->back().second.data(), ts[i]->data(), ts[i]->bytes());
    }
    when_done(owner, [host, blocks, pool = pool, fn = std::move(fn)] {
      for (auto& [into, block] : *blocks) {
        std::memcpy(into->data(), block.data(), std::size_t(into->size()) * sizeof(float));
        pool->give(std::move(block));
      }
      fn(*host);
    }, what);
  }
};

namespace detail {
/// The kernels of entry `e`'s layer actor.
std::unique_ptr<layers::layer_kernels> make_kernels(device_backend::impl& b, node_entry& e);

// A layer run on the host (host_kernels.cpp): each call enqueues the copies and a host
// function on the backend's stream, so the device's order holds.
layers::value host_forward(device_backend::impl& b, node_entry& e, std::vector<layers::value>& inputs,
                           const layers::forward_context& context, bool train, layers::kept& keep);
std::vector<layers::value> host_backward_input(device_backend::impl& b, node_entry& e, const layers::kept& k,
                                               const layers::value& dy, layers::input_mask wanted);
void host_backward_weight(device_backend::impl& b, node_entry& e, const layers::kept& k, const layers::value& dy);
void host_update(device_backend::impl& b, node_entry& e, double lr);
}  // namespace detail

}  // namespace nerve::gpu

#pragma once
/// \file
/// Where a layer actor's kernels go (ggml's shape): a `backend` per network makes each
/// node's `layer_kernels`; `cpu` is built in, `standin` and `cuda` are gpu/'s.
///
/// ```
///   layer_actor: forward / B / W / update ──► kernels ──► Eigen (cpu) | enqueued on a stream
///   edges carry a `value`: a host tensor, or a device value that stays on the device
///   kernels.when_done(actor, then) ──► at once (cpu) | `backend_done` in its mailbox (device)
/// ```
/// layers/ knows no device: a device's tensors are `backend_data`, opaque here. A backend
/// is set up off the loops; a node's kernels are used by its actor's loop only.

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "actors/runtime.hpp"
#include "bus/group.hpp"
#include "layers/graph.hpp"
#include "layers/loss.hpp"
#include "layers/optimizer.hpp"
#include "layers/tensor.hpp"

namespace nerve::layers {

/// What a device backend holds for a layer actor (a device tensor, a device stash).
class backend_data {
 public:
  virtual ~backend_data() = default;
  /// A copy for one more consumer (fan-out), on the emitting actor's loop.
  virtual std::unique_ptr<backend_data> clone() const = 0;
  virtual std::size_t payload_bytes() const noexcept = 0;
};

/// What an edge carries: a host tensor (cpu) or a device backend's value. Move-only.
struct value {
  tensor host;
  std::unique_ptr<backend_data> device;

  value() = default;
  value(tensor t) noexcept : host(std::move(t)) {}  // NOLINT: a host tensor is a value
  explicit value(std::unique_ptr<backend_data> d) noexcept : device(std::move(d)) {}
  bool empty() const noexcept { return !device && host.empty(); }
  std::size_t payload_bytes() const noexcept { return device ? device->payload_bytes() : host.payload_bytes(); }
  value clone() const { return device ? value(device->clone()) : value(host.clone()); }
};

/// What forward keeps for backward of one micro-batch.
struct kept {
  basic_stash<float> host;
  std::unique_ptr<backend_data> device;
  std::size_t payload_bytes() const noexcept { return device ? device->payload_bytes() : host.payload_bytes(); }
};

/// Replicas on a device: member `rank`'s parameter gradients for round `key`, left on its
/// device (`layer_kernels::device_gradients`: where they are and the event after which
/// they are complete). To the replica group's device all-reduce.
struct device_contribution {
  static constexpr std::string_view kind = "device_contribution";
  std::uint64_t key = 0;
  unsigned rank = 0;
  std::shared_ptr<backend_data> grads;
  std::size_t payload_bytes() const noexcept { return 0; }  // a handle: the floats stay on the device
};

/// The replica group's sum of round `key`, on the device with its ready event; every
/// member's kernels take it in stream order (`layer_kernels::take_device_sum`).
struct device_reduced {
  static constexpr std::string_view kind = "device_reduced";
  std::uint64_t key = 0;
  std::shared_ptr<backend_data> sum;
  std::size_t payload_bytes() const noexcept { return 0; }
};

/// Replicas on several ranks, one each (a pipeline's `rank_link`): how this rank's member
/// of a layer's replica group sums its gradients with the other ranks' members.
struct rank_reduce {
  std::uint32_t members = 0;  ///< the group's ranks, one member on each
  std::uint32_t me = 0;       ///< this rank's member
  /// Member 0's `backend::new_rank_id`, the same on every member: the backends sum among
  /// the ranks themselves (NCCL). Empty: through the host, with `host`.
  std::string id;
  /// Spawns the ranks' host all-reduce whose member here is `local`: `bus::contribution`s
  /// in, `bus::reduced` out to `local`, summed in member order (the link's, bitwise
  /// `bus::all_reduce`'s). Off the loops, at wiring.
  std::function<actors::address(actors::address local)> host;
};

/// A backend's work for the actor it is delivered to finished (or failed): run `then`.
struct backend_done {
  static constexpr std::string_view kind = "backend_done";
  std::exception_ptr error;
  std::function<void()> then;
};

/// One layer node's kernels, as `basic_layer` and an optimizer (its actor's loop only).
class layer_kernels {
 public:
  virtual ~layer_kernels() = default;
  /// `inputs` are moved from; in training `keep` gets what backward needs.
  virtual value forward(std::vector<value>& inputs, const forward_context& context, bool train, kept& keep) = 0;
  /// `into += g`: a fan-out's gradients, summed in the plan's order.
  virtual void add(value& into, const value& g) = 0;
  virtual std::vector<value> backward_input(const kept& k, const value& dy, input_mask wanted) = 0;
  virtual void backward_weight(const kept& k, const value& dy) = 0;
  /// The rate from now on (negative: unchanged).
  virtual void set_lr(double lr) = 0;
  /// Optimizer step, gradients zeroed. On the CPU a non-finite gradient throws unless allowed.
  virtual void update(std::uint64_t step, bool allow_nonfinite) = 0;
  /// `then` on `owner`'s loop once the work enqueued so far is done: at once on the CPU,
  /// else through a `backend_done` message (`owner` handles it with `handle_backend_done`).
  virtual void when_done(actors::actor& owner, std::function<void()> then) = 0;
  /// `fn` on `owner`'s loop with `vs` on the host (hooks): the CPU lends the tensors (what
  /// `fn` changes stays), a device downloads copies.
  virtual void with_host(actors::actor& owner, std::vector<value*> vs,
                         std::function<void(std::vector<tensor>&)> fn) = 0;
  /// The parameter gradients, flattened in `parameters()` order, on the host (the replica
  /// group's `bus::all_reduce`), and their replacement by the group's sum. Host kernels
  /// only: a device's gradients stay on it (`device_gradients`), and it throws.
  virtual std::vector<float> gradients() = 0;
  virtual void set_gradients(const std::vector<float>& flat) = 0;
  /// Replicas on a device: the parameter gradients as they will be once the work enqueued
  /// so far is done (their device buffers and a ready event), for the group's device
  /// all-reduce (`backend::spawn_reducer`). Null: host kernels (use `gradients`).
  virtual std::shared_ptr<backend_data> device_gradients() { return nullptr; }
  /// The group's sum (a `device_reduced`'s) replaces the gradients, in stream order after
  /// the sum: no host round trip. Device kernels only.
  virtual void take_device_sum(std::shared_ptr<backend_data> sum);
  /// The optimizer's state (checkpoints), parameters as the layer names them, whichever
  /// backend keeps it (a device's waits for its stream).
  virtual optimizer_state save_state() { return {}; }
  virtual void load_state(const optimizer_state&) {}
  /// A value from another pipeline stage (or its gate), before this node uses it: a device
  /// uploads a host tensor and makes its stream wait for another stream's value. The CPU
  /// takes host tensors only.
  virtual void adopt(actors::actor& owner, value& v) = 0;
  /// `then(v)` on `owner`'s loop once `v` may leave for another stage: on the host
  /// (`to_host`: a download), else as a device copy that another stream of the same
  /// device waits for. Host values leave as they are.
  virtual void hand_over(actors::actor& owner, value v, bool to_host, std::function<void(value)> then) = 0;
};

/// Figures of one micro-batch's loss.
struct loss_figures {
  double loss = 0;  ///< mean over the micro-batch
  std::int64_t correct = 0;
  tensor output;  ///< the network's output, when asked for
};

/// Where a network's kernels go. One per network; set up off the loops.
class backend {
 public:
  virtual ~backend() = default;
  virtual std::string_view name() const noexcept = 0;
  /// True where every kernel goes to one stream: the network's actors then share one loop.
  virtual bool on_device() const noexcept { return false; }
  /// Throws `std::invalid_argument` for a loss it cannot run.
  virtual void check_loss(const loss&) const {}
  virtual std::unique_ptr<layer_kernels> kernels_for(graph::node_type& node) = 0;
  /// How many training steps a network may run at once on this backend. Above 1, a
  /// layer takes the next step's forwards once it has issued its update (a device's stream
  /// orders them), so the host enqueues step k+1 while the device runs step k.
  virtual std::size_t steps_in_flight() const noexcept { return 1; }
  /// Rows `[first, first + count)` of `batch` into the graph (moved when it is all of it),
  /// for step `step` (steps in flight at once stage apart).
  virtual value feed(tensor& batch, std::int64_t first, std::int64_t count, std::uint64_t step) = 0;
  /// One micro-batch's loss in step `step`: `gradient` (training; scaled by `share`) is
  /// called at once, `report` with the figures on `owner`'s loop.
  virtual void loss(actors::actor& owner, const layers::loss& criterion, value output, const targets& t,
                    std::int64_t first, std::uint64_t step, double share, bool train, bool want_output,
                    const std::function<void(value)>& gradient, std::function<void(loss_figures&)> report) = 0;
  /// Backends whose values share a non-null domain (one device) pass them device-resident.
  virtual const void* domain() const noexcept { return nullptr; }
  /// A device's weights into the graph's layers: off the loops, between steps (it waits
  /// for the stream). The CPU trains the graph in place: nothing to do. (Optimizer state
  /// is each layer's kernels', on every backend: `layer_kernels::save_state`.)
  virtual void download() {}
  /// Data parallelism: the replicas of one layer run on `replicas` (this backend is replica
  /// 0's, member k is replica k's layer actor in `members`). Spawns, with `so`, the actor
  /// that sums their gradients where they are (`device_contribution` in, `device_reduced`
  /// out, summed in member order). An empty address: host gradients, the caller spawns a
  /// `bus::all_reduce`. Off the loops, at wiring.
  virtual actors::address spawn_reducer(actors::runtime& rt, actors::spawn_options so, std::string name,
                                        bus::group members, const std::vector<backend*>& replicas) {
    (void)rt, (void)so, (void)name, (void)members, (void)replicas;
    return {};
  }
  /// Replicas on several ranks: whether this backend sums with its twins on the other ranks
  /// without the host (NCCL between CUDA devices). Every member of a group must, or the
  /// group sums through the host. Off the loops, at wiring.
  virtual bool sums_across_ranks() const { return false; }
  /// Member 0's, where `sums_across_ranks`: a new id of a group that sums among its ranks,
  /// which the caller hands to every member (`rank_reduce::id`). Off the loops.
  virtual std::string new_rank_id() { throw std::logic_error("backend: no sum among ranks without the host"); }
  /// Replicas on several ranks, one each: spawns, with `so`, the actor that sums member
  /// `how.me`'s gradients (those of its layer actor `local`) with the other ranks' members:
  /// `device_contribution` in, `device_reduced` out to `local`. Among the ranks themselves
  /// when `how.id` is set (then a collective of the group's ranks, each wiring its layers
  /// in the same order), else through the host with `how.host`. An empty address: host
  /// gradients, the caller uses `how.host(local)`. Off the loops, at wiring.
  virtual actors::address spawn_rank_reducer(actors::runtime& rt, actors::spawn_options so, std::string name,
                                             actors::address local, const rank_reduce& how) {
    (void)rt, (void)so, (void)name, (void)local, (void)how;
    return {};
  }
};

inline void layer_kernels::take_device_sum(std::shared_ptr<backend_data>) {
  throw std::logic_error("layer kernels: a device sum reached host kernels");
}

/// Runs a `backend_done`: rethrows its error (failing the actor) or runs `then`.
inline void handle_backend_done(backend_done& d) {
  if (d.error) std::rethrow_exception(d.error);
  d.then();
}

/// The CPU backend: Eigen calls on the layer's loop, one optimizer per layer from `make`;
/// a network's, and each CPU stage's of a pipeline. Without `make` it runs losses only
/// (`kernels_for` refuses, naming the layer).
std::shared_ptr<backend> make_cpu_backend(std::function<std::unique_ptr<optimizer>()> make);

}  // namespace nerve::layers

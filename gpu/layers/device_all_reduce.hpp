#pragma once
/// \file
/// `device_all_reduce`: the replica group's gradient sum when the replicas of a layer run
/// on one device (several streams of it) — on the device, in member order, no host trip.
///
/// ```
///  replica 0's stream  … W(last mb) [e0]                                   ┐
///  replica 1's stream  … W(last mb) [e1]                                   │ device_contribution
///  replica 2's stream  … W(last mb) [e2]                                   ┘ (buffers + event)
///  reduce stream:  wait e0,e1,e2 ─► sum = g0 ─► sum += g1 ─► sum += g2 ─► [r]
///  each replica's stream:  wait r ─► grads = sum ─► update            ◄── device_reduced
/// ```
/// A member's layer actor contributes its gradients' device buffers with an event recorded
/// after its last W of the step (`layer_kernels::device_gradients`). When every member of
/// a round is in, the actor enqueues on its own stream (one per device backend, shared by
/// the reducers of a stage's layers): a wait for each member's event, then the sum in
/// member order from member 0's buffers (a copy, then one `axpy` with α = 1 per further
/// member: each element is `((g0 + g1) + g2) + …`, rounded once per addition, which is
/// `bus::all_reduce`'s association, so the same inputs give the same bits), and records
/// the sum's ready event. Each member's kernels then wait for it on their stream and copy
/// the sum into their gradients before the update (`take_device_sum`). The sum buffer
/// lives until the last member's update completed. Rounds are keyed (the step), so a
/// layer's reduction runs while the other layers still run backward.
///
/// Thread safety: an actor; the payload types are handed between loops by messages.

#include "actors/actor.hpp"
#include "bus/group.hpp"
#include "gpu/event.hpp"
#include "gpu/memory.hpp"
#include "gpu/stream.hpp"
#include "layers/backend.hpp"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace nerve::gpu {

/// A member's gradients on its device: one span per parameter, in `parameters()` order,
/// complete once `ready` is.
struct device_gradients final : layers::backend_data {
  std::vector<std::pair<float*, std::size_t>> parts;
  event ready;
  const void* domain = nullptr;  ///< the device (`device_backend::domain`)
  int ordinal = 0;
  std::unique_ptr<layers::backend_data> clone() const override;
  std::size_t payload_bytes() const noexcept override;
  std::size_t floats() const noexcept;
};

/// Once `s` has passed the work enqueued on it so far: `then` (if any) runs on `a`, through
/// its mailbox as a `backend_done`; if the stream failed, `a` fails instead, the error named
/// `what` and `a`'s name. `keep` (events the work waited for) lives until then, so a pooled
/// event is not recorded again first; `span` labels the wait in the trace. The one way back
/// from a stream to the reducers and the device backend's layer actors.
void after_stream(actors::actor& a, stream& s, const char* what, std::function<void()> then = {},
                  std::vector<event> keep = {}, const span_label& span = {});

/// A round's sum on the device: the parts laid end to end, complete once `ready` is.
/// `in_place`: the members' own buffers already hold it (NCCL); only the wait remains.
struct device_sum final : layers::backend_data {
  std::shared_ptr<device_tensor> sum;
  event ready;
  bool in_place = false;
  std::unique_ptr<layers::backend_data> clone() const override;
  std::size_t payload_bytes() const noexcept override { return sum ? sum->bytes() : 0; }
};

/// A reducer's open rounds: the members' gradients by round (the key), checked as they
/// come in: a member of the group, on a device, once a round, of the shape (and, with
/// `one_device`, on the device) of the others.
class replica_rounds {
 public:
  /// Keeps `c`'s gradients; once all `members` are in, returns them in member order (else
  /// nothing). Errors name the reducer: its `kind` and `name`.
  std::vector<std::shared_ptr<layers::backend_data>> add(const char* kind, const std::string& name,
                                                          std::size_t members, layers::device_contribution& c,
                                                          bool one_device);

 private:
  std::map<std::uint64_t, std::vector<std::shared_ptr<layers::backend_data>>> open_;
};

class device_all_reduce : public actors::actor {
 public:
  /// `members` (replica k's layer actor at k) all run on the device of `s`; the sums are
  /// enqueued on `s`, which no member uses.
  device_all_reduce(std::string name, bus::group members, stream s);

  /// Rounds summed so far (read after `synchronize`).
  std::uint64_t rounds() const noexcept { return rounds_; }

 private:
  void on_contribution(layers::device_contribution& c);

  bus::group members_;
  stream s_;
  replica_rounds open_;
  std::uint64_t rounds_ = 0;
};

}  // namespace nerve::gpu

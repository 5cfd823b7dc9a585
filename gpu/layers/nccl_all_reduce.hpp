#pragma once
/// \file
/// `nccl_all_reduce`: the replica group's gradient sum when the replicas of a layer run one
/// per CUDA device in this process — NCCL's all-reduce, in place in every member's own
/// gradient buffers, on a reduce stream of each device.
///
/// ```
///  replica k's stream (device k) … W(last mb) [e_k] ──device_contribution──► this actor
///  reduce stream of device k:  wait e_k ─► ncclAllReduce(g_k, sum, in place) ─► [r_k]   (one NCCL group)
///  replica k's stream:  wait r_k ─► update                            ◄── device_reduced (in place)
/// ```
/// The protocol is `device_all_reduce`'s; only the sum differs. NCCL picks its own order
/// (rings, trees), so the result is not bitwise member order: within R·2⁻²⁴·Σ|gᵢ| of it.
/// Built where NCCL is found; its test needs two GPUs and reports skipped with fewer.
///
/// **Across ranks** (replicas one per rank, each on its own GPU): each rank's reducer has
/// one member, its rank's, and sums with the other ranks' through this rank's communicator
/// of the group (`nccl_rank_group`, one per stage backend, shared by its layers' reducers).
/// NCCL matches the calls on a communicator by their order on each rank, so the group
/// issues them in one order every rank agrees on, whatever order the layers finish in:
/// round by round (the step), and in a round the layers last to first (backward's order,
/// so the first layer ready is usually the next to go).
///
/// Thread safety: an actor; a `nccl_rank_group` belongs to the one loop of its reducers.

#include "actors/actor.hpp"
#include "bus/group.hpp"
#include "gpu/device.hpp"
#include "gpu/layers/device_all_reduce.hpp"
#include "gpu/nccl.hpp"
#include "gpu/stream.hpp"
#include "layers/backend.hpp"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace nerve::gpu {

/// This rank's communicator of a replica group across ranks, the stream its all-reduces
/// run on, and their order (see above). Made off the loops; used by its reducers' loop.
class nccl_rank_group {
 public:
  /// Joins the group of `members` ranks as member `me` with member 0's `id`
  /// (`nccl_comms::unique_id`): a collective of the group's ranks. `s` is a stream of
  /// `dev` no member uses. Throws `gpu::error` naming the device when NCCL refuses (two
  /// ranks on one GPU, say).
  nccl_rank_group(device& dev, std::uint32_t members, std::uint32_t me, const std::string& id, stream s);

  const std::string& id() const noexcept { return id_; }
  std::uint32_t me() const noexcept { return me_; }
  /// A reducer's place in the order; every rank adds its layers in the same order (wiring).
  std::size_t add_layer() noexcept { return layers_++; }
  /// Runs `issue` (which enqueues layer `layer`'s all-reduce of round `key`) once every
  /// call before it in the agreed order has run.
  void ready(std::uint64_t key, std::size_t layer, std::function<void()> issue);

  nccl_comms& comms() noexcept { return *comms_; }
  stream& reduce_stream() noexcept { return s_; }
  std::optional<unsigned> loop;  ///< its reducers' loop (checked at wiring)

 private:
  std::string id_;
  std::uint32_t me_;
  stream s_;
  std::unique_ptr<nccl_comms> comms_;
  std::size_t layers_ = 0;
  std::map<std::uint64_t, std::vector<std::function<void()>>> waiting_;  // by round, by layer
  std::size_t issued_ = 0;  // of the oldest round
};

class nccl_all_reduce : public actors::actor {
 public:
  /// Member k (replica k's layer actor) runs on `devices[k]`, all distinct CUDA devices;
  /// `streams[k]` is a stream of `devices[k]` no member uses. Opens the communicators
  /// (`ncclCommInitAll`): off the loops, at wiring. Throws `gpu::error` without NCCL.
  nccl_all_reduce(std::string name, bus::group members, std::vector<device*> devices, std::vector<stream> streams);
  /// Across ranks: this rank's member `local` (member `group.me()` of the replica group),
  /// summed through `group` with the other ranks' members.
  nccl_all_reduce(std::string name, actors::address local, std::shared_ptr<nccl_rank_group> group);

  std::uint64_t rounds() const noexcept { return rounds_; }

 private:
  void on_contribution(layers::device_contribution& c);
  void on_rank_contribution(layers::device_contribution& c);

  bus::group members_;
  std::vector<stream> streams_;
  std::unique_ptr<nccl_comms> comms_;
  std::shared_ptr<nccl_rank_group> group_;  // across ranks
  std::size_t layer_ = 0;                   // its place in the group's order
  replica_rounds open_;
  std::uint64_t rounds_ = 0;
};

}  // namespace nerve::gpu

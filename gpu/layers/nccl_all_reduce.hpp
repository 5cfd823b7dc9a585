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
/// Thread safety: an actor.

#include "actors/actor.hpp"
#include "bus/group.hpp"
#include "gpu/device.hpp"
#include "gpu/nccl.hpp"
#include "gpu/stream.hpp"
#include "layers/backend.hpp"

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace nerve::gpu {

class nccl_all_reduce : public actors::actor {
 public:
  /// Member k (replica k's layer actor) runs on `devices[k]`, all distinct CUDA devices;
  /// `streams[k]` is a stream of `devices[k]` no member uses. Opens the communicators
  /// (`ncclCommInitAll`): off the loops, at wiring. Throws `gpu::error` without NCCL.
  nccl_all_reduce(std::string name, bus::group members, std::vector<device*> devices, std::vector<stream> streams);

  std::uint64_t rounds() const noexcept { return rounds_; }

 private:
  void on_contribution(layers::device_contribution& c);

  bus::group members_;
  std::vector<stream> streams_;
  std::unique_ptr<nccl_comms> comms_;
  struct round {
    std::vector<std::shared_ptr<layers::backend_data>> parts;
    std::size_t got = 0;
  };
  std::map<std::uint64_t, round> open_;
  std::uint64_t rounds_ = 0;
};

}  // namespace nerve::gpu

#pragma once
/// \file
/// `host_all_reduce`: this rank's member of a replica group that sums device gradients
/// across ranks through the host — where the ranks cannot sum on their devices (the
/// stand-in, whose "device" memory is host memory, or CUDA without NCCL).
///
/// ```
///  member's stream  … W(last mb) [e] ──device_contribution──► this actor
///  reduce stream:   wait e ─► gradients ─D2H─► pinned ──► bus::contribution ──► ranks' all-reduce
///                                                                (member order, over MPI)
///  reduce stream:   pinned ─H2D─► sum [r]   ◄── bus::reduced ◄──────────────────────┘
///  member's stream: wait r ─► grads = sum ─► update          ◄── device_reduced (the sum, r)
/// ```
/// The ranks' all-reduce (`rank_reduce::host`, the pipeline's link) sums the host copies in
/// member order from member 0's, `bus::all_reduce`'s association, and the copies are exact:
/// the weights are bitwise those of the replicas summed on one device in member order
/// (`device_all_reduce`) where the devices' kernels are the same (the stand-in's are).
///
/// Thread safety: an actor. `reduce_with` before traffic, off the loops.

#include "actors/actor.hpp"
#include "bus/all_reduce.hpp"
#include "gpu/memory.hpp"
#include "gpu/stream.hpp"
#include "layers/backend.hpp"

#include <cstdint>
#include <string>

namespace nerve::gpu {

class device;

class host_all_reduce : public actors::actor {
 public:
  /// Member `me`'s layer actor `local`, whose gradients are on `dev`; copies run on `s`
  /// (a stream of `dev` no member uses).
  host_all_reduce(std::string name, actors::address local, std::uint32_t me, device& dev, stream s);

  /// The ranks' all-reduce this member contributes to (its `bus::reduced` come here).
  void reduce_with(actors::address ranks) { ranks_ = std::move(ranks); }
  /// Rounds summed so far (read after the traffic stopped).
  std::uint64_t rounds() const noexcept { return rounds_; }

 private:
  void on_contribution(layers::device_contribution& c);
  void on_reduced(bus::reduced& m);

  actors::address local_, ranks_;
  std::uint32_t me_;
  stream s_;
  pinned_pool pool_;  // staging blocks, given back once their copy is done
  std::uint64_t rounds_ = 0;
};

}  // namespace nerve::gpu

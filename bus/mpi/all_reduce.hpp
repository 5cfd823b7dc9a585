#pragma once
/// \file
/// `bus::mpi::all_reduce`: the sum of float buffers over members on several ranks, with the
/// bits of the in-process `bus::all_reduce`.
///
/// ```
///   rank 0                                   rank 1
///   fc1 ──contribution{key, 0}──► reducer    reducer ◄──contribution{key, 1}── fc1'
///                    its part ──► (MPI) ───► ...   ◄── (MPI) ◄── its part
///   fc1 ◄──reduced{key, sum}──── sums parts 0, 1, … in member order ──► reduced ──► fc1'
/// ```
/// Each rank has one reducer per group and one local member. The member sends it its
/// `contribution` as it would to the in-process actor; the reducer sends that part to every
/// other member's rank over the transport (from the buffer, no copy) and, once every part of
/// a round is in, sums them in member order, starting from member 0's part, as
/// `bus::all_reduce` does: the same inputs give the same bits in one process and across
/// ranks. Rounds are named by key, so several (gradient buckets, steps) can be open at once,
/// and a round opens on the first part that arrives, local or remote.
///
/// Each rank sends its part to every other: R−1 sends per round and rank, which suits the
/// few ranks a job here has; a ring would send less for many ranks.
///
/// Thread safety: an actor; `spawn_all_reduce` spawns it and listens on its channel, before
/// traffic.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "actors/actor.hpp"
#include "bus/all_reduce.hpp"
#include "bus/mpi/transport.hpp"

namespace nerve::bus::mpi {

/// One member's part of a round, as it crosses between ranks.
struct reduce_part {
  static constexpr std::string_view kind = "reduce_part";
  std::uint64_t key = 0;
  std::uint32_t member = 0;
  std::shared_ptr<std::vector<float>> data;
  std::size_t payload_bytes() const noexcept { return data ? data->size() * sizeof(float) : 0; }
};

template <>
struct codec<reduce_part> {
  static void write(const reduce_part& p, std::vector<std::byte>& frame) {
    frame_writer{frame}.put(p.key).put(p.member).put(std::uint64_t(p.data->size()));
  }
  static std::span<const std::byte> payload(const reduce_part& p) { return std::as_bytes(std::span(*p.data)); }
  static reduce_part read(std::span<const std::byte> frame, std::span<std::byte>& payload) {
    frame_reader r{frame};
    reduce_part p;
    p.key = r.get<std::uint64_t>();
    p.member = r.get<std::uint32_t>();
    p.data = std::make_shared<std::vector<float>>(r.get<std::uint64_t>());
    payload = std::as_writable_bytes(std::span(*p.data));
    return p;
  }
};

class all_reduce : public actors::actor {
 public:
  /// `ranks[m]`: the rank of member m (the sum's order is the members'); `me`: this rank's
  /// member; `local`: the member's actor, which gets each round's `reduced`; `ch`: the
  /// group's channel, the same on every rank (`spawn_all_reduce` listens on it).
  all_reduce(std::string name, transport& t, transport::channel ch, std::vector<int> ranks, std::uint32_t me,
             actors::address local);
  /// Rounds completed so far (read after the traffic stopped).
  std::uint64_t rounds() const noexcept { return rounds_; }

 private:
  void add(std::uint64_t key, std::uint32_t member, std::shared_ptr<std::vector<float>> data);

  transport& t_;
  transport::channel ch_;
  std::vector<int> ranks_;
  std::uint32_t me_;
  actors::address local_;
  struct round {
    std::vector<std::shared_ptr<std::vector<float>>> parts;
    std::size_t got = 0;
  };
  std::map<std::uint64_t, round> open_;
  std::uint64_t rounds_ = 0;
};

/// Spawns an `all_reduce` on loop `loop` of `rt` and has `t` deliver its channel `ch` to it.
actors::address spawn_all_reduce(actors::runtime& rt, unsigned loop, transport& t, transport::channel ch,
                                 std::vector<int> ranks, std::uint32_t me, actors::address local, std::string name);

}  // namespace nerve::bus::mpi

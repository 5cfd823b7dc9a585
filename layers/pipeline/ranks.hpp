#pragma once
/// \file
/// `rank_link`: what a pipeline needs from a transport to place its stages and replicas on
/// several processes. The pipeline names no transport; `nerve::pipeline_mpi`
/// (`layers/pipeline/mpi_ranks.hpp`) implements this over `bus::mpi::transport`.
///
/// ```
///   rank 0 (stage 0)                                   rank 1 (stage 1)
///   fc2.out ──subscribe(forward_to(1, ch))──► MPI ──► receive_forward(ch, fc3) ─► fc3
///   fc2 ◄── receive_backward(ch', fc2) ◄── MPI ◄──forward... backward_to(0, ch')── fc3.grad[0]
/// ```
/// Every rank builds the same pipeline from the same arguments and wires it in the same
/// order, so both ends of an edge that crosses ranks compute the same channel number
/// without talking. A rank spawns only the gates and layer actors of its own stages.
///
/// Thread safety: wiring calls before traffic, from the thread that builds the pipeline;
/// `all_gather` from outside the loops, on every rank at the same point (a collective).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "actors/runtime.hpp"
#include "bus/signal.hpp"
#include "layers/messages.hpp"

namespace nerve::pipeline {

class rank_link {
 public:
  using channel = std::uint32_t;
  virtual ~rank_link() = default;

  virtual int rank() const noexcept = 0;
  virtual int size() const noexcept = 0;

  /// An endpoint that sends a layer's forwards (gradients) to channel `ch` of rank `to`.
  virtual std::shared_ptr<bus::endpoint<layers::forward_msg>> forward_to(int to, channel ch) = 0;
  virtual std::shared_ptr<bus::endpoint<layers::backward_msg>> backward_to(int to, channel ch) = 0;
  /// Forwards (gradients) arriving on `ch` go into `to`'s mailbox.
  virtual void receive_forward(channel ch, actors::address to) = 0;
  virtual void receive_backward(channel ch, actors::address to) = 0;
  /// The replica group's all-reduce for one layer: an actor on `loop` of `rt` that takes
  /// `local`'s `bus::contribution`s and answers with `bus::reduced` summed over the members
  /// in member order (`ranks[m]`: member m's rank; `me`: this rank's member), the bits of
  /// the in-process `bus::all_reduce`.
  virtual actors::address spawn_reducer(actors::runtime& rt, unsigned loop, channel ch, std::vector<int> ranks,
                                        std::uint32_t me, actors::address local, std::string name) = 0;

  /// Every rank's `mine`, indexed by rank (a collective; off the loops).
  virtual std::vector<std::string> all_gather(const std::string& mine) = 0;
};

}  // namespace nerve::pipeline

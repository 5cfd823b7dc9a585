#pragma once
/// \file
/// `mpi_ranks`: a pipeline's `rank_link` over `bus::mpi::transport` (target
/// `nerve::pipeline_mpi`, built where MPI is found). Forwards and gradients cross as
/// `layers/wire/mpi_codecs.hpp` frames their tensors sent in place; a replica group's
/// all-reduce is `bus::mpi::all_reduce`; `all_gather` is the transport's.
///
/// Channels: the link numbers its channels from `first_channel`, so that other users of the
/// same transport (a second pipeline, a program's own traffic) keep theirs apart.

#include <memory>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "bus/mpi/transport.hpp"
#include "layers/pipeline/ranks.hpp"

namespace nerve::pipeline {

/// Makes the link over `t`, which must outlive it and the pipeline.
std::shared_ptr<rank_link> mpi_ranks(bus::mpi::transport& t, bus::mpi::transport::channel first_channel = 1u << 20);

/// Makes the link over a transport of its own whose poller runs on loop `loop` of `rt`
/// (MPI initialised already, e.g. by a `bus::mpi::session`; no other transport alive): put
/// on the loop of the stage that talks to other ranks, a message crosses with no thread
/// switch, and the trace's arrows bind to the actors' handler runs. It measures the ranks'
/// clock offsets at once, for `write_merged_trace`. A collective (every rank makes its link
/// at the same point). `rt` must outlive the link.
std::shared_ptr<rank_link> mpi_ranks_on(actors::runtime& rt, unsigned loop);

/// Writes one trace of the whole job at `path` (rank 0 writes; every rank calls it, off the
/// loops, once traffic has stopped): `rt`'s recorder of every rank, on rank 0's clock as
/// measured when `link` was made (`bus::mpi::write_merged_trace`). `link` must come from
/// `mpi_ranks_on`.
void write_merged_trace(rank_link& link, actors::runtime& rt, const std::string& path, const nlohmann::json& extra);

}  // namespace nerve::pipeline

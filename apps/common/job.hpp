#pragma once
/// \file
/// The processes of a run: one, or the ranks `mpirun` started. Header-only, for
/// nerve-train and nerve-pipeline.
///
/// Under `mpirun -np N` (N > 1) each rank joins the job: MPI comes up (the transport's own
/// poller thread makes every MPI call), every rank checks that all were started with the
/// same arguments, and the run's stages or replicas are placed on the ranks
/// (`pipeline_options::link`). Rank 0 prints and writes; the others compute alike and
/// write nothing. A failure on one rank ends the whole job: that rank prints its error and
/// leaves at once (`fail`), and `mpirun` takes the others down (docs/distributed.md).
/// Without mpirun, or with one rank, MPI is not started at all.

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>

#include "layers/pipeline/ranks.hpp"
#if NERVE_HAS_MPI
#include "bus/mpi/transport.hpp"
#include "layers/pipeline/mpi_ranks.hpp"
#endif

namespace nerve::apps {

class job {
 public:
  /// Joins the job `mpirun` started, if any, and checks the ranks' arguments agree.
  job(int argc, char** argv) {
    const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
    if (!size) size = std::getenv("PMI_SIZE");
    if (!size || std::atoi(size) <= 1) return;
#if NERVE_HAS_MPI
    transport_ = std::make_unique<bus::mpi::transport>();
    rank_ = transport_->rank();
    size_ = transport_->size();
    link_ = pipeline::mpi_ranks(*transport_);
    std::string args;
    for (int i = 1; i < argc; ++i) args += std::string(i > 1 ? " " : "") + argv[i];
    transport_->agree("the command line", args);
#else
    (void)argc;
    (void)argv;
    throw std::runtime_error("started by mpirun with " + std::string(size) +
                             " ranks, but this build has no MPI (configure with NERVE_ENABLE_MPI=ON)");
#endif
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  bool lead() const noexcept { return rank_ == 0; }
  /// The ranks' link for a pipeline (null in one process), its poller on its own thread.
  std::shared_ptr<pipeline::rank_link> link() const { return link_; }
  /// A link whose poller runs on loop `loop` of `rt` (a collective: every rank at the same
  /// point; null in one process): the stage's messages then cross with no thread switch.
  std::shared_ptr<pipeline::rank_link> link_on([[maybe_unused]] actors::runtime& rt, [[maybe_unused]] unsigned loop) const {
#if NERVE_HAS_MPI
    if (size_ > 1) return pipeline::mpi_ranks_on(rt, loop);
#endif
    return nullptr;
  }

  /// Reports `what` (rank-qualified in a multi-rank job) and, in a multi-rank job, leaves
  /// the process at once: MPI_Finalize would wait for ranks that are still in their step,
  /// while an exit without it makes mpirun end every rank.
  void fail(const char* app, const std::string& what) const {
    if (size_ > 1) {
      std::fprintf(stderr, "%s: rank %d: %s\n", app, rank_, what.c_str());
      std::fflush(stderr);
      std::_Exit(1);
    }
    std::fprintf(stderr, "%s: %s\n", app, what.c_str());
  }

 private:
  int rank_ = 0, size_ = 1;
#if NERVE_HAS_MPI
  std::unique_ptr<bus::mpi::transport> transport_;
#endif
  std::shared_ptr<pipeline::rank_link> link_;
};

}  // namespace nerve::apps

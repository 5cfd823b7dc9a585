#pragma once
/// \file
/// The processes of a run: one, or the ranks `mpirun` started. Header-only, for
/// nerve-train and nerve-pipeline.
///
/// Under `mpirun -np N` (N > 1) each rank joins the job: MPI comes up, every rank checks
/// that all were started with the same arguments, and the run's stages or replicas are
/// placed on the ranks (`pipeline_options::link`, whose transport polls MPI on the stage's
/// loop); `--trace` becomes one merged trace of every rank. Rank 0 prints and writes; the others compute alike and
/// write nothing. A failure on one rank ends the whole job: that rank prints its error and
/// leaves at once (`fail`), and `mpirun` takes the others down (docs/distributed.md).
/// Without mpirun, or with one rank, MPI is not started at all.

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <memory>
#include <stdexcept>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "actors/runtime.hpp"
#include "apps/common/file_digest.hpp"
#include "apps/common/run_control.hpp"
#include "layers/data/dataset.hpp"
#include "layers/pipeline/engine.hpp"
#include "layers/pipeline/ranks.hpp"
#include "layers/presets.hpp"
#include "layers/trainer.hpp"
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
    // MPI comes up here; the run's one transport comes with its link, on the stage's loop
    // (`link_on`): MPI is called from one thread at a time.
    session_ = std::make_unique<bus::mpi::session>();
    rank_ = session_->rank();
    size_ = session_->size();
    std::string args;
    for (int i = 1; i < argc; ++i) args += std::string(i > 1 ? " " : "") + argv[i];
    session_->agree("the command line", args);
#else
    (void)argc;
    (void)argv;
    throw std::runtime_error("started by mpirun with " + std::string(size) +
                             " ranks, but this build has no MPI (configure with NERVE_ENABLE_MPI=ON)");
#endif
  }

  /// Checks that every rank reads the same bytes where the run reads files: the data
  /// files (`--data`: the training pair, and the test pair when the run evaluates) and the
  /// checkpoint it resumes from (`--resume`). With per-host disks each rank reads its own
  /// copy, and one that differs (another seed's checkpoint, one further on, shifted
  /// labels) would train apart from the others, or wait for ever for a step they never
  /// take. A rank's size and FNV-1a hash of each file (`file_digest`) against rank 0's;
  /// throws `std::invalid_argument` naming the file, the option and each rank that
  /// differs, with both digests. A collective, from the thread that made the job, before
  /// the run's link exists; nothing in one process.
  void agree_inputs(const layers::train_options& o) const {
#if NERVE_HAS_MPI
    if (size_ <= 1) return;
    const std::string remedy = "each rank reads its own copy: give every rank the same files";
    if (!o.resume.empty())
      session_->agree("the checkpoint --resume '" + o.resume.string() + "' (size and hash)", file_digest(o.resume),
                      remedy);
    for (const auto which : {data::split::train, data::split::test}) {
      if (which == data::split::test && !o.evaluate) continue;
      const auto& own = which == data::split::train ? o.train_data : o.test_data;
      const char* flag = which == data::split::train ? "--train-data" : "--test-data";
      if (!own.empty()) {
        for (const auto& file : {own.inputs, own.labels})
          session_->agree("the data file '" + file.string() + "' (" + flag + "; size and hash)", file_digest(file), remedy);
        continue;
      }
      if (layers::reads_text(o.model)) continue;  // a corpus is a folder of files: each rank's own, unchecked
      for (const auto& file : data::fashion_mnist_files(o.data, which))
        session_->agree("the data file '" + file.string() + "' (--data; size and hash)", file_digest(file), remedy);
    }
#else
    (void)o;
#endif
  }

  /// This rank's place among the ranks on its machine, and how many there are, as the
  /// launcher says (Open MPI's or MPICH's variables; 0 of 1 without them): what picks a
  /// rank's GPU when none is named.
  static int local_rank() noexcept { return env_int({"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"}, 0); }
  static int local_size() noexcept { return env_int({"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}, 1); }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  bool lead() const noexcept { return rank_ == 0; }
  /// A link whose poller runs on loop `loop` of `rt` (a collective: every rank at the same
  /// point; null in one process): the stage's messages then cross with no thread switch.
  std::shared_ptr<pipeline::rank_link> link_on([[maybe_unused]] actors::runtime& rt, [[maybe_unused]] unsigned loop) const {
#if NERVE_HAS_MPI
    if (size_ > 1) return pipeline::mpi_ranks_on(rt, loop);
#endif
    return nullptr;
  }
  /// Writes the job's one trace through `link` (from `link_on`); every rank calls it.
  void write_trace([[maybe_unused]] pipeline::rank_link& link, [[maybe_unused]] actors::runtime& rt,
                   [[maybe_unused]] const std::string& path, [[maybe_unused]] const nlohmann::json& extra) const {
#if NERVE_HAS_MPI
    pipeline::write_merged_trace(link, rt, path, extra);
#endif
  }

  /// How a pipeline engine takes part in this job (`app` names it in errors): in a
  /// multi-rank job a failed step ends the rank at once (`fail`) and the trace is the
  /// job's merged one; in one process, nothing.
  pipeline::engine_job for_engine(const char* app) const {
    if (size_ <= 1) return {};
    return {[this, app](const std::string& what) { fail(app, what); },
            [this](actors::runtime& rt, pipeline::rank_link& link, const std::string& path, const nlohmann::json& extra) {
              write_trace(link, rt, path, extra);
            },
            // A stop is the job's (`pipeline_engine::agree_stop`): this rank asks with the
            // signal it got, and every rank then ends as the lowest asking rank would,
            // with its signal (`stop_signal`, `stop_rank`).
            [] { return stop_signal ? int(stop_signal) : SIGINT; },
            [](int rank, int signal) {
              stop_rank = rank;
              stop_signal = signal;
            }};
  }

  /// For `pipeline_options::on_stall`: in a multi-rank job, writes this rank's trace so far
  /// to `trace` when given (rank 0's under that name, another rank's with `.rank<N>`
  /// appended: the merged trace would need the stopped rank) and `fail`s the job. Empty in
  /// one process, where the step throws and the run unwinds.
  std::function<void(const std::string&)> on_stall(actors::runtime& rt, std::string trace, const char* app) const {
    if (size_ <= 1) return {};
    return [this, &rt, trace = std::move(trace), app](const std::string& what) {
      if (!trace.empty()) {
        try {
          rt.write_trace(rank_ == 0 ? trace : trace + ".rank" + std::to_string(rank_));
        } catch (const std::exception& e) {
          std::fprintf(stderr, "%s: rank %d: the trace so far was not written: %s\n", app, rank_, e.what());
        }
      }
      fail(app, what);
    };
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
  static int env_int(std::initializer_list<const char*> names, int otherwise) noexcept {
    for (auto* n : names)
      if (const char* v = std::getenv(n)) return std::atoi(v);
    return otherwise;
  }

  int rank_ = 0, size_ = 1;
#if NERVE_HAS_MPI
  std::unique_ptr<bus::mpi::session> session_;
#endif
};

}  // namespace nerve::apps

#pragma once
/// \file
/// One trace of a run across MPI ranks: every rank's recorder, shifted onto rank 0's
/// clock, written by rank 0 as one Chrome trace in which each rank is a process.
///
/// ```
///   start:  offsets = t.clock_offsets();        // every rank, before the traffic
///           rt.trace().enable();
///   ...     traffic: remote<T> sends draw arrows from rank to rank
///   end:    rt.synchronize();  t.flush();        // the traffic has stopped
///           bus::mpi::write_merged_trace(t, rt, "run.trace.json", extra, offsets);  // every rank
/// ```
/// **Alignment.** Each rank's events are timed by its recorder, from its own origin on its
/// own `steady_clock`. `clock_offsets()` tells how far each rank's steady clock is ahead of
/// rank 0's (within half the round trip it was measured in); the merge moves every event
/// of rank k by (origin_k − offset_k) − min over ranks of (origin_j − offset_j), so all
/// ranks share rank 0's clock and the earliest origin is 0. Offsets must be measured at the
/// start, as clocks of different hosts drift apart during a run.
///
/// **Flow ids.** An arrow within a rank keeps the recorder's id space, which every rank
/// reuses; an arrow across ranks carries `cross_rank_flow | sender rank << 40 | n`
/// (transport.hpp). The merged file renumbers both to 1, 2, … (ids a JavaScript viewer
/// reads exactly): per rank for the ones within a rank, by their id for the ones across, so
/// an arrow's two ends keep one id and no two arrows share one.
///
/// The metadata (`nerve`) is described in docs/trace-format.md ("A merged trace").

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bus/mpi/transport.hpp"

namespace nerve::actors {
class runtime;
}

namespace nerve::bus::mpi {

/// One rank's part of a merged trace.
struct rank_trace {
  int rank = 0;
  std::int64_t origin_ns = 0;  ///< the rank's recorder origin on its steady clock (`recorder::origin_ns`)
  nlohmann::json trace;        ///< its Chrome trace (`recorder::to_chrome_trace`)
};

/// What a merge produced.
struct merged_trace_stats {
  std::size_t ranks = 0;
  std::size_t events = 0;             ///< trace events in the merged file
  std::size_t cross_rank_arrows = 0;  ///< flow starts whose id marks an arrow across ranks
};

/// Merges the ranks' traces (indexed by rank, as `offsets`) into one Chrome trace:
/// pid = rank, `process_name` "rank k", times on rank 0's clock, flow ids renumbered (file
/// comment), and the `nerve` metadata merged (docs/trace-format.md). Pure: no MPI, any
/// thread. Throws `std::invalid_argument` when `parts` and `offsets` do not match.
nlohmann::json merge_rank_traces(const std::vector<rank_trace>& parts, const std::vector<clock_offset>& offsets,
                                 merged_trace_stats* stats = nullptr);

/// A collective: every rank calls it, from outside the loops, after its traffic has stopped
/// (`rt.synchronize()`, `t.flush()`). Each rank stops its recorder (`rt.trace()`), waits for
/// what is in flight (`rt.synchronize()`), serialises its trace with `extra` merged into its
/// `nerve` object, and sends it to rank 0 (a gather); rank 0 merges them
/// (`merge_rank_traces`) and writes `path` through a temporary file renamed into place. The
/// recorder is turned back on if it was on. `offsets` are `t.clock_offsets()` as measured at
/// the start of the run. Returns the merge's counts on rank 0 (zeros elsewhere); when rank
/// 0 cannot write the file, every rank throws `std::runtime_error` with its reason.
merged_trace_stats write_merged_trace(transport& t, actors::runtime& rt, const std::string& path,
                                      const nlohmann::json& extra, const std::vector<clock_offset>& offsets);

}  // namespace nerve::bus::mpi

#pragma once
/// \file
/// The critical path of one training step.
///
/// Definition (docs/trace.md explains it with a picture): start at the handler run
/// that ends last in the step. A run could not start before two things: its
/// message had arrived (a flow arrow from the handler run that sent it), and its
/// actor was free (the previous run on the same actor had ended). Follow whichever
/// of the two came later (the binding one; a tie goes to the message), and repeat
/// until a run has neither inside the step. The chain, read forwards, is the
/// critical path: every link has no slack, so shortening any run on it (or any wait
/// between two of its runs) shortens the step. Its length is the time from the first
/// run's start to the last run's end.

#include "apps/trace/analysis.hpp"

#include <string>
#include <vector>

namespace nerve::trace {

/// How a link of the path was reached from the one before it.
enum class path_edge { first, message, actor_busy };

/// One handler run on the critical path.
struct path_link {
  std::uint32_t run = 0;  ///< event index of the handler run
  path_edge via = path_edge::first;
  double wait_us = 0;     ///< time between the previous link's send (or end) and this run's start
  double send_ts = -1;    ///< via message: when the previous link sent it
};

/// The critical path of one step of one process, or of a job's ranks together (pid -1:
/// its links lie on every rank, and message links cross between them).
struct critical_path {
  std::int64_t pid = 0;
  step_window step;
  std::vector<path_link> links;  ///< in time order
  double length_us = 0;          ///< first run's start to last run's end
  double handler_us = 0;         ///< time spent in the runs themselves
  double wait_us = 0;            ///< the rest: queue waits and transfer gaps on the path
};

/// The critical path of `step` (empty `links` when the step has no handler runs).
critical_path find_critical_path(const trace_index& index, const step_window& step);

const char* to_string(path_edge e);

}  // namespace nerve::trace

#pragma once
/// \file
/// Writes a `timeline` back out in the Chrome trace event format (object form), so a
/// merged view can be opened in Perfetto as one file.

#include "apps/trace/timeline.hpp"

#include <ostream>

namespace nerve::trace {

/// Writes `t` as a nerve trace: metadata events naming processes and actors, every
/// event (B/E pairs as X slices), flows with their ids renumbered to be unique across
/// the merged files, and the `nerve` block (actors and stages with their `pid`).
void write_trace(const timeline& t, std::ostream& out);

}  // namespace nerve::trace

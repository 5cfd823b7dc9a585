#pragma once
/// \file
/// Reads Chrome trace event files (object or bare-array form) into a `timeline`,
/// checking them against the format on the way.

#include "apps/trace/diagnostic.hpp"
#include "apps/trace/timeline.hpp"

#include <string>
#include <string_view>
#include <vector>

namespace nerve::trace {

/// The deepest nesting of JSON arrays and objects the reader accepts. Real traces
/// nest a few levels; the bound keeps every later step that walks the JSON
/// recursively (writing `args` back out, the page) far from the end of its stack.
inline constexpr int max_json_depth = 256;

/// Reads the trace in `text` (named `file` in messages) and appends what it finds
/// to `diags`. A JSON syntax error ends the read with an error naming the byte,
/// line and column; every other problem is reported per event and reading goes on,
/// so one run lists all of them. Refused outright, with an error: numbers beyond a
/// double, nesting deeper than `max_json_depth`. Never throws on bad input.
timeline read_trace_text(std::string_view text, const std::string& file, diagnostics& diags);

/// Reads the file at `path` (see `read_trace_text`); a missing file, a directory and a
/// file that cannot be opened or read are errors naming the path and the reason.
timeline read_trace_file(const std::string& path, diagnostics& diags);

/// Reads several files and merges them into one view (pids renumbered on conflict).
timeline read_trace_files(const std::vector<std::string>& paths, diagnostics& diags);

}  // namespace nerve::trace

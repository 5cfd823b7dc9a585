#pragma once
/// \file
/// `nerve-trace html`: one self-contained HTML page (inline script and style, the
/// data embedded as compact column arrays) that draws the trace on a canvas.

#include "apps/trace/analysis.hpp"

#include <ostream>
#include <string>

namespace nerve::trace {

/// Options of `nerve-trace html`.
struct html_options {
  std::string title = "nerve trace";
  selection select;  ///< which step's critical path to highlight (default: the last step)
};

/// What went into the page, for the command to report.
struct html_stats {
  std::size_t lanes = 0;
  std::size_t rows = 0;
  std::size_t events = 0;   ///< drawable items (slices, instants, counter samples, planned actions)
  std::size_t flows = 0;
  std::size_t bytes = 0;
  std::vector<std::string> lane_labels;
  /// Each lane's heading: the process, the stage and loop, and a transformer block's path
  /// (`blocks.3`) for the layers in it.
  std::vector<std::string> lane_groups;
};

/// Writes the page for the view behind `index` to `out`.
html_stats write_html_page(const trace_index& index, const html_options& options, std::ostream& out);

namespace detail {
/// The page template (apps/trace/viewer.html), compiled in.
std::string_view viewer_page();
/// Replaces every `what` in `s` with `with` (filling a page template's placeholders).
void replace_all(std::string& s, const std::string& what, const std::string& with);
/// `s` as HTML text: `<`, `>` and `&` escaped.
std::string html_text(const std::string& s);
}  // namespace detail

}  // namespace nerve::trace

// libFuzzer harness for the trace reader (apps/trace/reader.cpp, detail/reader*.cpp): any input must read
// without throwing and without a sanitizer report, whatever it holds; what it cannot
// use is a diagnostic. A file that reads without errors must also go through every
// later step (the summary in both forms, the page, the merge writer), and what the
// writer writes must read back without errors. Built and run by scripts/fuzz.

#include "apps/trace/html_page.hpp"
#include "apps/trace/reader.hpp"
#include "apps/trace/summary.hpp"
#include "apps/trace/writer.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string_view>

// The page's script is compiled in by CMake from viewer.html; the harness needs only
// its two placeholders, so it brings its own small page.
namespace nerve::trace::detail {
std::string_view viewer_page() { return "<title>NERVE_TRACE_TITLE</title><script>/*NERVE_TRACE_DATA*/</script>"; }
}  // namespace nerve::trace::detail

using namespace nerve::trace;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  diagnostics diags;
  timeline tl = read_trace_text(text, "fuzz-input", diags);
  if (diags.error_count() != 0) return 0;

  trace_index index(tl);
  for (bool last_step : {false, true}) {
    summary_options options;
    if (last_step && !index.steps.empty() && !index.steps.begin()->second.empty()) options.select.step = 0;
    auto s = summarize(index, options);
    std::ostringstream out;
    print_summary(s, tl, out);
    out << to_json(s, tl).dump();
  }
  {
    std::ostringstream page;
    write_html_page(index, {}, page);
  }
  std::ostringstream written;
  write_trace(tl, written);
  diagnostics again;
  read_trace_text(written.str(), "written", again);
  if (again.error_count() != 0) std::abort();  // the writer wrote what the reader refuses
  return 0;
}

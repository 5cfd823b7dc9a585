// The page is self-contained and carries the lanes and data compactly. (That it draws
// in a real browser is tests/trace/browser_test.sh.)

#include "apps/trace/html_page.hpp"
#include "apps/trace/reader.hpp"
#include "apps/trace/synth.hpp"
#include "tests/trace/trace_samples.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <sstream>

using namespace nerve::trace;

TEST_SUITE("trace.html") {
  TEST_CASE("the page needs nothing from the network") {
    diagnostics d;
    auto t = read_trace_text(samples::two_stage, "two_stage.json", d);
    trace_index index(t);
    std::ostringstream out;
    html_options o;
    o.title = "two </script> stages";
    auto stats = write_html_page(index, o, out);
    const auto page = out.str();
    CHECK(page.find("http://") == std::string::npos);
    CHECK(page.find("https://") == std::string::npos);
    CHECK(page.find("<script src") == std::string::npos);
    CHECK(page.find("<link") == std::string::npos);
    CHECK(page.find("@import") == std::string::npos);
    CHECK(page.find("url(") == std::string::npos);
    CHECK(page.find("<canvas") != std::string::npos);
    CHECK(page.find("/*NERVE_TRACE_DATA*/") == std::string::npos);
    // A title cannot close the script element that holds the data.
    CHECK(page.find("two </script> stages") == std::string::npos);
    CHECK(stats.bytes == page.size());
    CHECK(stats.flows == 5);
    // outside, A (+ its mailbox counter), B, and one lane per stage (idle slices).
    std::vector<std::string> expected = {"outside", "stage 0", "A", "A · mailbox", "stage 1", "B"};
    CHECK(stats.lane_labels == expected);
  }

  TEST_CASE("events are embedded as column arrays, not one object per event") {
    synth_options so;
    so.stages = 2;
    so.microbatches = 4;
    so.steps = 3;
    std::ostringstream trace;
    auto truth = write_synthetic_trace(so, trace);
    diagnostics d;
    auto t = read_trace_text(trace.str(), "synth.json", d);
    trace_index index(t);
    std::ostringstream out;
    auto stats = write_html_page(index, {}, out);
    CHECK(stats.events > truth.handler_runs);
    // Far less than the trace itself: a few bytes per item.
    CHECK(stats.bytes < trace.str().size() / 2 + 40000);
    CHECK(out.str().find("\"ph\"") == std::string::npos);
    CHECK(std::count(stats.lane_labels.begin(), stats.lane_labels.end(), "stage 1") == 1);
  }

  TEST_CASE("a transformer's layer lanes come under a heading per block") {
    auto text = samples::two_stage;
    for (auto [from, to] : {std::pair<std::string, std::string>{"\"A\"", "\"blocks.0.attn\""},
                            std::pair<std::string, std::string>{"\"B\"", "\"blocks.12.mlp.fc\""}})
      for (auto at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
        text.replace(at, from.size(), to);
    diagnostics d;
    auto t = read_trace_text(text, "blocks.json", d);
    trace_index index(t);
    std::ostringstream out;
    const auto stats = write_html_page(index, {}, out);
    REQUIRE(stats.lane_groups.size() == stats.lane_labels.size());
    auto group_of = [&](const std::string& label) {
      const auto at = std::find(stats.lane_labels.begin(), stats.lane_labels.end(), label);
      REQUIRE(at != stats.lane_labels.end());
      return stats.lane_groups[std::size_t(at - stats.lane_labels.begin())];
    };
    CHECK(group_of("blocks.0.attn") == "nerve rank 0 · stage 0 · loop 0 · blocks.0");
    CHECK(group_of("blocks.0.attn · mailbox") == "nerve rank 0 · stage 0 · loop 0 · blocks.0");
    CHECK(group_of("blocks.12.mlp.fc") == "nerve rank 0 · stage 1 · loop 1 · blocks.12");
    CHECK(group_of("stage 1") == "nerve rank 0 · stage 1 · loop 1");  // the stage's own lane heads the stage
  }
}

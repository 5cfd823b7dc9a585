// A merged trace of two MPI ranks (bus::mpi::write_merged_trace writes them): the ranks are
// processes of one job, read with their clock offsets; validation checks that arrows
// across processes go forward in time; the summary and the page look at both ranks over
// one window and follow arrows across them for one critical path.
//
//   rank 0 (pid 0)  A: [0 ── 10]  ·  ·  ·  ·  ·  ·  ·  [40 ── 50]
//                          │ s1 at 5                      ▲ f2 at 40
//   rank 1 (pid 1)  B:     └─► f1 [20 ── 30]              │
//                                      s2 at 28 ──────────┘

#include "apps/trace/html_page.hpp"
#include "apps/trace/reader.hpp"
#include "apps/trace/summary.hpp"
#include "apps/trace/writer.hpp"

#include <doctest/doctest.h>

#include <sstream>
#include <string>

using namespace nerve::trace;

namespace {

// `reply_end` moves the end of the reply's arrow (rank 1 -> rank 0); before 28 it points back.
std::string two_ranks(double reply_end = 40, bool with_ranks = true) {
  std::string t = R"({"displayTimeUnit":"ns","traceEvents":[
    {"ph":"M","name":"process_name","pid":0,"tid":0,"args":{"name":"rank 0"}},
    {"ph":"M","name":"process_name","pid":1,"tid":0,"args":{"name":"rank 1"}},
    {"ph":"M","name":"thread_name","pid":0,"tid":1,"args":{"name":"A"}},
    {"ph":"M","name":"thread_name","pid":1,"tid":1,"args":{"name":"B"}},
    {"ph":"X","cat":"handler","name":"forward","pid":0,"tid":1,"ts":0,"dur":10,"args":{"queue_us":0}},
    {"ph":"s","cat":"msg","name":"forward","id":1,"pid":0,"tid":1,"ts":5},
    {"ph":"X","cat":"handler","name":"forward","pid":1,"tid":1,"ts":20,"dur":10,"args":{"queue_us":2}},
    {"ph":"f","bp":"e","cat":"msg","name":"forward","id":1,"pid":1,"tid":1,"ts":20},
    {"ph":"s","cat":"msg","name":"backward","id":2,"pid":1,"tid":1,"ts":28},
    {"ph":"X","cat":"handler","name":"backward","pid":0,"tid":1,"ts":40,"dur":10,"args":{"queue_us":1}},
    {"ph":"f","bp":"e","cat":"msg","name":"backward","id":2,"pid":0,"tid":1,"ts":)" +
                  std::to_string(reply_end) + R"(}],
    "nerve":{"version":1,
      "actors":[{"pid":0,"id":1,"name":"A","loop":0,"stage":0},{"pid":1,"id":1,"name":"B","loop":0,"stage":1}],
      "stages":[{"pid":0,"stage":0,"actors":[1]},{"pid":1,"stage":1,"actors":[1]}])";
  if (with_ranks) t += R"(,"ranks":[{"rank":0,"offset_ns":0,"rtt_ns":0},{"rank":1,"offset_ns":1500,"rtt_ns":4000}])";
  return t + "}}";
}

}  // namespace

TEST_SUITE("trace.ranks") {
  TEST_CASE("a merged trace reads its ranks and counts its arrows across processes") {
    diagnostics d;
    auto t = read_trace_text(two_ranks(), "ranks.json", d);
    CHECK(d.error_count() == 0);
    CHECK(d.warning_count() == 0);
    REQUIRE(t.ranks.size() == 2);
    CHECK(t.ranks[1].pid == 1);
    CHECK(t.ranks[1].offset_ns == 1500);
    CHECK(t.ranks[1].rtt_ns == 4000);
    CHECK(t.flows.size() == 2);
    CHECK(t.cross_process_flows == 2);
    CHECK(t.backward_flows == 0);
    CHECK(t.process_names.at(1) == "rank 1");
  }

  TEST_CASE("nerve-trace merge writes the ranks back: what it reads again is the job it read") {
    diagnostics d;
    auto t = read_trace_text(two_ranks(), "ranks.json", d);
    std::ostringstream out;
    write_trace(t, out);
    diagnostics again;
    auto back = read_trace_text(out.str(), "merged.json", again);
    CHECK(again.error_count() == 0);
    REQUIRE(back.ranks.size() == 2);
    for (std::size_t k = 0; k < 2; ++k) {
      CHECK(back.ranks[k].rank == t.ranks[k].rank);
      CHECK(back.ranks[k].pid == t.ranks[k].pid);
      CHECK(back.ranks[k].offset_ns == t.ranks[k].offset_ns);
      CHECK(back.ranks[k].rtt_ns == t.ranks[k].rtt_ns);
    }
    CHECK(back.cross_process_flows == 2);
  }

  TEST_CASE("an arrow across processes that goes back in time is an error naming both ends") {
    diagnostics d;
    auto t = read_trace_text(two_ranks(/*reply_end*/ 25), "backward.json", d);
    CHECK(d.error_count() == 1);
    CHECK(t.backward_flows == 1);
    CHECK(t.cross_process_flows == 2);  // still matched: reported once, as going backwards
    REQUIRE(!d.items.empty());
    const auto text = d.items.front().to_string();
    CHECK(text.find("arrow across processes") != std::string::npos);
    CHECK(text.find("goes back in time") != std::string::npos);
    CHECK(text.find("pid 1 tid 1") != std::string::npos);
    CHECK(text.find("ends 3 µs earlier") != std::string::npos);
  }

  TEST_CASE("an arrow that ends exactly when it starts goes forward") {
    diagnostics d;
    auto t = read_trace_text(two_ranks(/*reply_end*/ 28), "touching.json", d);
    CHECK(d.error_count() == 0);
    CHECK(t.backward_flows == 0);
  }

  TEST_CASE("the summary groups by rank over the job's window and follows arrows across ranks") {
    diagnostics d;
    auto t = read_trace_text(two_ranks(), "ranks.json", d);
    trace_index index(t);
    CHECK(index.job);
    auto s = summarize(index, {});
    REQUIRE(s.windows.size() == 2);
    for (const auto& [pid, w] : s.windows) {  // one window for both ranks: the job's
      CHECK(w.start == doctest::Approx(0));
      CHECK(w.end == doctest::Approx(50));
    }
    REQUIRE(s.stages.size() == 2);
    CHECK(s.stages[0].pid == 0);
    CHECK(s.stages[0].bubble_pct == doctest::Approx(60));  // busy 20 of 50
    CHECK(s.stages[1].pid == 1);
    CHECK(s.stages[1].bubble_pct == doctest::Approx(80));  // busy 10 of 50
    REQUIRE(s.paths.size() == 1);
    const auto& p = s.paths.front();
    CHECK(p.pid == -1);
    REQUIRE(p.links.size() == 3);
    CHECK(t.events[p.links[0].run].pid == 0);
    CHECK(t.events[p.links[1].run].pid == 1);
    CHECK(p.links[1].via == path_edge::message);
    CHECK(t.events[p.links[2].run].pid == 0);
    CHECK(p.links[2].via == path_edge::message);
    CHECK(p.length_us == doctest::Approx(50));

    std::ostringstream out;
    print_summary(s, t, out);
    CHECK(out.str().find("critical path, all ranks") != std::string::npos);
    CHECK(out.str().find("rank 1, clock 1.500 µs ahead of rank 0's (± 2.000)") != std::string::npos);
    const auto j = to_json(s, t);
    CHECK(j["processes"][1]["rank"]["offset_ns"] == 1500);
    CHECK(j["critical_paths"][0]["links"][1]["pid"] == 1);
  }

  TEST_CASE("without ranks, processes keep a window and a critical path each") {
    diagnostics d;
    auto t = read_trace_text(two_ranks(40, /*with_ranks*/ false), "pids.json", d);
    trace_index index(t);
    CHECK(!index.job);
    auto s = summarize(index, {});
    CHECK(s.paths.size() == 2);
    CHECK(s.windows.at(1).start == doctest::Approx(20));
  }

  TEST_CASE("the page names the ranks' stages and the critical path across them") {
    diagnostics d;
    auto t = read_trace_text(two_ranks(), "ranks.json", d);
    trace_index index(t);
    html_options o;
    o.title = "ranks";
    std::ostringstream page;
    write_html_page(index, o, page);
    const auto html = page.str();
    CHECK(html.find("critical path (all ranks, step 0): 50.0 µs over 3 runs") != std::string::npos);
    CHECK(html.find("rank 1 stage 1 bubble 80.0%") != std::string::npos);
    CHECK(html.find("rank 0 · stage 0") != std::string::npos);  // lanes grouped per rank
  }
}

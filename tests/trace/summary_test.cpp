// The summary on a small hand-made trace whose numbers are worked out by hand
// (tests/trace/trace_samples.hpp draws it), and the merge of two traces.

#include "apps/trace/reader.hpp"
#include "apps/trace/summary.hpp"
#include "apps/trace/writer.hpp"
#include "tests/trace/trace_samples.hpp"

#include <doctest/doctest.h>

#include <sstream>

using namespace nerve::trace;

namespace {
const actor_summary& actor(const summary& s, std::int64_t pid, std::int64_t id) {
  for (const auto& a : s.actors)
    if (a.pid == pid && a.tid == id) return a;
  FAIL("no actor " << id << " in pid " << pid);
  return s.actors.front();
}
const stage_summary& stage(const summary& s, std::int64_t pid, std::int32_t id) {
  for (const auto& st : s.stages)
    if (st.pid == pid && st.stage == id) return st;
  FAIL("no stage " << id << " in pid " << pid);
  return s.stages.front();
}

void check_two_stage(const summary& s, std::int64_t pid) {
  const auto& a = actor(s, pid, 1);
  CHECK(a.name == "A");
  CHECK(a.busy_us == doctest::Approx(50));
  CHECK(a.busy_pct == doctest::Approx(62.5));
  CHECK(a.messages_in == 3);
  CHECK(a.messages_out == 2);
  CHECK(a.queue_us.p50 == doctest::Approx(1));   // of {0, 10, 1}: nearest rank 2
  CHECK(a.queue_us.p99 == doctest::Approx(10));  // rank 3
  CHECK(a.queue_us.max == doctest::Approx(10));
  CHECK(a.handler_us.p50 == doctest::Approx(10));
  CHECK(a.handler_us.p99 == doctest::Approx(30));
  const auto& b = actor(s, pid, 2);
  CHECK(b.busy_pct == doctest::Approx(50));
  CHECK(b.messages_in == 2);
  CHECK(b.messages_out == 1);
  CHECK(b.queue_us.p50 == doctest::Approx(1));
  CHECK(b.queue_us.p99 == doctest::Approx(11));
  CHECK(b.handler_us.max == doctest::Approx(20));

  const auto& s0 = stage(s, pid, 0);
  CHECK(s0.window_us == doctest::Approx(80));
  CHECK(s0.bubble_pct == doctest::Approx(37.5));
  CHECK(s0.idle_by_cause.at("input") == doctest::Approx(30));
  CHECK(s0.idle_unattributed_us == doctest::Approx(0));
  const auto& s1 = stage(s, pid, 1);
  CHECK(s1.bubble_pct == doctest::Approx(50));
  CHECK(s1.idle_by_cause.at("input") == doctest::Approx(10));
  CHECK(s1.idle_by_cause.at("backpressure") == doctest::Approx(20));  // 10 µs of its bubble have no idle slice
  CHECK(s1.idle_unattributed_us == doctest::Approx(10));
}

void check_path(const critical_path& p, const timeline& t) {
  REQUIRE(p.links.size() == 4);
  auto who = [&](std::size_t i) {
    const auto& e = t.events[p.links[i].run];
    return t.actor_name(e.pid, e.tid) + " " + t.str(e.name) + " " + std::to_string(e.mb);
  };
  CHECK(who(0) == "A forward 0");
  CHECK(who(1) == "B forward 0");
  CHECK(who(2) == "B forward 1");
  CHECK(who(3) == "A backward 1");
  CHECK(p.links[0].via == path_edge::first);
  CHECK(p.links[1].via == path_edge::message);
  CHECK(p.links[2].via == path_edge::actor_busy);
  CHECK(p.links[3].via == path_edge::message);
  CHECK(p.length_us == doctest::Approx(80));
  CHECK(p.handler_us == doctest::Approx(78));
  CHECK(p.wait_us == doctest::Approx(2));
}
}  // namespace

TEST_SUITE("trace.summary") {
  TEST_CASE("busy, counts, percentiles and bubbles match the hand-worked numbers") {
    diagnostics d;
    auto t = read_trace_text(samples::two_stage, "two_stage.json", d);
    REQUIRE(d.items.empty());
    trace_index index(t);
    auto s = summarize(index, {});
    REQUIRE(s.actors.size() == 2);
    REQUIRE(s.stages.size() == 2);
    check_two_stage(s, 0);
    REQUIRE(s.paths.size() == 1);
    check_path(s.paths[0], t);

    SUBCASE("the slowest messages rank queue wait plus handler time") {
      REQUIRE(s.slowest.size() == 5);
      CHECK(s.slowest[0].queue_us + s.slowest[0].handler_us == doctest::Approx(31));
      CHECK(s.slowest[1].queue_us + s.slowest[1].handler_us == doctest::Approx(31));
      CHECK(s.slowest[2].actor == "B");
      CHECK(s.slowest[2].mb == 0);
      CHECK(s.slowest[4].queue_us + s.slowest[4].handler_us == doctest::Approx(10));
    }
    SUBCASE("the JSON form carries the same numbers") {
      auto j = to_json(s, t);
      CHECK(j["actors"][0]["busy_pct"].get<double>() == doctest::Approx(62.5));
      CHECK(j["stages"][1]["idle_us"]["backpressure"].get<double>() == doctest::Approx(20));
      CHECK(j["critical_paths"][0]["length_us"].get<double>() == doctest::Approx(80));
      CHECK(j["critical_paths"][0]["links"][2]["via"] == "actor busy");
    }
    SUBCASE("the tables name every actor and stage") {
      std::ostringstream out;
      print_summary(s, t, out);
      CHECK(out.str().find("critical path, pid 0 step 0") != std::string::npos);
      CHECK(out.str().find("62.5") != std::string::npos);
    }
  }

  TEST_CASE("a window restricts every figure") {
    diagnostics d;
    auto t = read_trace_text(samples::two_stage, "two_stage.json", d);
    trace_index index(t);
    summary_options o;
    o.select.range = window{0, 40};
    auto s = summarize(index, o);
    CHECK(actor(s, 0, 1).busy_us == doctest::Approx(20));
    CHECK(actor(s, 0, 2).busy_us == doctest::Approx(30));
    CHECK(actor(s, 0, 2).messages_in == 2);
  }

  TEST_CASE("an unknown step selects nothing") {
    diagnostics d;
    auto t = read_trace_text(samples::two_stage, "two_stage.json", d);
    trace_index index(t);
    summary_options o;
    o.select.step = 5;
    auto s = summarize(index, o);
    CHECK(s.windows.empty());
    CHECK(s.paths.empty());
  }
}

TEST_SUITE("trace.merge") {
  TEST_CASE("two traces with the same pid merge into one view with the second renumbered") {
    diagnostics d;
    auto t = read_trace_text(samples::two_stage, "run1.json", d);
    t.append(read_trace_text(samples::two_stage, "run2.json", d));
    REQUIRE(d.items.empty());
    CHECK(t.files.size() == 2);
    CHECK(t.files[1].pid_map.at(0) == 1);
    CHECK(t.flows.size() == 10);
    for (const auto& f : t.flows) CHECK(t.events[f.start].pid == t.events[f.finish].pid);  // no arrow crosses runs
    trace_index index(t);
    auto s = summarize(index, {});
    CHECK(s.actors.size() == 4);
    check_two_stage(s, 0);
    check_two_stage(s, 1);
    REQUIRE(s.paths.size() == 2);
    check_path(s.paths[1], t);

    SUBCASE("exported as one file and read back, the numbers stay") {
      std::ostringstream out;
      write_trace(t, out);
      diagnostics d2;
      auto back = read_trace_text(out.str(), "merged.json", d2);
      INFO((d2.items.empty() ? std::string() : d2.items.front().to_string()));
      CHECK(d2.items.empty());
      CHECK(back.flows.size() == 10);
      trace_index index2(back);
      auto s2 = summarize(index2, {});
      check_two_stage(s2, 0);
      check_two_stage(s2, 1);
      REQUIRE(s2.paths.size() == 2);
      check_path(s2.paths[0], back);
    }
  }

  // Found by tests/fuzz/trace_fuzz.cpp (its own seed): the writer dropped the ids of
  // async slices, so the file it wrote failed validation.
  TEST_CASE("async slices keep their pairing through a merge and write") {
    const std::string text = R"([{"ph":"b","cat":"a","name":"load","pid":1,"tid":2,"ts":5,"id":"x"},
      {"ph":"b","cat":"a","name":"load","pid":1,"tid":2,"ts":6,"id":7},
      {"ph":"e","cat":"a","pid":1,"tid":2,"ts":8,"id":"x"},{"ph":"e","cat":"a","pid":1,"tid":2,"ts":9,"id":7}])";
    diagnostics d;
    auto t = read_trace_text(text, "run1.json", d);
    t.append(read_trace_text(text, "run2.json", d));
    REQUIRE(d.items.empty());
    std::ostringstream out;
    write_trace(t, out);
    diagnostics d2;
    auto back = read_trace_text(out.str(), "merged.json", d2);
    INFO(out.str());
    // Every b has its e: no id missing, and the two files' ids kept apart (a clash
    // would leave an e with no open b).
    CHECK(d2.items.empty());
    CHECK(back.events.size() == 8);
  }
}

// Reading and validating traces: valid files in both forms, and clear errors on
// malformed ones (where, and what is wrong).

#include "apps/trace/reader.hpp"
#include "tests/trace/trace_samples.hpp"

#include <doctest/doctest.h>

using namespace nerve::trace;

namespace {
timeline read(const std::string& text, diagnostics& d) { return read_trace_text(text, "t.json", d); }

std::string all(const diagnostics& d) {
  std::string out;
  for (const auto& item : d.items) out += item.to_string() + "\n";
  return out;
}
}  // namespace

TEST_SUITE("trace.validate") {
  TEST_CASE("a nerve trace reads without findings") {
    diagnostics d;
    auto t = read(samples::two_stage, d);
    INFO(all(d));
    CHECK(d.items.empty());
    CHECK(t.flows.size() == 5);
    CHECK(t.actors.at({0, 1}).name == "A");
    CHECK(t.actors.at({0, 2}).stage == 1);
    CHECK(t.stages.size() == 2);
    CHECK(t.process_names.at(0) == "nerve rank 0");
  }

  TEST_CASE("the bare array form reads, and B/E pairs become slices") {
    diagnostics d;
    auto t = read(R"([{"ph":"B","name":"a","pid":1,"tid":2,"ts":5},{"ph":"E","pid":1,"tid":2,"ts":9},
                      {"ph":"i","name":"mark","pid":1,"tid":2,"ts":6,"s":"t"}])",
                  d);
    INFO(all(d));
    CHECK(d.items.empty());
    REQUIRE(t.events.size() == 2);
    CHECK(t.events[0].ph == 'X');
    CHECK(t.events[0].dur == doctest::Approx(4));
  }

  TEST_CASE("an array without its closing bracket is accepted with a warning") {
    diagnostics d;
    auto t = read("[{\"ph\":\"X\",\"name\":\"a\",\"pid\":1,\"tid\":1,\"ts\":1,\"dur\":2},\n", d);
    CHECK(d.error_count() == 0);
    CHECK(d.mentions("no closing ']'"));
    CHECK(t.events.size() == 1);
  }

  TEST_CASE("truncated JSON is an error naming the byte, line and column") {
    diagnostics d;
    std::string text = samples::two_stage.substr(0, 700);
    read(text, d);
    INFO(all(d));
    REQUIRE(d.error_count() == 1);
    CHECK(d.mentions("t.json: error: byte"));
    CHECK(d.mentions("line "));
    CHECK(d.mentions("truncated"));
  }

  TEST_CASE("syntax errors in the middle name the place") {
    diagnostics d;
    read("{\"traceEvents\": [{\"ph\": \"X\",, }]}", d);
    REQUIRE(d.error_count() == 1);
    CHECK(d.mentions("column"));
    CHECK_FALSE(d.mentions("truncated"));
  }

  TEST_CASE("missing fields are errors with the event index and the field") {
    diagnostics d;
    read(R"({"traceEvents":[
      {"ph":"X","name":"ok","pid":0,"tid":1,"ts":0,"dur":1},
      {"ph":"X","name":"no dur","pid":0,"tid":1,"ts":0},
      {"name":"no ph","pid":0,"tid":1,"ts":0},
      {"ph":"i","name":"no ts","pid":0,"tid":1},
      {"ph":"X","name":"no pid","tid":1,"ts":0,"dur":1},
      {"ph":"s","name":"no id","pid":0,"tid":1,"ts":0},
      {"ph":"C","name":"no args","pid":0,"tid":1,"ts":0}
    ]})",
         d);
    INFO(all(d));
    CHECK(d.mentions("event 1: error: ph \"X\" name \"no dur\": a complete event (X) needs \"dur\""));
    CHECK(d.mentions("event 2: error: missing \"ph\""));
    CHECK(d.mentions("event 3: error: ph \"i\" name \"no ts\": missing \"ts\""));
    CHECK(d.mentions("event 4: error: ph \"X\" name \"no pid\": missing \"pid\""));
    CHECK(d.mentions("event 5: error: ph \"s\" name \"no id\": a flow event needs \"id\""));
    CHECK(d.mentions("event 6: error: ph \"C\" name \"no args\": a counter (C) needs \"args\""));
    CHECK(d.error_count() == 6);
  }

  TEST_CASE("unknown phases and wrong types are errors") {
    diagnostics d;
    read(R"({"traceEvents":[
      {"ph":"Q","name":"what","pid":0,"tid":1,"ts":0},
      {"ph":"X","name":"a","pid":0,"tid":1,"ts":"12","dur":1},
      {"ph":"X","name":"b","pid":0,"tid":1,"ts":1,"dur":-3},
      {"ph":"X","name":"c","pid":0,"tid":1,"ts":1,"dur":1,"args":[1]},
      42
    ]})",
         d);
    INFO(all(d));
    CHECK(d.mentions("event 0: error: unknown phase \"Q\""));
    CHECK(d.mentions("event 1: error: ph \"X\" name \"a\": \"ts\" must be a number (µs), got string \"12\""));
    CHECK(d.mentions("event 2: error: ph \"X\" name \"b\": negative \"dur\""));
    CHECK(d.mentions("event 3: error: ph \"X\" name \"c\": \"args\" must be an object"));
    CHECK(d.mentions("event 4: error: an event must be a JSON object, got number"));
  }

  TEST_CASE("flows must start before they end") {
    diagnostics d;
    auto t = read(R"({"traceEvents":[
      {"ph":"X","name":"h","pid":0,"tid":1,"ts":0,"dur":10},
      {"ph":"s","cat":"msg","name":"m","pid":0,"tid":1,"ts":5,"id":7},
      {"ph":"f","bp":"e","cat":"msg","name":"m","pid":0,"tid":2,"ts":6,"id":7},
      {"ph":"f","bp":"e","cat":"msg","name":"m","pid":0,"tid":2,"ts":8,"id":8},
      {"ph":"s","cat":"msg","name":"lost","pid":0,"tid":1,"ts":9,"id":9}
    ]})",
                  d);
    INFO(all(d));
    CHECK(t.flows.size() == 1);
    CHECK(d.mentions("event 3: error: flow end (f) with id 8 at ts 8 has no start (s)"));
    CHECK(d.mentions("event 4: warning: flow \"lost\" with id 9 starts (s) but never ends"));
    CHECK(d.error_count() == 1);
    CHECK(d.warning_count() == 1);
  }

  TEST_CASE("an end without a begin is an error; a begin without an end a warning") {
    diagnostics d;
    auto t = read(R"([
      {"ph":"E","pid":0,"tid":1,"ts":3},
      {"ph":"B","name":"open","pid":0,"tid":2,"ts":1},
      {"ph":"X","name":"x","pid":0,"tid":2,"ts":1,"dur":9}
    ])",
                  d);
    INFO(all(d));
    CHECK(d.mentions("event 0: error: E (end) on pid 0 tid 1 at ts 3 has no open B"));
    CHECK(d.mentions("event 1: warning: B (begin) \"open\" on pid 0 tid 2 never ends"));
    REQUIRE(t.events.size() == 2);
    CHECK(t.events[0].dur == doctest::Approx(9));  // runs to the end of the trace
  }

  TEST_CASE("an object without traceEvents is an error") {
    diagnostics d;
    read(R"({"events":[]})", d);
    CHECK(d.mentions("no \"traceEvents\" array"));
  }

  TEST_CASE("a missing file is an error") {
    diagnostics d;
    read_trace_file("/nonexistent/trace.json", d);
    CHECK(d.mentions("/nonexistent/trace.json: error: cannot open the file"));
  }
}

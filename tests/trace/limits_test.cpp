// What the reader refuses: values no later step can hold (numbers beyond a double,
// times outside 0..max_time_us, arguments outside their type), nesting deep enough to
// overflow a recursive walk, and paths that are not readable files. Each is an error
// naming the file and, where there is one, the event and the field; none throws.

#include "apps/trace/reader.hpp"

#include <doctest/doctest.h>

#include <filesystem>
#include <string>

using namespace nerve::trace;

namespace {
timeline read_text(const std::string& text, diagnostics& d) { return read_trace_text(text, "t.json", d); }

std::string all_findings(const diagnostics& d) {
  std::string out;
  for (const auto& item : d.items) out += item.to_string() + "\n";
  return out;
}

// One complete event with `fields` spliced in after its name.
std::string one_event(const std::string& fields) {
  return R"({"traceEvents":[{"ph":"X","name":"a","pid":0,"tid":1,)" + fields + "}]}";
}

// An `X` event whose args hold `depth` nested arrays.
std::string nested_args(std::size_t depth) {
  return one_event(R"("ts":1,"dur":1,"args":{"x":)" + std::string(depth, '[') + std::string(depth, ']') + "}");
}
}  // namespace

TEST_SUITE("trace.limits") {
  TEST_CASE("a number beyond a double is an error naming the event and the field") {
    SUBCASE("1e400") {
      diagnostics d;
      read_text(one_event(R"("ts":1e400,"dur":1)"), d);
      INFO(all_findings(d));
      REQUIRE(d.error_count() == 1);
      CHECK(d.mentions("t.json: event 0: error: \"ts\": a number too large for a double"));
      CHECK(d.mentions("'1e400'"));
    }
    SUBCASE("a million digits, clipped in the message") {
      diagnostics d;
      read_text(one_event(R"("ts":1,"dur":1)" + std::string(1000000, '9')), d);
      INFO(all_findings(d).substr(0, 400));
      REQUIRE(d.error_count() == 1);
      CHECK(d.mentions("event 0: error: \"dur\": a number too large for a double"));
      CHECK(d.items.front().message.size() < 300);
    }
    SUBCASE("in the bare array form, after an event that reads") {
      diagnostics d;
      read_text(R"([{"ph":"i","name":"a","pid":0,"tid":1,"ts":1},{"ph":"i","name":"b","pid":0,"tid":1,"ts":-1e999}])", d);
      INFO(all_findings(d));
      CHECK(d.mentions("event 1: error: \"ts\": a number too large for a double"));
    }
  }

  TEST_CASE("nesting deeper than max_json_depth is refused, and no later walk overflows") {
    SUBCASE("100,000 levels") {
      diagnostics d;
      read_text(nested_args(100000), d);
      INFO(all_findings(d));
      REQUIRE(d.error_count() == 1);
      CHECK(d.mentions("t.json: event 0: error: JSON nested deeper than 256 levels"));
    }
    SUBCASE("outside the event array") {
      diagnostics d;
      read_text(R"({"traceEvents":[],"nerve":)" + std::string(5000, '[') + std::string(5000, ']') + "}", d);
      INFO(all_findings(d));
      CHECK(d.mentions("t.json: error: JSON nested deeper than 256 levels"));
    }
    SUBCASE("just inside the bound the file reads, its args kept as text") {
      diagnostics d;
      // The event array and the event object take two levels, args and "x" two more.
      auto t = read_text(nested_args(max_json_depth - 4), d);
      INFO(all_findings(d));
      CHECK(d.items.empty());
      REQUIRE(t.events.size() == 1);
      CHECK(t.extras.at(t.events[0].extra).size() > std::size_t(2 * (max_json_depth - 4)));
    }
    SUBCASE("one level more is refused") {
      diagnostics d;
      read_text(nested_args(max_json_depth - 3), d);
      CHECK(d.mentions("nested deeper than"));
    }
  }

  TEST_CASE("times outside 0 to max_time_us are errors naming the event and the range") {
    diagnostics d;
    read_text(R"({"traceEvents":[
      {"ph":"X","name":"huge","pid":0,"tid":1,"ts":1e308,"dur":1},
      {"ph":"X","name":"negative","pid":0,"tid":1,"ts":-5,"dur":1},
      {"ph":"X","name":"sum overflows","pid":0,"tid":1,"ts":1e15,"dur":1e308},
      {"ph":"X","name":"ends late","pid":0,"tid":1,"ts":3.9e15,"dur":2e14},
      {"ph":"i","name":"instant","pid":0,"tid":1,"ts":5e15},
      {"ph":"X","name":"queue","pid":0,"tid":1,"ts":1,"dur":1,"args":{"queue_us":-2}},
      {"ph":"X","name":"fine","pid":0,"tid":1,"ts":3.9e15,"dur":1e14}
    ]})",
         d);
    INFO(all_findings(d));
    CHECK(d.mentions("event 0: error: ph \"X\" name \"huge\": \"ts\" 1e+308 is out of range: times must lie from 0 to 4e+15 µs"));
    CHECK(d.mentions("event 1: error: ph \"X\" name \"negative\": \"ts\" -5 is out of range"));
    CHECK(d.mentions("event 2: error: ph \"X\" name \"sum overflows\": \"dur\" 1e+308 ends the event after 4e+15 µs"));
    CHECK(d.mentions("event 3: error: ph \"X\" name \"ends late\": \"dur\""));
    CHECK(d.mentions("event 4: error: ph \"i\" name \"instant\": \"ts\" 5e+15 is out of range"));
    CHECK(d.mentions("event 5: error: ph \"X\" name \"queue\": \"args.queue_us\" -2 is out of range"));
    CHECK(d.error_count() == 6);
  }

  TEST_CASE("numbers outside their field's type are errors, not clipped") {
    diagnostics d;
    read_text(R"({"traceEvents":[
      {"ph":"X","name":"mb","pid":0,"tid":1,"ts":1,"dur":1,"args":{"mb":1e300}},
      {"ph":"X","name":"sender","pid":0,"tid":1,"ts":1,"dur":1,"args":{"sender":18446744073709551615}},
      {"ph":"X","name":"stage","pid":0,"tid":1,"ts":1,"dur":1,"args":{"stage":-2147483649}},
      {"ph":"X","name":"pid","pid":1e300,"tid":1,"ts":1,"dur":1},
      {"ph":"M","name":"thread_sort_index","pid":0,"tid":1,"args":{"sort_index":-1e30}},
      {"ph":"s","name":"flow","pid":0,"tid":1,"ts":1,"id":1e300},
      {"ph":"f","bp":"e","name":"flow","pid":0,"tid":1,"ts":2,"id":1e300}
    ],"nerve":{"version":1,"schedule":{"stages":1,"chunks":5000,"actions":[[{"op":"F","mb":0,"chunk":1e12}]]}}})",
         d);
    INFO(all_findings(d));
    CHECK(d.mentions("event 0: error: ph \"X\" name \"mb\": \"args.mb\" 1e+300 is out of range: it must be an integer from -2^31 to 2^31-1"));
    CHECK(d.mentions("event 1: error: ph \"X\" name \"sender\": \"args.sender\" 18446744073709551615 is out of range"));
    CHECK(d.mentions("event 2: error: ph \"X\" name \"stage\": \"args.stage\" -2147483649 is out of range"));
    CHECK(d.mentions("event 3: error: \"pid\" 1e+300 is out of range: it must be an integer from -2^63 to 2^63-1"));
    CHECK(d.mentions("event 4: error: ph \"M\" name \"thread_sort_index\": needs a numeric \"args.sort_index\""));
    CHECK(d.mentions("error: nerve: \"chunks\" 5000"));
    CHECK(d.mentions("error: nerve: \"chunk\" 1000000000000.0 in {\"chunk\""));
    CHECK(d.error_count() == 7);  // the flow's id, too large for 64 bits, matches by its text
  }

  TEST_CASE("a directory, a missing file and an unreadable file are errors naming the path") {
    SUBCASE("a directory") {
      const auto dir = std::filesystem::temp_directory_path().string();
      diagnostics d;
      read_trace_file(dir, d);
      INFO(all_findings(d));
      CHECK(d.mentions(dir + ": error: cannot read it: it is a directory"));
    }
    SUBCASE("a missing file") {
      diagnostics d;
      read_trace_file("/nonexistent/trace.json", d);
      CHECK(d.mentions("/nonexistent/trace.json: error: cannot open the file: no such file"));
    }
    SUBCASE("a file whose read fails") {
      // Reading this process's memory from offset 0 fails with EIO on Linux, whoever runs it.
      if (!std::filesystem::exists("/proc/self/mem")) return;
      diagnostics d;
      read_trace_file("/proc/self/mem", d);
      INFO(all_findings(d));
      CHECK(d.mentions("/proc/self/mem: error: cannot read the file"));
    }
  }
}

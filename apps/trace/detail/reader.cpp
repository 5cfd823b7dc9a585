// Driving the JSON parser over one trace file: the event array found in either form,
// each element handed to `convert` as it completes (and then dropped), an unclosed bare
// array retried, and what the parser refuses turned into errors.
#include "apps/trace/detail/reader.hpp"

#include "apps/trace/detail/json_values.hpp"
#include "apps/trace/reader.hpp"

#include <algorithm>

namespace nerve::trace::detail {
namespace {

// Thrown from the parse callback to stop reading a file nerve-trace refuses.
struct refused {
  std::int64_t event;
  std::string what;
};

// Where an error at `byte` sits, for a human: line and column (1-based).
std::string locate(std::string_view text, std::size_t byte) {
  byte = std::min(byte, text.size());
  std::size_t line = 1, column = 1;
  for (std::size_t i = 0; i < byte; ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return "byte " + std::to_string(byte) + " (line " + std::to_string(line) + ", column " + std::to_string(column) + ")";
}

}  // namespace

timeline reader::read(std::string_view text) {
  out_.files.push_back({file_, false, {}});
  // Both parses (the retry too) can stop on a value nerve-trace refuses; what was
  // read before it stays, as after a syntax error, and the error fails the file.
  try {
    json root;
    try {
      root = json::parse(text.begin(), text.end(),
                         [this](int depth, json::parse_event_t ev, json& parsed) { return on_parse(depth, ev, parsed); });
    } catch (const json::parse_error& e) {
      if (!retry_unclosed_array(text, root)) {
        std::string hint = e.byte >= text.size() ? " — the file ends early; is it truncated?" : "";
        diags_.error(file_, -1, locate(text, e.byte == 0 ? 0 : e.byte - 1) + ": invalid JSON: " + plain(e.what()) + hint +
                                    " (" + std::to_string(event_count_) + " events read before it)");
        return std::move(out_);
      }
    }
    finish(root);
  } catch (const refused& r) {
    error(r.event, r.what);
  } catch (const json::out_of_range& e) {
    // The lexer throws this for a number beyond a double (1e400, a million digits).
    error(current_event(), field_text() + "a number too large for a double (beyond ±1.8e308): " + number_in(e.what()) +
                               "; refused, as it has no finite value");
  } catch (const json::exception& e) {
    error(current_event(), std::string("cannot read the JSON: ") + clipped(plain(e.what()), 200));
  }
  return std::move(out_);
}

std::string reader::field_text() const {
  return last_key_.empty() ? std::string() : in_quotes(clipped(last_key_)) + ": ";
}

std::string reader::number_in(const std::string& what) {
  auto open = what.find('\'');
  auto close = what.rfind('\'');
  if (open == std::string::npos || close <= open) return clipped(plain(what), 80);
  std::string quoted(1, '\'');  // appended piece by piece: "'" + std::string trips GCC 12's -Wrestrict (bug 105329)
  quoted += clipped(std::string_view(what).substr(open + 1, close - open - 1));
  quoted += '\'';
  return quoted;
}

std::string reader::plain(const std::string& what) {
  // nlohmann prefixes "[json.exception.parse_error.101] parse error at line 1, column 5: "
  auto colon = what.find(": ");
  return colon == std::string::npos ? what : what.substr(colon + 2);
}

bool reader::retry_unclosed_array(std::string_view text, json& root) {
  auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos || text[first] != '[') return false;
  auto last = text.find_last_not_of(" \t\r\n");
  if (last == std::string_view::npos || text[last] == ']') return false;
  std::string fixed(text.substr(0, last + 1));
  if (fixed.back() == ',') fixed.pop_back();
  fixed += "]";
  auto saved_files = out_.files;
  out_ = timeline();
  out_.files = saved_files;
  pending_.clear();
  async_ids_.clear();
  event_count_ = 0;
  events_depth_ = -1;
  expect_events_array_ = false;
  in_events_ = false;
  last_key_.clear();
  try {
    root = json::parse(fixed, [this](int depth, json::parse_event_t ev, json& parsed) { return on_parse(depth, ev, parsed); });
  } catch (const json::parse_error&) {
    return false;
  }
  diags_.warning(file_, -1, "the event array has no closing ']' (allowed by the format for traces cut short)");
  return true;
}

bool reader::on_parse(int depth, json::parse_event_t ev, json& parsed) {
  using pe = json::parse_event_t;
  if (ev == pe::key) last_key_ = parsed.is_string() ? parsed.get_ref<const std::string&>() : std::string();
  // The parser itself keeps its own stack, but dumping `args` and destroying values
  // recurse: refuse deep nesting here, before any of that runs.
  if ((ev == pe::object_start || ev == pe::array_start) && depth >= max_json_depth)
    throw refused{current_event(), "JSON nested deeper than " + std::to_string(max_json_depth) +
                                       " levels of arrays and objects; refused (traces nest a few levels)"};
  if (depth == 0 && ev == pe::array_start) {  // bare array form
    events_depth_ = 1;
    in_events_ = true;
    bare_array_ = true;
    return true;
  }
  if (depth == 1 && ev == pe::key && !bare_array_) {
    expect_events_array_ = parsed.is_string() && parsed.get_ref<const std::string&>() == "traceEvents";
    return true;
  }
  if (depth == 1 && ev == pe::array_start && expect_events_array_) {
    events_depth_ = 2;
    in_events_ = true;
    return true;
  }
  if (!in_events_) return true;
  if (depth == events_depth_ - 1 && ev == pe::array_end) {  // the end of the event array itself
    in_events_ = false;
    return true;
  }
  // An element of the event array is complete: convert it and drop its JSON.
  if (depth == events_depth_ && (ev == pe::object_end || ev == pe::value || ev == pe::array_end)) {
    convert(parsed, event_count_++);
    return false;
  }
  return true;
}

}  // namespace nerve::trace::detail

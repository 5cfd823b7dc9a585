#pragma once
/// \file
/// `reader`: reads one trace file's text into a `timeline`, reporting what breaks the
/// format as it goes (see `read_trace_text`, apps/trace/reader.hpp). One reader per file,
/// used once, on one thread. Its parts live in separate files:
/// - detail/reader.cpp: driving the JSON parser (the event array, an unclosed bare
///   array, what the parser refuses);
/// - detail/reader_events.cpp: each event checked and converted as it completes;
/// - detail/reader_pairing.cpp: the checks that need all events (B/E nesting, flows and
///   async slices that start and end);
/// - detail/reader_nerve.cpp: the `nerve` block (actors, stages, ranks, the planned
///   schedule).

#include "apps/trace/diagnostic.hpp"
#include "apps/trace/timeline.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace nerve::trace::detail {

// Keys for matching flows and async slices: the category, and the id as a number or string.
struct id_key {
  std::uint32_t cat = 0;
  bool is_string = false;
  std::uint64_t value = 0;
  bool operator==(const id_key&) const = default;
};
struct id_key_hash {
  std::size_t operator()(const id_key& k) const {
    return std::hash<std::uint64_t>()(k.value * 0x9e3779b97f4a7c15ULL ^ (std::uint64_t(k.cat) << 1 | k.is_string));
  }
};

/// One trace file's reader (see the file comment).
class reader {
 public:
  reader(const std::string& file, diagnostics& diags) : file_(file), diags_(diags) {}

  /// The timeline of `text`; problems go to the diagnostics. Never throws on bad input.
  timeline read(std::string_view text);

 private:
  using json = nlohmann::json;

  // detail/reader.cpp
  // The event being parsed when the parser stopped (-1 outside the event array).
  std::int64_t current_event() const { return in_events_ ? event_count_ : -1; }
  // The key whose value was being parsed, for messages: `"ts": `.
  std::string field_text() const;
  // The number in nlohmann's "number overflow parsing '...'", clipped.
  static std::string number_in(const std::string& what);
  static std::string plain(const std::string& what);
  // The format lets the bare array form end without its closing ']' (a program
  // that crashed while writing); accept that with a warning, but only there.
  bool retry_unclosed_array(std::string_view text, json& root);
  bool on_parse(int depth, json::parse_event_t ev, json& parsed);

  void error(std::int64_t index, const std::string& what) { diags_.error(file_, index, what); }
  void warning(std::int64_t index, const std::string& what) { diags_.warning(file_, index, what); }

  // detail/reader_events.cpp
  // Numeric or string ids (flows, async slices) into one key space per category.
  bool read_id(const json& e, std::uint32_t cat, id_key& key);
  std::int64_t read_track_id(const json& v, std::int64_t index, const char* field);
  void convert(const json& e, std::int64_t index);
  // Lift the arguments nerve knows into the event; keep the rest as JSON text for
  // details. A known argument out of its type's range is an error (false): clipping
  // it would show a different number than the file holds.
  bool lift_args(event& out, const json& args, char ph, std::int64_t index, const std::string& label);
  void read_metadata(const event& e, const std::string& name, const json& args, std::int64_t index, const std::string& label);

  // detail/reader_pairing.cpp
  // Per-file checks that need all events: B/E nesting per track, and flows
  // (s -> t* -> f) and async slices (b/e) that start and end.
  void finish(const json& root);

  // detail/reader_nerve.cpp
  // The `nerve` block: actors, stages and the planned schedule. Entries carry no pid
  // in format version 1, so they apply to every pid of the file (an optional "pid"
  // field narrows an entry to one process).
  void read_nerve(const json& nerve);

  std::string file_;
  diagnostics& diags_;
  timeline out_;
  std::vector<std::pair<std::uint32_t, id_key>> pending_;  // B/E and keyed events, by position
  std::unordered_map<std::string, std::uint64_t> string_ids_;
  std::unordered_map<id_key, std::uint32_t, id_key_hash> async_ids_;  // (cat, id) -> event::async
  std::unordered_map<std::string, std::int64_t> string_tracks_;
  std::int64_t event_count_ = 0;
  int events_depth_ = -1;
  bool expect_events_array_ = false;
  bool in_events_ = false;
  bool bare_array_ = false;
  std::string last_key_;  // the latest object key parsed, for messages
};

}  // namespace nerve::trace::detail

#include "apps/trace/reader.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <unordered_map>

namespace nerve::trace {
namespace {

using json = nlohmann::json;

// Phases of the Chrome trace event format (the "Trace Event Format" document),
// including the deprecated ones other tools still write.
constexpr std::string_view known_phases = "BEXiICbneSTpFstfPNODMVvRc()=";

bool is_known_phase(char ph) { return known_phases.find(ph) != std::string_view::npos; }

std::string in_quotes(const std::string& s) { return "\"" + s + "\""; }

// At most `n` characters of `s`, marked when cut: keys and numbers can be megabytes long.
std::string clipped(std::string_view s, std::size_t n = 40) {
  return s.size() <= n ? std::string(s) : std::string(s.substr(0, n)) + "… (" + std::to_string(s.size()) + " characters)";
}

// The whole number `v` holds, truncated toward zero as before, if it lies in [lo, hi].
// A float outside the 64-bit range has no such number (casting it would be undefined).
std::optional<std::int64_t> whole_number(const json& v, std::int64_t lo, std::int64_t hi) {
  std::int64_t x = 0;
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return std::nullopt;
    x = static_cast<std::int64_t>(u);
  } else if (v.is_number_integer()) {
    x = v.get<std::int64_t>();
  } else if (v.is_number_float()) {
    const double d = std::trunc(v.get<double>());
    if (!(d >= -0x1p63 && d < 0x1p63)) return std::nullopt;
    x = static_cast<std::int64_t>(d);
  } else {
    return std::nullopt;
  }
  if (x < lo || x > hi) return std::nullopt;
  return x;
}

constexpr std::int64_t int32_min = std::numeric_limits<std::int32_t>::min();
constexpr std::int64_t int32_max = std::numeric_limits<std::int32_t>::max();
constexpr std::int64_t int64_min = std::numeric_limits<std::int64_t>::min();
constexpr std::int64_t int64_max = std::numeric_limits<std::int64_t>::max();
// The planned schedule's shape, bounded far beyond real pipelines.
constexpr std::int64_t max_planned_stages = 65536;
constexpr std::int64_t max_planned_chunks = 1024;

std::string range_text(std::int64_t lo, std::int64_t hi) {
  auto name = [](std::int64_t v) -> std::string {
    if (v == int64_max) return "2^63-1";
    if (v == int64_min) return "-2^63";
    if (v == int32_max) return "2^31-1";
    if (v == int32_min) return "-2^31";
    return std::to_string(v);
  };
  return "an integer from " + name(lo) + " to " + name(hi);
}

// Thrown from the parse callback to stop reading a file nerve-trace refuses.
struct refused {
  std::int64_t event;
  std::string what;
};

std::string type_name(const json& j) {
  if (j.is_string()) return "string " + j.dump();
  return std::string(j.type_name());
}

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

class reader {
 public:
  reader(const std::string& file, diagnostics& diags) : file_(file), diags_(diags) {}

  timeline read(std::string_view text) {
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

 private:
  // The event being parsed when the parser stopped (-1 outside the event array).
  std::int64_t current_event() const { return in_events_ ? event_count_ : -1; }
  // The key whose value was being parsed, for messages: `"ts": `.
  std::string field_text() const { return last_key_.empty() ? std::string() : in_quotes(clipped(last_key_)) + ": "; }
  // The number in nlohmann's "number overflow parsing '...'", clipped.
  static std::string number_in(const std::string& what) {
    auto open = what.find('\'');
    auto close = what.rfind('\'');
    if (open == std::string::npos || close <= open) return clipped(plain(what), 80);
    return "'" + clipped(std::string_view(what).substr(open + 1, close - open - 1)) + "'";
  }

  static std::string plain(const std::string& what) {
    // nlohmann prefixes "[json.exception.parse_error.101] parse error at line 1, column 5: "
    auto colon = what.find(": ");
    return colon == std::string::npos ? what : what.substr(colon + 2);
  }

  // The format lets the bare array form end without its closing ']' (a program
  // that crashed while writing); accept that with a warning, but only there.
  bool retry_unclosed_array(std::string_view text, json& root) {
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

  bool on_parse(int depth, json::parse_event_t ev, json& parsed) {
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

  void error(std::int64_t index, const std::string& what) { diags_.error(file_, index, what); }
  void warning(std::int64_t index, const std::string& what) { diags_.warning(file_, index, what); }

  // Numeric or string ids (flows, async slices) into one key space per category.
  bool read_id(const json& e, std::uint32_t cat, id_key& key) {
    const json* id = nullptr;
    if (auto it = e.find("id"); it != e.end()) id = &*it;
    else if (auto it2 = e.find("id2"); it2 != e.end()) id = &*it2;
    if (!id) return false;
    key.cat = cat;
    if (id->is_number_unsigned()) {
      key.value = id->get<std::uint64_t>();
    } else if (id->is_number_integer()) {
      key.value = static_cast<std::uint64_t>(id->get<std::int64_t>());
    } else if (const double d = id->is_number_float() ? std::trunc(id->get<double>()) : -1; d >= 0 && d < 0x1p64) {
      key.value = static_cast<std::uint64_t>(d);
    } else {  // strings, and numbers no 64-bit id holds, match by their text
      key.is_string = true;
      auto text = id->is_string() ? id->get<std::string>() : id->dump();
      auto [it, fresh] = string_ids_.emplace(text, string_ids_.size());
      key.value = it->second;
    }
    return true;
  }

  std::int64_t read_track_id(const json& v, std::int64_t index, const char* field) {
    if (v.is_number()) {
      if (auto x = whole_number(v, int64_min, int64_max)) return *x;
      error(index, std::string("\"") + field + "\" " + clipped(v.dump()) + " is out of range: it must be " + range_text(int64_min, int64_max));
      return 0;
    }
    if (v.is_string()) {  // some tools write names; give each a stable number
      auto [it, fresh] = string_tracks_.emplace(v.get<std::string>(), 1000000000LL + std::int64_t(string_tracks_.size()));
      return it->second;
    }
    error(index, std::string("\"") + field + "\" must be a number, got " + type_name(v));
    return 0;
  }

  void convert(const json& e, std::int64_t index) {
    if (!e.is_object()) {
      error(index, "an event must be a JSON object, got " + type_name(e));
      return;
    }
    auto ph_it = e.find("ph");
    if (ph_it == e.end()) {
      error(index, "missing \"ph\" (the phase)");
      return;
    }
    if (!ph_it->is_string() || ph_it->get_ref<const std::string&>().size() != 1) {
      error(index, "\"ph\" must be a one-character string, got " + type_name(*ph_it));
      return;
    }
    const char ph = ph_it->get_ref<const std::string&>()[0];
    if (!is_known_phase(ph)) {
      error(index, "unknown phase \"" + std::string(1, ph) + "\" (known: B E X i I C b n e S T p F s t f P N O D M V v R c ( ) =)");
      return;
    }
    std::string label = "ph " + in_quotes(std::string(1, ph));
    event out;
    out.ph = ph;
    out.index = static_cast<std::uint32_t>(index);
    out.file = 0;

    // name
    std::string name;
    if (auto it = e.find("name"); it != e.end()) {
      if (!it->is_string()) error(index, label + ": \"name\" must be a string, got " + type_name(*it));
      else name = it->get<std::string>();
    } else if (ph != 'E' && ph != 'e' && ph != 'f' && ph != 't') {
      error(index, label + ": missing \"name\"");
    }
    if (!name.empty()) label += " name " + in_quotes(name);
    out.name = out_.intern(name);
    if (auto it = e.find("cat"); it != e.end()) {
      if (!it->is_string()) error(index, label + ": \"cat\" must be a string, got " + type_name(*it));
      else out.cat = out_.intern(it->get_ref<const std::string&>());
    }

    // ts, pid, tid
    bool ok = true;
    if (auto it = e.find("ts"); it != e.end()) {
      if (!it->is_number()) {
        error(index, label + ": \"ts\" must be a number (µs), got " + type_name(*it));
        ok = false;
      } else if (const double ts = it->get<double>(); !(ts >= 0 && ts <= max_time_us)) {
        error(index, label + ": \"ts\" " + clipped(it->dump()) + " is out of range: times must lie from 0 to " + number(max_time_us) +
                         " µs (about 127 years)");
        ok = false;
      } else {
        out.ts = ts;
      }
    } else if (ph != 'M') {
      error(index, label + ": missing \"ts\"");
      ok = false;
    }
    if (auto it = e.find("pid"); it != e.end()) out.pid = read_track_id(*it, index, "pid");
    else if (ph != 'M' || name.rfind("process", 0) != 0) {
      error(index, label + ": missing \"pid\"");
      ok = false;
    }
    if (auto it = e.find("tid"); it != e.end()) out.tid = read_track_id(*it, index, "tid");
    else if (std::string_view("BEXsftT").find(ph) != std::string_view::npos) {
      error(index, label + ": missing \"tid\"");
      ok = false;
    }

    const json* args = nullptr;
    if (auto it = e.find("args"); it != e.end()) {
      if (!it->is_object()) error(index, label + ": \"args\" must be an object, got " + type_name(*it));
      else args = &*it;
    }

    switch (ph) {
      case 'X': {
        auto it = e.find("dur");
        if (it == e.end()) {
          error(index, label + ": a complete event (X) needs \"dur\"");
          ok = false;
        } else if (!it->is_number()) {
          error(index, label + ": \"dur\" must be a number (µs), got " + type_name(*it));
          ok = false;
        } else if (it->get<double>() < 0) {
          error(index, label + ": negative \"dur\" " + it->dump());
          ok = false;
        } else if (ok && !(out.ts + it->get<double>() <= max_time_us)) {
          error(index, label + ": \"dur\" " + clipped(it->dump()) + " ends the event after " + number(max_time_us) +
                           " µs (about 127 years), the latest time a trace may hold");
          ok = false;
        } else {
          out.dur = it->get<double>();
        }
        break;
      }
      case 'C':
        if (!args) {
          error(index, label + ": a counter (C) needs \"args\" with numeric values");
          ok = false;
        } else {
          bool first = true;
          for (auto& [k, v] : args->items()) {
            if (!v.is_number()) {
              error(index, label + ": counter value \"" + k + "\" must be a number, got " + type_name(v));
              ok = false;
            } else if (first) {
              out.value = v.get<double>();
              first = false;
            }
          }
        }
        break;
      case 'i':
      case 'I':
        if (auto it = e.find("s"); it != e.end()) {
          if (!it->is_string() || (*it != "g" && *it != "p" && *it != "t"))
            error(index, label + ": instant scope \"s\" must be \"g\", \"p\" or \"t\", got " + it->dump());
        }
        break;
      case 'M': {
        static const std::set<std::string> known = {"process_name", "process_labels", "process_sort_index",
                                                    "process_uptime_seconds", "thread_name", "thread_sort_index",
                                                    "num_cpus", "trace_buffer_overran"};
        if (!known.count(name)) warning(index, label + ": unknown metadata name (ignored)");
        if (!args) {
          error(index, label + ": metadata (M) needs \"args\"");
          ok = false;
        } else {
          read_metadata(out, name, *args, index, label);
        }
        break;
      }
      default:
        break;
    }

    id_key key;
    const bool has_id = read_id(e, out.cat, key);
    if (std::string_view("stf").find(ph) != std::string_view::npos || std::string_view("bneSTpFNOD").find(ph) != std::string_view::npos) {
      if (!has_id) {
        error(index, label + ": a " + std::string(std::string_view("stf").find(ph) != std::string_view::npos ? "flow" : "async/object") +
                         " event needs \"id\" (or \"id2\")");
        ok = false;
      }
    }
    if (ph == 'f') {
      if (auto it = e.find("bp"); it != e.end()) {
        if (*it != "e") error(index, label + ": flow binding point \"bp\" must be \"e\", got " + it->dump());
        else out.bind_enclosing = true;
      }
    }
    if (!ok) return;

    if (args && !lift_args(out, *args, ph, index, label)) return;
    if (ph == 'M') return;  // metadata is kept in the timeline's tables, not as events

    const auto position = static_cast<std::uint32_t>(out_.events.size());
    if (ph == 'B' || ph == 'E') pending_.push_back({position, {}});
    if (has_id && std::string_view("stfbne").find(ph) != std::string_view::npos) pending_.push_back({position, key});
    // Async and object events keep their id (as a number per view) so that writing
    // the trace back pairs them as the file did.
    if (has_id && std::string_view("bneSTpFNOD").find(ph) != std::string_view::npos) {
      out.async = async_ids_.emplace(key, static_cast<std::uint32_t>(async_ids_.size() + 1)).first->second;
      out_.async_ids = static_cast<std::uint32_t>(async_ids_.size());
    }
    out_.events.push_back(out);
  }

  // Lift the arguments nerve knows into the event; keep the rest as JSON text for
  // details. A known argument out of its type's range is an error (false): clipping
  // it would show a different number than the file holds.
  bool lift_args(event& out, const json& args, char ph, std::int64_t index, const std::string& label) {
    bool other = false, ok = true;
    for (const auto& item : args.items()) {
      const std::string& k = item.key();  // not a structured binding: the lambdas below capture them
      const json& v = item.value();
      if (v.is_number()) {
        auto whole = [&](std::int64_t lo, std::int64_t hi) -> std::int64_t {
          if (auto x = whole_number(v, lo, hi)) return *x;
          error(index, label + ": \"args." + k + "\" " + clipped(v.dump()) + " is out of range: it must be " + range_text(lo, hi));
          ok = false;
          return -1;
        };
        auto int32 = [&]() { return static_cast<std::int32_t>(whole(int32_min, int32_max)); };
        if (k == "mb") out.mb = int32();
        else if (k == "queue_us") {
          const double d = v.get<double>();
          if (d >= 0 && d <= max_time_us) {
            out.queue_us = d;
          } else {
            error(index, label + ": \"args.queue_us\" " + clipped(v.dump()) + " is out of range: a wait lies from 0 to " +
                             number(max_time_us) + " µs");
            ok = false;
          }
        }
        else if (k == "bytes") out.bytes = whole(int64_min, int64_max);
        else if (k == "sender") out.sender = whole(int64_min, int64_max);
        else if (k == "to") out.to = whole(int64_min, int64_max);
        else if (k == "loop") out.loop = int32();
        else if (k == "stage") out.stage = int32();
        else if (k == "step") out.step = int32();
        else if (k == "chunk") out.chunk = int32();
        else if (k == "id" && (ph == 's' || ph == 'f' || ph == 't')) {}
        else if (ph != 'C') other = true;
      } else if (v.is_string() && (k == "cause" || k == "reason")) {
        out.cause = out_.intern(v.get_ref<const std::string&>());
      } else if (ph != 'M') {
        other = true;
      }
    }
    if (other) {
      out.extra = static_cast<std::uint32_t>(out_.extras.size());
      out_.extras.push_back(args.dump());
    }
    return ok;
  }

  void read_metadata(const event& e, const std::string& name, const json& args, std::int64_t index, const std::string& label) {
    auto it = args.find(name.find("sort_index") != std::string::npos ? "sort_index" : "name");
    if (name == "process_name" || name == "thread_name") {
      if (it == args.end() || !it->is_string()) {
        error(index, label + ": needs a string \"args.name\"");
        return;
      }
      if (name == "process_name") out_.process_names[e.pid] = it->get<std::string>();
      else {
        auto& a = out_.actors[{e.pid, e.tid}];
        a.pid = e.pid;
        a.tid = e.tid;
        a.name = it->get<std::string>();
      }
    } else if (name == "thread_sort_index") {
      auto sort_index = it == args.end() ? std::nullopt : whole_number(*it, int64_min, int64_max);
      if (!sort_index) {
        error(index, label + ": needs a numeric \"args.sort_index\", " + range_text(int64_min, int64_max));
        return;
      }
      auto& a = out_.actors[{e.pid, e.tid}];
      a.pid = e.pid;
      a.tid = e.tid;
      a.sort_index = *sort_index;
    }
  }

  // Per-file checks that need all events: B/E nesting per track, and flows
  // (s -> t* -> f) and async slices (b/e) that start and end.
  void finish(const json& root) {
    if (!bare_array_) {
      if (!root.is_object()) {
        error(-1, "a trace must be a JSON object with \"traceEvents\" or a JSON array of events");
        return;
      }
      if (auto it = root.find("traceEvents"); it == root.end())
        error(-1, "no \"traceEvents\" array (the object form needs one)");
      else if (!it->is_array())
        error(-1, "\"traceEvents\" must be an array, got " + type_name(*it));
      if (auto it = root.find("displayTimeUnit"); it != root.end() && *it != "ms" && *it != "ns")
        warning(-1, "\"displayTimeUnit\" should be \"ms\" or \"ns\", got " + it->dump());
      if (auto it = root.find("nerve"); it != root.end()) read_nerve(*it);
    }
    auto& ev = out_.events;

    // B/E: sort each track by time (file order breaks ties) and nest.
    std::vector<std::uint32_t> be;
    std::vector<std::uint32_t> keyed;
    std::vector<id_key> keys(ev.size());
    for (auto& [pos, key] : pending_) {
      if (ev[pos].ph == 'B' || ev[pos].ph == 'E') be.push_back(pos);
      else {
        keyed.push_back(pos);
        keys[pos] = key;
      }
    }
    std::stable_sort(be.begin(), be.end(), [&](auto a, auto b) {
      if (ev[a].pid != ev[b].pid) return ev[a].pid < ev[b].pid;
      if (ev[a].tid != ev[b].tid) return ev[a].tid < ev[b].tid;
      return ev[a].ts < ev[b].ts;
    });
    std::vector<bool> drop(ev.size(), false);
    std::vector<std::uint32_t> stack;
    double trace_end = 0;
    for (auto& e : ev) trace_end = std::max(trace_end, e.end());
    auto close_open = [&]() {
      for (auto pos : stack) {
        warning(ev[pos].index, "B (begin) " + in_quotes(out_.str(ev[pos].name)) + " on pid " + std::to_string(ev[pos].pid) + " tid " +
                                   std::to_string(ev[pos].tid) + " never ends; shown as running to the end of the trace");
        ev[pos].ph = 'X';
        ev[pos].dur = std::max(0.0, trace_end - ev[pos].ts);
      }
      stack.clear();
    };
    for (std::size_t i = 0; i < be.size(); ++i) {
      auto pos = be[i];
      if (i > 0 && (ev[be[i - 1]].pid != ev[pos].pid || ev[be[i - 1]].tid != ev[pos].tid)) close_open();
      if (ev[pos].ph == 'B') {
        stack.push_back(pos);
      } else {
        drop[pos] = true;
        if (stack.empty()) {
          error(ev[pos].index, "E (end) on pid " + std::to_string(ev[pos].pid) + " tid " + std::to_string(ev[pos].tid) + " at ts " +
                                   number(ev[pos].ts) + " has no open B (begin) on that track");
          continue;
        }
        auto open = stack.back();
        stack.pop_back();
        if (ev[pos].name && ev[pos].name != ev[open].name)
          warning(ev[pos].index, "E (end) " + in_quotes(out_.str(ev[pos].name)) + " closes B " + in_quotes(out_.str(ev[open].name)) +
                                     " (event " + std::to_string(ev[open].index) + ")");
        ev[open].ph = 'X';
        ev[open].dur = ev[pos].ts - ev[open].ts;
      }
    }
    close_open();

    // Flows and async slices, in time order per key.
    std::stable_sort(keyed.begin(), keyed.end(), [&](auto a, auto b) { return ev[a].ts < ev[b].ts; });
    std::unordered_map<id_key, std::uint32_t, id_key_hash> open_flows, open_async;
    std::vector<std::pair<std::uint32_t, std::uint32_t>> matched;
    std::vector<std::uint32_t> early_ends;  // flow ends met before any start of their id
    for (auto pos : keyed) {
      const auto& e = ev[pos];
      const auto& key = keys[pos];
      const std::string id_text = key.is_string ? "(string id)" : std::to_string(key.value);
      switch (e.ph) {
        case 's': {
          auto [it, fresh] = open_flows.emplace(key, pos);
          if (!fresh) {
            warning(ev[it->second].index, "flow id " + id_text + " starts again (event " + std::to_string(e.index) + ") before it ended");
            it->second = pos;
          }
          break;
        }
        case 't':
          if (!open_flows.count(key)) error(e.index, "flow step (t) with id " + id_text + " has no start (s)");
          break;
        case 'f': {
          auto it = open_flows.find(key);
          if (it == open_flows.end()) {
            early_ends.push_back(pos);  // a start later in time is an arrow going backwards (below)
          } else {
            matched.emplace_back(it->second, pos);
            open_flows.erase(it);
          }
          break;
        }
        case 'b':
          open_async[key] = pos;
          break;
        case 'e':
          if (!open_async.erase(key)) error(e.index, "async end (e) with id " + id_text + " has no begin (b)");
          break;
        default:
          break;
      }
    }
    // An end whose start comes later: an arrow back in time. Across processes (the ranks of
    // a merged trace) the clocks were aligned wrongly; within one, the writer is wrong.
    // Either way an error naming both ends; the pair counts as matched, so it is reported
    // once. An end with no start at all is the plain error.
    for (auto pos : early_ends) {
      const auto& e = ev[pos];
      const auto& key = keys[pos];
      const std::string id_text = key.is_string ? "(string id)" : std::to_string(key.value);
      auto it = open_flows.find(key);
      if (it == open_flows.end()) {
        error(e.index, "flow end (f) with id " + id_text + " at ts " + number(e.ts) + " has no start (s) with that id before it");
        continue;
      }
      const auto& st = ev[it->second];
      const bool across = st.pid != e.pid;
      error(e.index, std::string(across ? "arrow across processes" : "arrow") + " " + in_quotes(out_.str(st.name)) + " (flow id " +
                         id_text + ") goes back in time: it starts at ts " + number(st.ts) + " on pid " + std::to_string(st.pid) +
                         " tid " + std::to_string(st.tid) + " and ends " + number(st.ts - e.ts) + " µs earlier, at ts " +
                         number(e.ts) + " on pid " + std::to_string(e.pid) + " tid " + std::to_string(e.tid) +
                         (across ? " (the ranks' clocks are misaligned: were the offsets measured at the start of the run?)" : ""));
      ++out_.backward_flows;
      matched.emplace_back(it->second, pos);
      open_flows.erase(it);
    }
    for (auto [s, f] : matched) out_.cross_process_flows += ev[s].pid != ev[f].pid;
    std::vector<std::uint32_t> unmatched;
    for (auto& [key, pos] : open_flows) unmatched.push_back(pos);
    std::sort(unmatched.begin(), unmatched.end());
    for (auto pos : unmatched)
      warning(ev[pos].index, "flow " + in_quotes(out_.str(ev[pos].name)) + " with id " + std::to_string(keys[pos].value) +
                                 " starts (s) but never ends (no f): a message still in flight at the end, or lost");
    for (auto& [key, pos] : open_async)
      warning(ev[pos].index, "async slice with id " + std::to_string(key.value) + " begins (b) but never ends (e)");

    // Drop the E events, renumbering the matched flows.
    std::vector<std::uint32_t> new_index(ev.size());
    std::uint32_t n = 0;
    for (std::size_t i = 0; i < ev.size(); ++i) {
      new_index[i] = n;
      if (!drop[i]) ev[n++] = ev[i];
    }
    ev.resize(n);
    std::sort(matched.begin(), matched.end());
    for (auto [s, f] : matched) out_.flows.push_back({new_index[s], new_index[f]});

    // Every pid of this file maps to itself until a merge renumbers it.
    for (auto pid : out_.pids()) out_.files[0].pid_map[pid] = pid;
    for (auto& s : out_.schedules) s.pids = out_.pids();
  }

  static std::string number(double v) {
    std::ostringstream os;
    os << v;
    return os.str();
  }

  // The `nerve` block: actors, stages and the planned schedule. Entries carry no pid
  // in format version 1, so they apply to every pid of the file (an optional "pid"
  // field narrows an entry to one process).
  void read_nerve(const json& nerve) {
    out_.files[0].nerve = true;
    if (!nerve.is_object()) {
      error(-1, "\"nerve\" must be an object");
      return;
    }
    if (auto it = nerve.find("version"); it == nerve.end() || !it->is_number_integer())
      warning(-1, "nerve: missing integer \"version\"");
    else if (*it != 1)
      warning(-1, "nerve: version " + it->dump() + " is newer than this viewer (1); reading what it knows");
    std::set<std::int64_t> file_pids;
    for (auto& e : out_.events) file_pids.insert(e.pid);
    for (auto& [pid, name] : out_.process_names) file_pids.insert(pid);
    if (file_pids.empty()) file_pids.insert(0);
    auto pids_of = [&](const json& entry) -> std::vector<std::int64_t> {
      if (auto it = entry.find("pid"); it != entry.end() && it->is_number_integer())
        if (auto pid = whole_number(*it, int64_min, int64_max)) return {*pid};
      return {file_pids.begin(), file_pids.end()};
    };
    // A numeric field in [lo, hi]; out of range is an error and reads as `fallback`.
    auto int_field = [this](const json& j, const char* k, std::int64_t fallback, std::int64_t lo = int32_min,
                            std::int64_t hi = int32_max) -> std::int64_t {
      auto it = j.find(k);
      if (it == j.end() || !it->is_number()) return fallback;
      if (auto x = whole_number(*it, lo, hi)) return *x;
      error(-1, "nerve: \"" + std::string(k) + "\" " + clipped(it->dump()) + " in " + clipped(j.dump(), 80) +
                    " is out of range: it must be " + range_text(lo, hi));
      return fallback;
    };
    auto str_field = [](const json& j, const char* k) -> std::string {
      auto it = j.find(k);
      return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
    };
    if (auto it = nerve.find("actors"); it != nerve.end()) {
      if (!it->is_array()) error(-1, "nerve.actors must be an array");
      else {
        std::size_t i = 0;
        for (auto& a : *it) {
          std::optional<std::int64_t> id;
          if (a.is_object() && a.contains("id") && a["id"].is_number_integer()) id = whole_number(a["id"], int64_min, int64_max);
          if (!id) {
            error(-1, "nerve.actors[" + std::to_string(i) + "] needs an integer \"id\", " + range_text(int64_min, int64_max));
          } else {
            for (auto pid : pids_of(a)) {
              auto& info = out_.actors[{pid, *id}];
              info.pid = pid;
              info.tid = *id;
              if (auto name = str_field(a, "name"); !name.empty()) info.name = name;
              info.loop = static_cast<std::int32_t>(int_field(a, "loop", info.loop));
              info.stage = static_cast<std::int32_t>(int_field(a, "stage", info.stage));
              info.group = str_field(a, "group");
            }
          }
          ++i;
        }
      }
    }
    if (auto it = nerve.find("stages"); it != nerve.end() && it->is_array()) {
      for (auto& s : *it) {
        if (!s.is_object() || !s.contains("stage")) {
          error(-1, "nerve.stages entries need \"stage\"");
          continue;
        }
        for (auto pid : pids_of(s)) {
          stage_info info;
          info.pid = pid;
          info.stage = static_cast<std::int32_t>(int_field(s, "stage", 0));
          info.loop = static_cast<std::int32_t>(int_field(s, "loop", -1));
          info.device = str_field(s, "device");
          if (auto a = s.find("actors"); a != s.end() && a->is_array())
            for (auto& id : *a)
              if (auto x = id.is_number_integer() ? whole_number(id, int64_min, int64_max) : std::nullopt) info.actors.push_back(*x);
          out_.stages.push_back(std::move(info));
        }
      }
    }
    if (auto it = nerve.find("ranks"); it != nerve.end()) {
      if (!it->is_array()) error(-1, "nerve.ranks must be an array");
      else
        for (auto& r : *it) {
          if (!r.is_object() || !r.contains("rank") || !r["rank"].is_number_integer()) {
            error(-1, "nerve.ranks entries need an integer \"rank\", got " + clipped(r.dump(), 80));
            continue;
          }
          rank_info info;
          info.rank = static_cast<std::int32_t>(int_field(r, "rank", 0, 0, int32_max));
          info.pid = int_field(r, "pid", info.rank, int64_min, int64_max);
          info.offset_ns = int_field(r, "offset_ns", 0, int64_min, int64_max);
          info.rtt_ns = int_field(r, "rtt_ns", 0, 0, int64_max);
          out_.ranks.push_back(info);
        }
    }
    if (auto it = nerve.find("schedule"); it != nerve.end() && it->is_object()) {
      schedule_info s;
      s.name = str_field(*it, "name");
      // Bounded so that playing the plan (chunk * stages + stage) stays far inside 32 bits.
      s.stages = static_cast<std::int32_t>(int_field(*it, "stages", 0, 0, max_planned_stages));
      s.microbatches = static_cast<std::int32_t>(int_field(*it, "microbatches", 0, 0, int32_max));
      s.chunks = static_cast<std::int32_t>(int_field(*it, "chunks", 1, 1, max_planned_chunks));
      if (auto a = it->find("actions"); a != it->end() && a->is_array() && a->size() > std::size_t(max_planned_stages)) {
        error(-1, "nerve.schedule: " + std::to_string(a->size()) + " stages of actions; at most " + std::to_string(max_planned_stages));
      } else if (a != it->end() && a->is_array()) {
        for (auto& stage : *a) {
          auto& list = s.actions.emplace_back();
          if (!stage.is_array()) continue;
          for (auto& act : stage) {
            auto op = str_field(act, "op");
            if (op.size() != 1 || std::string_view("FBW").find(op[0]) == std::string_view::npos) {
              error(-1, "nerve.schedule: action op must be \"F\", \"B\" or \"W\", got " + act.dump());
              continue;
            }
            list.push_back({op[0], static_cast<std::int32_t>(int_field(act, "mb", 0, 0, int32_max)),
                            static_cast<std::int32_t>(int_field(act, "chunk", 0, 0, max_planned_chunks - 1))});
          }
        }
      }
      if (s.stages == 0) s.stages = static_cast<std::int32_t>(s.actions.size());
      out_.schedules.push_back(std::move(s));
    }
  }

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

}  // namespace

timeline read_trace_text(std::string_view text, const std::string& file, diagnostics& diags) {
  return reader(file, diags).read(text);
}

timeline read_trace_file(const std::string& path, diagnostics& diags) {
  auto fail = [&](const std::string& why) {
    diags.error(path, -1, why);
    timeline t;
    t.files.push_back({path, false, {}});
    return t;
  };
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (status.type() == std::filesystem::file_type::not_found) return fail("cannot open the file: no such file");
  if (status.type() == std::filesystem::file_type::directory) return fail("cannot read it: it is a directory, not a trace file");
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail(std::string("cannot open the file: ") + std::strerror(errno));
  // A read error (an unreadable device, an I/O error) throws from inside the stream
  // buffer in libstdc++; turn it into the same kind of error as the rest.
  std::string text;
  try {
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  } catch (const std::ios_base::failure& e) {
    return fail(std::string("cannot read the file: ") + e.what());
  }
  if (in.bad()) return fail("cannot read the file: an I/O error");
  return read_trace_text(text, path, diags);
}

timeline read_trace_files(const std::vector<std::string>& paths, diagnostics& diags) {
  timeline all;
  for (const auto& p : paths) all.append(read_trace_file(p, diags));
  return all;
}

}  // namespace nerve::trace

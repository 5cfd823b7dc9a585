// Each event of a trace checked against the format and converted as it completes: its
// phase, name, times and track, what its phase needs (a duration, counter values, an id),
// the arguments nerve knows lifted into the event, and the metadata kept in the
// timeline's tables.
#include "apps/trace/detail/reader.hpp"

#include "apps/trace/detail/json_values.hpp"

#include <cmath>
#include <optional>
#include <set>

namespace nerve::trace::detail {
namespace {

// Phases of the Chrome trace event format (the "Trace Event Format" document),
// including the deprecated ones other tools still write.
constexpr std::string_view known_phases = "BEXiICbneSTpFstfPNODMVvRc()=";

bool is_known_phase(char ph) { return known_phases.find(ph) != std::string_view::npos; }

}  // namespace

bool reader::read_id(const json& e, std::uint32_t cat, id_key& key) {
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

std::int64_t reader::read_track_id(const json& v, std::int64_t index, const char* field) {
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

void reader::convert(const json& e, std::int64_t index) {
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

bool reader::lift_args(event& out, const json& args, char ph, std::int64_t index, const std::string& label) {
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

void reader::read_metadata(const event& e, const std::string& name, const json& args, std::int64_t index, const std::string& label) {
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

}  // namespace nerve::trace::detail

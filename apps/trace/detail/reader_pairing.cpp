// The checks of one trace file that need all its events: B/E pairs nested per track,
// flows (s -> t* -> f) and async slices (b/e) that start and end, arrows that go back in
// time; then the E events dropped and the matched flows renumbered.
#include "apps/trace/detail/reader.hpp"

#include "apps/trace/detail/json_values.hpp"

#include <algorithm>

namespace nerve::trace::detail {

void reader::finish(const json& root) {
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

}  // namespace nerve::trace::detail

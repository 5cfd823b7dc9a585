#include "bus/mpi/trace.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <stdexcept>
#include <unordered_map>
#include <utility>

#include "actors/recorder.hpp"
#include "actors/runtime.hpp"

namespace nerve::bus::mpi {

using nlohmann::json;

namespace {
// `nerve` keys the merge treats itself; any other key of a rank's metadata (its `extra`)
// goes to the top when every rank has the same value, else to that rank's entry.
bool merged_by_hand(const std::string& key) {
  return key == "version" || key == "actors" || key == "stages" || key == "lost_records";
}
}  // namespace

json merge_rank_traces(const std::vector<rank_trace>& parts, const std::vector<clock_offset>& offsets,
                       merged_trace_stats* stats) {
  if (parts.size() != offsets.size() || parts.empty())
    throw std::invalid_argument("merge_rank_traces: " + std::to_string(parts.size()) + " traces and " +
                                std::to_string(offsets.size()) + " clock offsets (one of each per rank)");
  const std::size_t n = parts.size();
  for (std::size_t k = 0; k < n; ++k)
    if (parts[k].rank != int(k))
      throw std::invalid_argument("merge_rank_traces: trace " + std::to_string(k) + " is rank " +
                                  std::to_string(parts[k].rank) + "'s (they go in rank order)");
  // Each origin on rank 0's clock; the earliest becomes time 0 (a trace has no negative ts).
  std::int64_t base = std::numeric_limits<std::int64_t>::max();
  for (std::size_t k = 0; k < n; ++k) base = std::min(base, parts[k].origin_ns - offsets[k].offset_ns);

  json events = json::array();
  json ranks = json::array();
  json actors = json::array();
  json stages = json::array();
  std::map<std::string, std::vector<std::pair<std::size_t, json>>> others;
  std::unordered_map<std::uint64_t, std::uint64_t> across;  // a cross-rank id -> its id in the file
  std::uint64_t next_id = 0;
  std::size_t arrows = 0;
  std::int64_t lost = 0, worst_rtt = 0;

  for (std::size_t k = 0; k < n; ++k) {
    const auto& p = parts[k];
    const double shift_us = static_cast<double>(p.origin_ns - offsets[k].offset_ns - base) / 1000.0;
    const auto pid = static_cast<std::int64_t>(k);
    events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"tid", 0}, {"args", {{"name", "rank " + std::to_string(k)}}}});
    events.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", pid}, {"tid", 0}, {"args", {{"sort_index", pid}}}});
    std::unordered_map<std::uint64_t, std::uint64_t> within;  // this rank's own ids -> ids in the file
    if (auto it = p.trace.find("traceEvents"); it != p.trace.end() && it->is_array()) {
      for (const auto& original : *it) {
        if (!original.is_object()) continue;
        const auto ph = original.value("ph", std::string());
        if (ph == "M" && original.value("name", std::string()) == "process_name") continue;  // "rank k" above
        json e = original;
        e["pid"] = pid;
        if (auto ts = e.find("ts"); ts != e.end() && ts->is_number()) *ts = ts->get<double>() + shift_us;
        if ((ph == "s" || ph == "t" || ph == "f") && e.contains("id") && e["id"].is_number_integer()) {
          const auto id = e["id"].get<std::uint64_t>();
          auto& ids = (id & cross_rank_flow) != 0 ? across : within;
          auto [slot, fresh] = ids.try_emplace(id, 0);
          if (fresh) slot->second = ++next_id;
          e["id"] = slot->second;
          if (ph == "s" && (id & cross_rank_flow) != 0) ++arrows;
        }
        events.push_back(std::move(e));
      }
    }
    json entry = {{"rank", k}, {"offset_ns", offsets[k].offset_ns}, {"rtt_ns", offsets[k].rtt_ns},
                  {"origin_ns", p.origin_ns}, {"shift_us", shift_us}};
    worst_rtt = std::max(worst_rtt, offsets[k].rtt_ns);
    if (auto nerve = p.trace.find("nerve"); nerve != p.trace.end() && nerve->is_object()) {
      if (auto a = nerve->find("actors"); a != nerve->end() && a->is_array())
        for (auto x : *a) {
          if (!x.is_object()) continue;
          x["pid"] = pid;
          actors.push_back(std::move(x));
        }
      if (auto s = nerve->find("stages"); s != nerve->end() && s->is_array())
        for (auto x : *s) {
          if (!x.is_object()) continue;
          x["pid"] = pid;
          stages.push_back(std::move(x));
        }
      if (auto l = nerve->find("lost_records"); l != nerve->end() && l->is_number_integer()) {
        entry["lost_records"] = *l;
        lost += l->get<std::int64_t>();
      }
      for (auto it = nerve->begin(); it != nerve->end(); ++it)
        if (!merged_by_hand(it.key())) others[it.key()].emplace_back(k, it.value());
    }
    ranks.push_back(std::move(entry));
  }

  json nerve = {{"version", 1},
                {"ranks", std::move(ranks)},
                {"actors", std::move(actors)},
                {"lost_records", lost},
                {"clock", {{"reference_rank", 0}, {"origin_ns", base}, {"error_bound_ns", worst_rtt / 2}}}};
  if (!stages.empty()) nerve["stages"] = std::move(stages);
  for (auto& [key, values] : others) {
    const bool alike = values.size() == n && std::all_of(values.begin(), values.end(),
                                                         [&](const auto& v) { return v.second == values.front().second; });
    if (alike) nerve[key] = values.front().second;
    else
      for (auto& [k, v] : values) nerve["ranks"][k][key] = std::move(v);
  }
  if (stats) *stats = {n, events.size(), arrows};
  return {{"displayTimeUnit", "ns"}, {"traceEvents", std::move(events)}, {"nerve", std::move(nerve)}};
}

merged_trace_stats write_merged_trace(transport& t, actors::runtime& rt, const std::string& path, const json& extra,
                                      const std::vector<clock_offset>& offsets) {
  if (offsets.size() != std::size_t(t.size()))
    throw std::invalid_argument("write_merged_trace: " + std::to_string(offsets.size()) + " clock offsets for " +
                                std::to_string(t.size()) + " ranks (pass t.clock_offsets() from the start of the run)");
  // Off first, then wait: the poller records its own turns while the recorder is on, and a
  // snapshot wants no thread recording. What was sent before the switch is handled (and
  // recorded) by the time synchronize returns.
  auto& rec = rt.trace();
  const bool was_on = rec.enabled();
  rec.enable(false);
  json mine;
  try {
    rt.synchronize();
    mine = {{"rank", t.rank()}, {"origin_ns", rec.origin_ns()}, {"trace", rec.to_chrome_trace(rt.trace_actors(), extra)}};
  } catch (...) {
    if (was_on) rec.enable(true);
    throw;
  }
  if (was_on) rec.enable(true);
  const auto bytes = json::to_cbor(mine);
  mine = nullptr;
  const auto all = t.gather(std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()), 0);

  merged_trace_stats stats;
  std::string error;
  if (t.rank() == 0) {
    try {
      std::vector<rank_trace> parts;
      for (const auto& text : all) {
        auto j = json::from_cbor(text.begin(), text.end());
        parts.push_back({j.at("rank").get<int>(), j.at("origin_ns").get<std::int64_t>(), std::move(j.at("trace"))});
      }
      const auto merged = merge_rank_traces(parts, offsets, &stats);
      actors::write_file_atomically(path, merged.dump());
    } catch (const std::exception& e) {
      error = e.what();
      if (error.empty()) error = "an error without a message";
    }
  }
  // Every rank learns whether the file was written, so that all of them fail alike.
  const auto verdicts = t.all_gather(error);
  if (!verdicts[0].empty()) throw std::runtime_error("merged trace '" + path + "' (rank 0): " + verdicts[0]);
  return stats;
}

}  // namespace nerve::bus::mpi

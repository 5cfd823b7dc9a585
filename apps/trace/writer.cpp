#include "apps/trace/writer.hpp"

#include <nlohmann/json.hpp>

#include <set>

namespace nerve::trace {

namespace {
using json = nlohmann::json;

json event_json(const timeline& t, const event& e) {
  json j;
  j["ph"] = std::string(1, e.ph);
  if (e.name) j["name"] = t.str(e.name);
  if (e.cat) j["cat"] = t.str(e.cat);
  j["ts"] = e.ts;
  j["pid"] = e.pid;
  j["tid"] = e.tid;
  if (e.ph == 'X') j["dur"] = std::max(0.0, e.dur);
  if (e.ph == 'f' && e.bind_enclosing) j["bp"] = "e";
  if (e.ph == 'i' || e.ph == 'I') j["s"] = "t";
  json args = e.extra ? json::parse(t.extras[e.extra]) : json::object();
  if (e.ph == 'C') {
    const auto& name = t.str(e.name);
    args[name == "mailbox" ? "depth" : name == "credits" ? "available" : "value"] = e.value;
  }
  if (e.mb >= 0) args["mb"] = e.mb;
  if (e.queue_us >= 0) args["queue_us"] = e.queue_us;
  if (e.bytes >= 0) args["bytes"] = e.bytes;
  if (e.sender >= 0) args["sender"] = e.sender;
  if (e.to >= 0) args["to"] = e.to;
  if (e.loop >= 0) args["loop"] = e.loop;
  if (e.stage >= 0) args["stage"] = e.stage;
  if (e.step >= 0) args["step"] = e.step;
  if (e.chunk >= 0) args["chunk"] = e.chunk;
  if (e.cause) args[t.str(e.cat) == "drop" ? "reason" : "cause"] = t.str(e.cause);
  if (!args.empty()) j["args"] = std::move(args);
  return j;
}
}  // namespace

void write_trace(const timeline& t, std::ostream& out) {
  json events = json::array();
  for (const auto& [pid, name] : t.process_names)
    events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"tid", 0}, {"args", {{"name", name}}}});
  for (const auto& [key, a] : t.actors) {
    if (!a.name.empty())
      events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", a.pid}, {"tid", a.tid}, {"args", {{"name", a.name}}}});
    if (a.sort_index)
      events.push_back(
          {{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", a.pid}, {"tid", a.tid}, {"args", {{"sort_index", a.sort_index}}}});
  }
  // Flow ids are renumbered: ids from different files may collide after a merge.
  std::vector<std::int64_t> flow_id(t.events.size(), -1);
  std::int64_t next_id = 1;
  for (const auto& f : t.flows) {
    flow_id[f.start] = next_id;
    flow_id[f.finish] = next_id;
    ++next_id;
  }
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    const auto& e = t.events[i];
    if ((e.ph == 's' || e.ph == 'f' || e.ph == 't') && flow_id[i] < 0) continue;  // unmatched: nothing to draw
    json j = event_json(t, e);
    if (flow_id[i] >= 0) j["id"] = flow_id[i];
    if (e.async) j["id"] = e.async;  // async and object events need theirs, to pair as in the file
    events.push_back(std::move(j));
  }
  json nerve = {{"version", 1}, {"actors", json::array()}, {"stages", json::array()}};
  for (const auto& [key, a] : t.actors) {
    if (key.second == 0 || key.second >= gpu_stream_tid_base) continue;
    nerve["actors"].push_back({{"pid", a.pid}, {"id", a.tid}, {"name", a.name}, {"loop", a.loop}, {"stage", a.stage}, {"group", a.group}});
  }
  for (const auto& s : t.stages)
    nerve["stages"].push_back({{"pid", s.pid}, {"stage", s.stage}, {"actors", s.actors}, {"loop", s.loop}, {"device", s.device}});
  // The ranks of a merged job, and how each clock was aligned: `summary` and `html` group by them.
  for (const auto& r : t.ranks)
    nerve["ranks"].push_back({{"pid", r.pid}, {"rank", r.rank}, {"offset_ns", r.offset_ns}, {"rtt_ns", r.rtt_ns}});
  if (!t.schedules.empty()) {
    // Format version 1 has one schedule per file; keep the first (the others are in their files).
    const auto& s = t.schedules.front();
    json actions = json::array();
    for (const auto& list : s.actions) {
      json l = json::array();
      for (const auto& a : list) l.push_back({{"op", std::string(1, a.op)}, {"mb", a.mb}, {"chunk", a.chunk}});
      actions.push_back(std::move(l));
    }
    nerve["schedule"] = {{"name", s.name}, {"stages", s.stages}, {"microbatches", s.microbatches}, {"chunks", s.chunks}, {"actions", actions}};
  }
  json root = {{"displayTimeUnit", "ns"}, {"traceEvents", std::move(events)}, {"nerve", std::move(nerve)}};
  out << root.dump() << '\n';
}

}  // namespace nerve::trace

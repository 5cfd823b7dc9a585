#include "apps/trace/summary.hpp"

#include "apps/trace/schedule_plan.hpp"

#include <algorithm>
#include <cstdio>
#include <set>

namespace nerve::trace {
namespace {

distribution distribution_of(std::vector<double> values) {
  distribution d;
  d.count = values.size();
  if (values.empty()) return d;
  d.p50 = percentile(values, 50);
  d.p99 = percentile(values, 99);
  d.max = values.back();
  return d;
}

std::string fixed(double v, int digits = 1) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string pad(std::string s, std::size_t width, bool right = false) {
  if (s.size() >= width) return s;
  return right ? std::string(width - s.size(), ' ') + s : s + std::string(width - s.size(), ' ');
}

// Planned bubble per stage of a pid: the schedule played with the mean measured F/B/W
// durations of each stage (from `action` slices in the window; in a job, every rank's).
std::map<std::int32_t, double> planned_bubbles(const trace_index& index, std::int64_t pid, const window& w) {
  std::map<std::int32_t, double> out;
  const schedule_info* schedule = nullptr;
  for (const auto& s : index.tl.schedules)
    if (std::find(s.pids.begin(), s.pids.end(), pid) != s.pids.end()) schedule = &s;
  if (!schedule) return out;
  const auto durations = measured_durations(index, *schedule, plan_sources(index, *schedule, pid), w);
  if (!durations) return out;
  auto p = play_schedule(*schedule, *durations);
  if (!p.error.empty()) return out;
  for (std::size_t s = 0; s < p.bubbles.size(); ++s) out[static_cast<std::int32_t>(s)] = p.bubbles[s] * 100.0;
  return out;
}

}  // namespace

summary summarize(const trace_index& index, const summary_options& options) {
  summary out;
  const auto& t = index.tl;
  const auto& ev = t.events;
  for (const auto& f : t.files) out.files.push_back(f.path);
  out.events = ev.size();
  out.flows = t.flows.size();
  for (auto pid : t.pids()) {
    if (auto w = index.window_for(pid, options.select)) out.windows[pid] = *w;
    if (auto it = index.steps.find(pid); it != index.steps.end()) out.step_counts[pid] = it->second.size();
  }
  // Evaluation between epochs: its own phase, apart from the training time the bubbles cover.
  std::map<std::int64_t, std::vector<std::pair<double, double>>> evaluation;
  for (const auto& [pid, w] : out.windows) {
    evaluation[pid] = index.evaluation_in(pid, w);
    if (auto it = index.evaluations.find(pid); it != index.evaluations.end()) {
      for (const auto& [a, b] : it->second) out.evaluation_counts[pid] += b > w.start && a < w.end;
      out.evaluation_us[pid] = union_length(it->second, w);
    }
  }

  // Sends and drops per track.
  const auto drop_cat = t.find("drop");
  const auto idle_cat = t.find("idle");
  std::map<track, std::vector<double>> sends, drops;
  for (const auto& e : ev) {
    if (e.ph == 's') sends[{e.pid, e.tid}].push_back(e.ts);
    else if ((e.ph == 'i' || e.ph == 'I') && drop_cat && e.cat == drop_cat) drops[{e.pid, e.tid}].push_back(e.ts);
  }

  // Actors: every track with handler runs, and every actor the metadata names.
  std::set<track> tracks;
  for (const auto& [tr, runs] : index.handlers)
    if (tr.second < stage_tid_base) tracks.insert(tr);
  for (const auto& [tr, a] : t.actors)
    if (tr.second > 0 && tr.second < gpu_stream_tid_base && (a.stage >= 0 || a.loop >= 0)) tracks.insert(tr);

  std::map<std::pair<std::int64_t, std::int32_t>, std::vector<std::pair<double, double>>> stage_busy;
  std::vector<std::uint32_t> all_runs;
  for (const auto& tr : tracks) {
    auto wit = out.windows.find(tr.first);
    if (wit == out.windows.end()) continue;
    const auto& w = wit->second;
    actor_summary a;
    a.pid = tr.first;
    a.tid = tr.second;
    a.name = t.actor_name(tr.first, tr.second);
    if (auto it = t.actors.find(tr); it != t.actors.end()) a.loop = it->second.loop;
    a.stage = t.actor_stage(tr.first, tr.second);
    std::vector<double> queue, handler;
    std::vector<std::pair<double, double>> spans;
    if (auto it = index.handlers.find(tr); it != index.handlers.end()) {
      for (auto i : it->second) {
        const auto& e = ev[i];
        if (e.end() < w.start || e.ts > w.end) continue;
        spans.emplace_back(e.ts, e.end());
        if (a.stage >= 0) stage_busy[{a.pid, a.stage}].emplace_back(e.ts, e.end());
        if (!w.contains(e.ts)) continue;
        ++a.messages_in;
        handler.push_back(e.dur);
        if (e.queue_us >= 0) queue.push_back(e.queue_us);
        if (a.loop < 0 && e.loop >= 0) a.loop = e.loop;
        all_runs.push_back(i);
      }
    }
    for (auto ts : sends[tr]) a.messages_out += w.contains(ts);
    for (auto ts : drops[tr]) a.dropped += w.contains(ts);
    a.busy_us = union_length(spans, w);
    a.busy_pct = w.length() > 0 ? a.busy_us / w.length() * 100.0 : 0;
    a.queue_us = distribution_of(std::move(queue));
    a.handler_us = distribution_of(std::move(handler));
    out.actors.push_back(std::move(a));
  }

  // Stages.
  std::set<std::pair<std::int64_t, std::int32_t>> stage_keys;
  for (const auto& s : t.stages) stage_keys.insert({s.pid, s.stage});
  for (const auto& a : out.actors)
    if (a.stage >= 0) stage_keys.insert({a.pid, a.stage});
  std::map<std::pair<std::int64_t, std::int32_t>, std::vector<std::pair<double, double>>> idle_spans;
  std::map<std::pair<std::int64_t, std::int32_t>, std::map<std::string, double>> idle_causes;
  for (const auto& e : ev) {
    if (!idle_cat || e.cat != idle_cat || e.ph != 'X') continue;
    const auto stage = index.stage_of(e);
    auto wit = out.windows.find(e.pid);
    if (stage < 0 || wit == out.windows.end()) continue;
    const auto& w = wit->second;
    const double len = std::min(e.end(), w.end) - std::max(e.ts, w.start) -
                       overlap_length({{e.ts, e.end()}}, evaluation[e.pid]);
    if (len <= 0) continue;
    idle_causes[{e.pid, stage}][e.cause ? t.str(e.cause) : std::string("unknown")] += len;
    stage_keys.insert({e.pid, stage});
  }
  std::map<std::int64_t, std::map<std::int32_t, double>> planned;
  for (const auto& [pid, stage] : stage_keys) {
    auto wit = out.windows.find(pid);
    if (wit == out.windows.end()) continue;
    const auto& w = wit->second;
    if (!planned.count(pid)) planned[pid] = planned_bubbles(index, pid, w);
    stage_summary s;
    s.pid = pid;
    s.stage = stage;
    s.window_us = w.length();
    const auto& evaluating = evaluation[pid];
    for (const auto& [a, b] : evaluating) s.evaluation_us += b - a;
    s.training_us = std::max(0.0, s.window_us - s.evaluation_us);
    const auto busy = disjoint_union(std::move(stage_busy[{pid, stage}]), w);
    for (const auto& [a, b] : busy) s.busy_us += b - a;
    s.busy_us = std::max(0.0, s.busy_us - overlap_length(busy, evaluating));
    const double bubble = std::max(0.0, s.training_us - s.busy_us);
    s.bubble_pct = s.training_us > 0 ? bubble / s.training_us * 100.0 : 0;
    s.idle_by_cause = idle_causes[{pid, stage}];
    double explained = 0;
    for (const auto& [cause, us] : s.idle_by_cause) explained += us;
    s.idle_unattributed_us = std::max(0.0, bubble - explained);
    if (auto it = planned[pid].find(stage); it != planned[pid].end()) s.planned_bubble_pct = it->second;
    out.stages.push_back(std::move(s));
  }

  // Critical path: one per process; one for the ranks of a job together.
  if (index.job) {
    if (auto step = index.step_for(-1, options.select)) {
      auto path = find_critical_path(index, *step);
      if (!path.links.empty()) out.paths.push_back(std::move(path));
    }
  }
  for (const auto& [pid, w] : out.windows) {
    if (index.job) break;
    auto step = index.step_for(pid, options.select);
    if (!step) continue;
    auto path = find_critical_path(index, *step);
    if (!path.links.empty()) out.paths.push_back(std::move(path));
  }

  // Slowest messages.
  auto cost = [&](std::uint32_t i) { return std::max(0.0, ev[i].queue_us) + ev[i].dur; };
  const auto top = std::min(options.top, all_runs.size());
  std::partial_sort(all_runs.begin(), all_runs.begin() + static_cast<std::ptrdiff_t>(top), all_runs.end(),
                    [&](auto a, auto b) { return cost(a) > cost(b) || (cost(a) == cost(b) && a < b); });
  for (std::size_t k = 0; k < top; ++k) {
    const auto& e = ev[all_runs[k]];
    slow_message m;
    m.run = all_runs[k];
    m.pid = e.pid;
    m.actor = t.actor_name(e.pid, e.tid);
    m.kind = t.str(e.name);
    m.sender = e.sender >= 0 ? t.actor_name(e.pid, e.sender) : std::string();
    m.mb = e.mb;
    m.ts = e.ts;
    m.queue_us = std::max(0.0, e.queue_us);
    m.handler_us = e.dur;
    out.slowest.push_back(std::move(m));
  }
  return out;
}

namespace {
nlohmann::json dist_json(const distribution& d) {
  return {{"count", d.count}, {"p50", d.p50}, {"p99", d.p99}, {"max", d.max}};
}
}  // namespace

nlohmann::json to_json(const summary& s, const timeline& t) {
  using json = nlohmann::json;
  json out;
  out["files"] = s.files;
  out["events"] = s.events;
  out["flows"] = s.flows;
  json processes = json::array();
  for (const auto& [pid, w] : s.windows) {
    json p = {{"pid", pid}, {"window_us", {w.start, w.end}}};
    if (auto it = t.process_names.find(pid); it != t.process_names.end()) p["name"] = it->second;
    if (auto it = s.step_counts.find(pid); it != s.step_counts.end()) p["steps"] = it->second;
    if (auto it = s.evaluation_counts.find(pid); it != s.evaluation_counts.end()) {
      p["evaluations"] = it->second;
      p["evaluation_us"] = s.evaluation_us.at(pid);
    }
    for (const auto& r : t.ranks)
      if (r.pid == pid) p["rank"] = {{"rank", r.rank}, {"offset_ns", r.offset_ns}, {"rtt_ns", r.rtt_ns}};
    processes.push_back(std::move(p));
  }
  out["processes"] = std::move(processes);
  json actors = json::array();
  for (const auto& a : s.actors)
    actors.push_back({{"pid", a.pid}, {"id", a.tid}, {"name", a.name}, {"loop", a.loop}, {"stage", a.stage},
                      {"busy_us", a.busy_us}, {"busy_pct", a.busy_pct}, {"messages_in", a.messages_in},
                      {"messages_out", a.messages_out}, {"dropped", a.dropped}, {"queue_us", dist_json(a.queue_us)},
                      {"handler_us", dist_json(a.handler_us)}});
  out["actors"] = std::move(actors);
  json stages = json::array();
  for (const auto& st : s.stages) {
    json j = {{"pid", st.pid}, {"stage", st.stage}, {"window_us", st.window_us}, {"evaluation_us", st.evaluation_us},
              {"training_us", st.training_us}, {"busy_us", st.busy_us},
              {"bubble_pct", st.bubble_pct}, {"idle_us", st.idle_by_cause}, {"idle_unattributed_us", st.idle_unattributed_us}};
    j["planned_bubble_pct"] = st.planned_bubble_pct >= 0 ? json(st.planned_bubble_pct) : json(nullptr);
    stages.push_back(std::move(j));
  }
  out["stages"] = std::move(stages);
  json paths = json::array();
  for (const auto& p : s.paths) {
    json links = json::array();
    for (const auto& l : p.links) {
      const auto& e = t.events[l.run];
      links.push_back({{"pid", e.pid}, {"actor", t.actor_name(e.pid, e.tid)}, {"id", e.tid}, {"message", t.str(e.name)}, {"mb", e.mb},
                       {"ts", e.ts}, {"dur", e.dur}, {"via", to_string(l.via)}, {"wait_us", l.wait_us}});
    }
    paths.push_back({{"pid", p.pid}, {"step", p.step.step}, {"step_window_us", {p.step.span.start, p.step.span.end}},
                     {"length_us", p.length_us}, {"handler_us", p.handler_us}, {"wait_us", p.wait_us}, {"links", links}});
  }
  out["critical_paths"] = std::move(paths);
  json slow = json::array();
  for (const auto& m : s.slowest)
    slow.push_back({{"pid", m.pid}, {"actor", m.actor}, {"message", m.kind}, {"sender", m.sender}, {"mb", m.mb},
                    {"ts", m.ts}, {"queue_us", m.queue_us}, {"handler_us", m.handler_us}, {"total_us", m.queue_us + m.handler_us}});
  out["slowest"] = std::move(slow);
  return out;
}

void print_summary(const summary& s, const timeline& t, std::ostream& out) {
  out << "nerve-trace summary: ";
  for (std::size_t i = 0; i < s.files.size(); ++i) out << (i ? ", " : "") << s.files[i];
  out << " (" << s.events << " events, " << s.flows << " messages with flow arrows)\n";
  for (const auto& [pid, w] : s.windows) {
    out << "  pid " << pid;
    if (auto it = t.process_names.find(pid); it != t.process_names.end()) out << " \"" << it->second << "\"";
    out << ": " << fixed(w.start) << " .. " << fixed(w.end) << " µs (" << fixed(w.length() / 1000.0, 3) << " ms)";
    if (auto it = s.step_counts.find(pid); it != s.step_counts.end()) out << ", " << it->second << " step(s)";
    if (auto it = s.evaluation_counts.find(pid); it != s.evaluation_counts.end())
      out << ", " << it->second << " evaluation(s) " << fixed(s.evaluation_us.at(pid) / 1000.0, 3) << " ms";
    for (const auto& r : t.ranks)
      if (r.pid == pid)
        out << ", rank " << r.rank << ", clock " << fixed(static_cast<double>(r.offset_ns) / 1000.0, 3) << " µs ahead of rank 0's (± "
            << fixed(static_cast<double>(r.rtt_ns) / 2000.0, 3) << ")";
    out << "\n";
  }

  out << "\nactors (busy = time in handlers / window; times in µs, p50/p99/max)\n";
  auto triple = [](const distribution& d) { return fixed(d.p50) + " / " + fixed(d.p99) + " / " + fixed(d.max); };
  std::size_t qw = 26;  // the queue-wait column fits its widest entry, so columns never run together
  for (const auto& a : s.actors)
    if (a.queue_us.count) qw = std::max(qw, triple(a.queue_us).size() + 2);
  out << "  " << pad("pid", 4) << pad("actor", 18) << pad("loop", 5, true) << pad("stage", 6, true) << pad("busy%", 8, true)
      << pad("in", 8, true) << pad("out", 8, true) << pad("drop", 6, true) << "   " << pad("queue wait", qw) << "handler time\n";
  for (const auto& a : s.actors) {
    out << "  " << pad(std::to_string(a.pid), 4) << pad(a.name, 18) << pad(std::to_string(a.loop), 5, true)
        << pad(std::to_string(a.stage), 6, true) << pad(fixed(a.busy_pct), 8, true) << pad(std::to_string(a.messages_in), 8, true)
        << pad(std::to_string(a.messages_out), 8, true) << pad(std::to_string(a.dropped), 6, true) << "   "
        << pad(a.queue_us.count ? triple(a.queue_us) : "-", qw) << triple(a.handler_us) << "\n";
  }

  if (!s.stages.empty()) {
    out << "\nstages (training = window - evaluation; bubble = training - busy; idle time by cause from `idle` slices, µs)\n";
    out << "  " << pad("pid", 4) << pad("stage", 6) << pad("window", 12, true) << pad("evaluation", 12, true)
        << pad("busy", 12, true) << pad("bubble%", 9, true)
        << pad("planned%", 10, true) << "   idle by cause\n";
    for (const auto& st : s.stages) {
      std::string causes;
      for (const auto& [cause, us] : st.idle_by_cause) causes += cause + " " + fixed(us) + "  ";
      if (st.idle_unattributed_us > 0.05) causes += "unattributed " + fixed(st.idle_unattributed_us);
      out << "  " << pad(std::to_string(st.pid), 4) << pad(std::to_string(st.stage), 6) << pad(fixed(st.window_us), 12, true)
          << pad(fixed(st.evaluation_us), 12, true) << pad(fixed(st.busy_us), 12, true) << pad(fixed(st.bubble_pct), 9, true)
          << pad(st.planned_bubble_pct >= 0 ? fixed(st.planned_bubble_pct) : "-", 10, true) << "   " << causes << "\n";
    }
  }

  for (const auto& p : s.paths) {
    out << "\ncritical path, " << (p.pid < 0 ? std::string("all ranks") : "pid " + std::to_string(p.pid)) << " step " << p.step.step << " (" << fixed(p.step.span.start) << " .. "
        << fixed(p.step.span.end) << " µs): " << fixed(p.length_us) << " µs = " << fixed(p.handler_us) << " in handlers + "
        << fixed(p.wait_us) << " waiting, " << p.links.size() << " runs\n";
    const bool ranks = p.pid < 0;  // links on several processes: say which
    out << "  " << pad("#", 5) << pad("start", 12, true) << pad("dur", 10, true) << "  " << (ranks ? pad("pid", 5) : "")
        << pad("actor", 18) << pad("message", 14) << pad("mb", 4, true) << "  via (wait)\n";
    std::size_t k = 0;
    for (const auto& l : p.links) {
      const auto& e = t.events[l.run];
      out << "  " << pad(std::to_string(++k), 5) << pad(fixed(e.ts), 12, true) << pad(fixed(e.dur), 10, true) << "  "
          << (ranks ? pad(std::to_string(e.pid), 5) : "") << pad(t.actor_name(e.pid, e.tid), 18) << pad(t.str(e.name), 14) << pad(std::to_string(e.mb), 4, true) << "  "
          << to_string(l.via) << (l.via == path_edge::first ? "" : " (" + fixed(l.wait_us) + ")") << "\n";
    }
  }

  if (!s.slowest.empty()) {
    out << "\nslowest messages (queue wait + handler time, µs)\n";
    out << "  " << pad("pid", 4) << pad("actor", 18) << pad("message", 14) << pad("mb", 4, true) << pad("at", 12, true)
        << pad("queue", 10, true) << pad("handler", 10, true) << pad("total", 10, true) << "  from\n";
    for (const auto& m : s.slowest)
      out << "  " << pad(std::to_string(m.pid), 4) << pad(m.actor, 18) << pad(m.kind, 14) << pad(std::to_string(m.mb), 4, true)
          << pad(fixed(m.ts), 12, true) << pad(fixed(m.queue_us), 10, true) << pad(fixed(m.handler_us), 10, true)
          << pad(fixed(m.queue_us + m.handler_us), 10, true) << "  " << m.sender << "\n";
  }
}

}  // namespace nerve::trace

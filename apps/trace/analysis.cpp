#include "apps/trace/analysis.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace nerve::trace {

double percentile(std::vector<double>& values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  auto n = values.size();
  auto rank = static_cast<std::size_t>(std::ceil(p / 100.0 * static_cast<double>(n)));
  rank = std::clamp<std::size_t>(rank, 1, n);
  return values[rank - 1];
}

std::vector<std::pair<double, double>> disjoint_union(std::vector<std::pair<double, double>> intervals, const window& w) {
  for (auto& [a, b] : intervals) {
    a = std::max(a, w.start);
    b = std::min(b, w.end);
  }
  std::sort(intervals.begin(), intervals.end());
  std::vector<std::pair<double, double>> out;
  for (auto [a, b] : intervals) {
    if (b <= a) continue;
    if (out.empty() || a > out.back().second) out.emplace_back(a, b);
    else out.back().second = std::max(out.back().second, b);
  }
  return out;
}

double union_length(std::vector<std::pair<double, double>> intervals, const window& w) {
  double total = 0;
  for (auto [a, b] : disjoint_union(std::move(intervals), w)) total += b - a;
  return total;
}

double overlap_length(const std::vector<std::pair<double, double>>& a, const std::vector<std::pair<double, double>>& b) {
  double total = 0;
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    total += std::max(0.0, std::min(a[i].second, b[j].second) - std::max(a[i].first, b[j].first));
    if (a[i].second < b[j].second) ++i;
    else ++j;
  }
  return total;
}

trace_index::trace_index(const timeline& t) : tl(t) {
  const auto handler_cat = t.find("handler");
  const auto step_cat = t.find("step");
  const auto evaluation_cat = t.find("evaluation");
  const auto& ev = t.events;
  nerve_handlers = handler_cat != 0 && std::any_of(ev.begin(), ev.end(), [&](const event& e) { return e.ph == 'X' && e.cat == handler_cat; });

  for (std::uint32_t i = 0; i < ev.size(); ++i) {
    const auto& e = ev[i];
    auto [it, fresh] = process_span.try_emplace(e.pid, window{e.ts, e.end()});
    if (!fresh) {
      it->second.start = std::min(it->second.start, e.ts);
      it->second.end = std::max(it->second.end, e.end());
    }
    if (e.ph != 'X') continue;
    if (nerve_handlers ? e.cat == handler_cat : true) handlers[{e.pid, e.tid}].push_back(i);
    if (step_cat && e.cat == step_cat)
      steps[e.pid].push_back({e.pid, e.step >= 0 ? e.step : static_cast<std::int32_t>(steps[e.pid].size()), {e.ts, e.end()}});
    if (evaluation_cat && e.cat == evaluation_cat) evaluations[e.pid].emplace_back(e.ts, e.end());
  }
  for (auto& [tr, runs] : handlers) {
    std::stable_sort(runs.begin(), runs.end(), [&](auto a, auto b) { return ev[a].ts < ev[b].ts; });
    if (!nerve_handlers) {
      // Other tools nest slices on one thread; only the outermost ones are "runs".
      std::vector<std::uint32_t> top;
      double end = -std::numeric_limits<double>::infinity();
      for (auto i : runs) {
        if (ev[i].ts >= end) {
          top.push_back(i);
          end = ev[i].end();
        }
      }
      runs = std::move(top);
    }
  }
  for (auto& [pid, list] : steps)
    std::sort(list.begin(), list.end(), [](const auto& a, const auto& b) { return a.span.start < b.span.start; });
  for (const auto& [pid, span] : process_span)
    if (!steps.count(pid)) steps[pid].push_back({pid, 0, span});

  job = t.ranks.size() >= 2 && process_span.size() >= 2;

  incoming_flow.assign(ev.size(), -1);
  flow_sender_run.assign(t.flows.size(), -1);
  flow_handler_run.assign(t.flows.size(), -1);
  for (std::size_t f = 0; f < t.flows.size(); ++f) {
    const auto& s = ev[t.flows[f].start];
    const auto& e = ev[t.flows[f].finish];
    flow_sender_run[f] = run_at({s.pid, s.tid}, s.ts);
    // "bp":"e" binds to the enclosing slice; otherwise to the next slice that begins.
    auto run = e.bind_enclosing ? run_at({e.pid, e.tid}, e.ts) : run_from({e.pid, e.tid}, e.ts);
    if (run < 0 && e.bind_enclosing) run = run_from({e.pid, e.tid}, e.ts);
    flow_handler_run[f] = run;
    if (run >= 0) incoming_flow[static_cast<std::size_t>(run)] = static_cast<std::int64_t>(f);
  }
}

std::int64_t trace_index::run_at(const track& tr, double ts) const {
  auto it = handlers.find(tr);
  if (it == handlers.end()) return -1;
  const auto& runs = it->second;
  const auto& ev = tl.events;
  // The last run starting at or before ts.
  auto pos = std::upper_bound(runs.begin(), runs.end(), ts, [&](double t, std::uint32_t i) { return t < ev[i].ts; });
  if (pos == runs.begin()) return -1;
  auto i = *(pos - 1);
  return ts <= ev[i].end() ? static_cast<std::int64_t>(i) : -1;
}

std::int64_t trace_index::run_from(const track& tr, double ts) const {
  auto it = handlers.find(tr);
  if (it == handlers.end()) return -1;
  const auto& runs = it->second;
  const auto& ev = tl.events;
  auto pos = std::lower_bound(runs.begin(), runs.end(), ts, [&](std::uint32_t i, double t) { return ev[i].ts < t; });
  return pos == runs.end() ? -1 : static_cast<std::int64_t>(*pos);
}

std::vector<std::pair<double, double>> trace_index::evaluation_in(std::int64_t pid, const window& w) const {
  std::vector<std::pair<double, double>> spans;
  for (const auto& [p, list] : evaluations)
    if (p == pid || job) spans.insert(spans.end(), list.begin(), list.end());
  return disjoint_union(std::move(spans), w);
}

std::int32_t trace_index::stage_of(const event& e) const {
  if (e.stage >= 0) return e.stage;
  if (e.tid >= stage_tid_base) return static_cast<std::int32_t>(e.tid - stage_tid_base);
  return tl.actor_stage(e.pid, e.tid);
}

std::optional<window> trace_index::window_for(std::int64_t pid, const selection& sel) const {
  if (sel.range) return sel.range;
  if (job) {
    auto s = step_for(pid, sel);
    if (!s) return std::nullopt;
    if (sel.step) return s->span;
    // The whole job: every rank's span.
    std::optional<window> w;
    for (const auto& [p, span] : process_span) w = w ? window{std::min(w->start, span.start), std::max(w->end, span.end)} : span;
    return w;
  }
  if (sel.step) {
    auto s = step_for(pid, sel);
    if (!s) return std::nullopt;
    return s->span;
  }
  auto it = process_span.find(pid);
  if (it == process_span.end()) return std::nullopt;
  return it->second;
}

std::optional<step_window> trace_index::step_for(std::int64_t pid, const selection& sel) const {
  if (job && pid >= 0) return step_for(-1, sel);
  if (job) {
    // One step of the job: the ranks' steps of that number (or their last ones), joined.
    if (sel.range) return step_window{-1, -1, *sel.range};
    std::optional<step_window> out;
    for (const auto& [p, list] : steps) {
      if (list.empty()) continue;
      auto s = list.back();
      if (sel.step) {
        auto hit = std::find_if(list.begin(), list.end(), [&](const step_window& x) { return x.step == *sel.step; });
        if (hit == list.end()) continue;
        s = *hit;
      }
      if (!out) out = step_window{-1, s.step, s.span};
      else out->span = {std::min(out->span.start, s.span.start), std::max(out->span.end, s.span.end)};
    }
    return out;
  }
  auto it = steps.find(pid);
  if (it == steps.end() || it->second.empty()) return std::nullopt;
  if (sel.range) return step_window{pid, -1, *sel.range};
  if (sel.step) {
    for (const auto& s : it->second)
      if (s.step == *sel.step) return s;
    return std::nullopt;
  }
  return it->second.back();
}

}  // namespace nerve::trace

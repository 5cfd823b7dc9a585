#include "apps/trace/critical_path.hpp"

#include <algorithm>
#include <set>

namespace nerve::trace {

const char* to_string(path_edge e) {
  switch (e) {
    case path_edge::first: return "start";
    case path_edge::message: return "message";
    case path_edge::actor_busy: return "actor busy";
  }
  return "?";
}

critical_path find_critical_path(const trace_index& index, const step_window& step) {
  critical_path out;
  out.pid = step.pid;
  out.step = step;
  const auto& ev = index.tl.events;
  // Events less than 10 ns apart count as simultaneous: a send is recorded just before
  // its handler returns, and files round timestamps to the nanosecond.
  constexpr double eps = 0.01;
  auto in_step = [&](std::int64_t run) {
    return run >= 0 && ev[static_cast<std::size_t>(run)].ts >= step.span.start - eps &&
           ev[static_cast<std::size_t>(run)].end() <= step.span.end + eps;
  };

  std::int64_t last = -1;
  for (const auto& [tr, runs] : index.handlers) {
    if (step.pid >= 0 && tr.first != step.pid) continue;  // -1: every process of a job
    for (auto i : runs) {
      if (!in_step(i)) continue;
      if (last < 0 || ev[i].end() > ev[last].end() || (ev[i].end() == ev[last].end() && ev[i].ts > ev[last].ts)) last = i;
    }
  }
  if (last < 0) return out;

  std::vector<path_link> back;
  std::set<std::int64_t> seen;
  std::int64_t cur = last;
  while (cur >= 0 && seen.insert(cur).second) {
    const auto& run = ev[static_cast<std::size_t>(cur)];
    // The message: when it was enqueued, and the run that sent it.
    std::int64_t sender = -1;
    double arrival = -1;
    if (auto f = index.incoming_flow[static_cast<std::size_t>(cur)]; f >= 0) {
      const auto& send = ev[index.tl.flows[static_cast<std::size_t>(f)].start];
      arrival = run.queue_us >= 0 ? run.ts - run.queue_us : send.ts;
      sender = index.flow_sender_run[static_cast<std::size_t>(f)];
      if (!in_step(sender)) sender = -1;
    }
    // The actor: the run before this one on the same track.
    std::int64_t previous = -1;
    const auto& runs = index.handlers.at({run.pid, run.tid});
    auto pos = std::lower_bound(runs.begin(), runs.end(), static_cast<std::uint32_t>(cur),
                                [&](std::uint32_t a, std::uint32_t b) { return ev[a].ts < ev[b].ts || (ev[a].ts == ev[b].ts && a < b); });
    if (pos != runs.begin() && in_step(*(pos - 1))) previous = *(pos - 1);

    path_link link{static_cast<std::uint32_t>(cur), path_edge::first, 0};
    std::int64_t next = -1;
    const double free_at = previous >= 0 ? ev[static_cast<std::size_t>(previous)].end() : -1;
    if (sender >= 0 && (previous < 0 || arrival >= free_at - eps)) {
      link.via = path_edge::message;
      link.send_ts = ev[index.tl.flows[static_cast<std::size_t>(index.incoming_flow[static_cast<std::size_t>(cur)])].start].ts;
      link.wait_us = std::max(0.0, run.ts - link.send_ts);
      next = sender;
    } else if (previous >= 0 && (arrival < 0 || free_at >= arrival - eps)) {
      link.via = path_edge::actor_busy;
      link.wait_us = std::max(0.0, run.ts - free_at);
      next = previous;
    }  // else: the binding message came from outside the step, so the chain starts here
    back.push_back(link);
    cur = next;
  }
  std::reverse(back.begin(), back.end());
  out.links = std::move(back);
  const auto& first = ev[out.links.front().run];
  const auto& final_run = ev[out.links.back().run];
  out.length_us = final_run.end() - first.ts;
  // A run counts up to the send that the next link waited for, or whole.
  for (std::size_t i = 0; i < out.links.size(); ++i) {
    const auto& r = ev[out.links[i].run];
    double until = r.end();
    if (i + 1 < out.links.size() && out.links[i + 1].via == path_edge::message) until = std::min(until, out.links[i + 1].send_ts);
    out.handler_us += std::max(0.0, until - r.ts);
  }
  out.wait_us = out.length_us - out.handler_us;
  return out;
}

}  // namespace nerve::trace

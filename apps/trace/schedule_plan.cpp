#include "apps/trace/schedule_plan.hpp"

#include "layers/pipeline/schedule.hpp"

#include <algorithm>

namespace nerve::trace {
namespace {

namespace np = nerve::pipeline;

// The library's form of a recorded schedule. A negative id wraps to one no range holds,
// so `validate` names it instead of the simulator indexing with it.
np::schedule to_schedule(const schedule_info& info) {
  np::schedule s;
  s.name = info.name.empty() ? "custom" : info.name;
  s.chunks = static_cast<std::uint32_t>(std::max(1, info.chunks));
  std::int64_t last_mb = -1;
  for (const auto& list : info.actions) {
    auto& out = s.actions.emplace_back();
    for (const auto& a : list) {
      out.push_back({static_cast<np::op>(a.op), static_cast<std::uint32_t>(a.mb), static_cast<std::uint32_t>(a.chunk)});
      last_mb = std::max<std::int64_t>(last_mb, a.mb);
      s.split_backward |= a.op == 'W';
    }
  }
  s.stages = static_cast<std::uint32_t>(info.stages > 0 ? info.stages : static_cast<std::int64_t>(s.actions.size()));
  s.micro_batches = static_cast<std::uint32_t>(info.microbatches > 0 ? info.microbatches : last_mb + 1);
  return s;
}

}  // namespace

plan play_schedule(const schedule_info& schedule, const op_durations& durations) {
  plan out;
  const np::schedule s = to_schedule(schedule);
  np::simulation sim;
  try {
    np::validate(s);
    std::vector<np::action_costs> costs(s.stages, {1, 2, s.split_backward ? 1.0 : 0.0});
    for (std::size_t st = 0; st < costs.size() && st < durations.size(); ++st) {
      const auto& d = durations[st];
      // Without W actions B is the whole backward, and its measured time says so.
      costs[st] = {d[0], d[1], s.split_backward ? d[2] : 0.0};
    }
    sim = np::simulate(s, costs);
  } catch (const np::schedule_error& e) {
    out.error = std::string("the planned schedule cannot run: ") + e.what();
    return out;
  }
  out.makespan = sim.makespan;
  out.bubbles = sim.bubble;
  for (std::uint32_t st = 0; st < s.stages; ++st)
    for (std::size_t i = 0; i < s.actions[st].size(); ++i) {
      const auto& a = s.actions[st][i];
      out.runs.push_back({static_cast<std::int32_t>(st), static_cast<char>(a.op), static_cast<std::int32_t>(a.micro_batch),
                          static_cast<std::int32_t>(a.chunk), sim.start[st][i], sim.end[st][i]});
    }
  return out;
}

std::vector<std::int64_t> plan_sources(const trace_index& index, const schedule_info& schedule, std::int64_t pid) {
  if (!index.job) return {pid};
  return schedule.pids;
}

std::optional<op_durations> measured_durations(const trace_index& index, const schedule_info& schedule,
                                               const std::vector<std::int64_t>& pids, const std::optional<window>& w) {
  const auto& t = index.tl;
  const auto action_cat = t.find("action");
  if (!action_cat) return std::nullopt;
  op_durations sums(schedule.actions.size(), {0, 0, 0});
  std::vector<std::array<double, 3>> counts(schedule.actions.size(), {0, 0, 0});
  for (const auto& e : t.events) {
    if (e.cat != action_cat || e.ph != 'X' || (w && !w->contains(e.ts))) continue;
    if (std::find(pids.begin(), pids.end(), e.pid) == pids.end()) continue;
    const auto stage = index.stage_of(e);
    const auto& op = t.str(e.name);
    if (stage < 0 || static_cast<std::size_t>(stage) >= sums.size() || op.size() != 1) continue;
    const auto k = op[0] == 'F' ? 0u : op[0] == 'B' ? 1u : 2u;
    sums[static_cast<std::size_t>(stage)][k] += e.dur;
    counts[static_cast<std::size_t>(stage)][k] += 1;
  }
  bool any = false;
  for (std::size_t s = 0; s < sums.size(); ++s) {
    const double n = counts[s][0] + counts[s][1] + counts[s][2];
    if (!schedule.actions[s].empty() && n == 0) return std::nullopt;
    any |= n > 0;
    for (std::size_t k = 0; k < 3; ++k)
      if (counts[s][k] > 0) sums[s][k] /= counts[s][k];
  }
  if (!any) return std::nullopt;
  return sums;
}

std::vector<planned_action> one_f_one_b(std::int32_t stages, std::int32_t stage, std::int32_t microbatches) {
  if (stages < 1 || microbatches < 1 || stage < 0 || stage >= stages) return {};
  // Callers ask stage by stage: make each shape's schedule once, not once per stage.
  thread_local np::schedule made;
  if (made.actions.empty() || made.stages != static_cast<std::uint32_t>(stages) ||
      made.micro_batches != static_cast<std::uint32_t>(microbatches))
    made = np::make_schedule(np::schedule_kind::one_f_one_b, static_cast<std::uint32_t>(stages),
                             static_cast<std::uint32_t>(microbatches));
  std::vector<planned_action> out;
  for (const auto& a : made.actions[static_cast<std::size_t>(stage)])
    out.push_back({static_cast<char>(a.op), static_cast<std::int32_t>(a.micro_batch), static_cast<std::int32_t>(a.chunk)});
  return out;
}

}  // namespace nerve::trace

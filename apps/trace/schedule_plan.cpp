#include "apps/trace/schedule_plan.hpp"

#include <algorithm>
#include <map>
#include <tuple>

namespace nerve::trace {

std::vector<planned_action> one_f_one_b(std::int32_t stages, std::int32_t stage, std::int32_t microbatches) {
  std::vector<planned_action> out;
  const std::int32_t warmup = std::min(stages - stage - 1, microbatches);
  std::int32_t f = 0, b = 0;
  for (; f < warmup; ++f) out.push_back({'F', f, 0});
  while (f < microbatches) {
    out.push_back({'F', f++, 0});
    out.push_back({'B', b++, 0});
  }
  while (b < microbatches) out.push_back({'B', b++, 0});
  return out;
}

plan play_schedule(const schedule_info& schedule, const op_durations& durations) {
  plan out;
  const auto stages = static_cast<std::int32_t>(schedule.actions.size());
  const std::int32_t chunks = std::max(1, schedule.chunks);
  const std::int32_t virtual_stages = stages * chunks;
  out.busy.assign(static_cast<std::size_t>(stages), 0.0);
  if (stages == 0) return out;

  auto duration = [&](std::int32_t stage, char op) {
    const auto k = op == 'F' ? 0 : op == 'B' ? 1 : 2;
    if (static_cast<std::size_t>(stage) < durations.size()) return durations[static_cast<std::size_t>(stage)][static_cast<std::size_t>(k)];
    return op == 'F' ? 1.0 : op == 'B' ? 2.0 : 1.0;
  };
  std::map<std::tuple<char, std::int32_t, std::int32_t>, double> done;  // (op, mb, virtual stage) -> end
  auto done_at = [&](char op, std::int32_t mb, std::int32_t v) -> double {
    auto it = done.find({op, mb, v});
    return it == done.end() ? -1.0 : it->second;
  };
  std::vector<std::size_t> next(static_cast<std::size_t>(stages), 0);
  std::vector<double> free_at(static_cast<std::size_t>(stages), 0.0);
  std::size_t total = 0;
  for (const auto& l : schedule.actions) total += l.size();
  std::size_t placed = 0;
  bool progress = true;
  while (placed < total && progress) {
    progress = false;
    for (std::int32_t s = 0; s < stages; ++s) {
      const auto& list = schedule.actions[static_cast<std::size_t>(s)];
      auto& i = next[static_cast<std::size_t>(s)];
      while (i < list.size()) {
        const auto& a = list[i];
        const std::int32_t v = a.chunk * stages + s;
        double ready = 0;
        bool ok = true;
        auto need = [&](char op, std::int32_t mb, std::int32_t vs) {
          auto t = done_at(op, mb, vs);
          if (t < 0) ok = false;
          ready = std::max(ready, t);
        };
        if (a.op == 'F') {
          if (v > 0) need('F', a.mb, v - 1);
        } else if (a.op == 'B') {
          need('F', a.mb, v);
          if (v < virtual_stages - 1) need('B', a.mb, v + 1);
        } else {
          need('B', a.mb, v);
        }
        if (!ok) break;
        const double start = std::max(ready, free_at[static_cast<std::size_t>(s)]);
        const double end = start + duration(s, a.op);
        done[{a.op, a.mb, v}] = end;
        free_at[static_cast<std::size_t>(s)] = end;
        out.busy[static_cast<std::size_t>(s)] += end - start;
        out.runs.push_back({s, a.op, a.mb, a.chunk, start, end});
        out.makespan = std::max(out.makespan, end);
        ++i;
        ++placed;
        progress = true;
      }
    }
  }
  if (placed < total) {
    for (std::int32_t s = 0; s < stages; ++s) {
      const auto& list = schedule.actions[static_cast<std::size_t>(s)];
      const auto i = next[static_cast<std::size_t>(s)];
      if (i < list.size()) {
        out.error = "the planned schedule deadlocks: stage " + std::to_string(s) + " waits forever at action " +
                    std::to_string(i) + " (" + std::string(1, list[i].op) + " mb " + std::to_string(list[i].mb) + ")";
        break;
      }
    }
  }
  return out;
}

}  // namespace nerve::trace

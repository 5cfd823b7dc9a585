#include "apps/trace/timeline.hpp"

#include <algorithm>
#include <set>

namespace nerve::trace {

std::uint32_t timeline::intern(std::string_view s) {
  if (s.empty()) return 0;
  auto it = string_index_.find(std::string(s));
  if (it != string_index_.end()) return it->second;
  auto index = static_cast<std::uint32_t>(strings_.size());
  strings_.emplace_back(s);
  string_index_.emplace(strings_.back(), index);
  return index;
}

std::uint32_t timeline::find(std::string_view s) const {
  auto it = string_index_.find(std::string(s));
  return it == string_index_.end() ? 0 : it->second;
}

std::vector<std::int64_t> timeline::pids() const {
  std::set<std::int64_t> out;
  for (const auto& e : events) out.insert(e.pid);
  for (const auto& [key, a] : actors) out.insert(key.first);
  for (const auto& [pid, name] : process_names) out.insert(pid);
  return {out.begin(), out.end()};
}

std::string timeline::actor_name(std::int64_t pid, std::int64_t tid) const {
  auto it = actors.find({pid, tid});
  if (it != actors.end() && !it->second.name.empty()) return it->second.name;
  if (tid == 0) return "outside";
  if (tid >= stage_tid_base) return "stage " + std::to_string(tid - stage_tid_base);
  if (tid >= gpu_stream_tid_base) return "stream " + std::to_string(tid - gpu_stream_tid_base);
  return "tid " + std::to_string(tid);
}

std::int32_t timeline::actor_stage(std::int64_t pid, std::int64_t tid) const {
  auto it = actors.find({pid, tid});
  if (it != actors.end() && it->second.stage >= 0) return it->second.stage;
  for (const auto& s : stages)
    if (s.pid == pid && std::find(s.actors.begin(), s.actors.end(), tid) != s.actors.end()) return s.stage;
  return -1;
}

void timeline::append(timeline&& other) {
  // Renumber colliding pids first, so everything below maps through one table.
  std::set<std::int64_t> taken;
  for (auto pid : pids()) taken.insert(pid);
  std::map<std::int64_t, std::int64_t> remap;
  std::int64_t next_free = taken.empty() ? 0 : *taken.rbegin() + 1;
  for (auto pid : other.pids()) {
    if (taken.count(pid)) {
      while (taken.count(next_free)) ++next_free;
      remap[pid] = next_free;
      taken.insert(next_free);
    } else {
      remap[pid] = pid;
      taken.insert(pid);
    }
  }
  auto pid_of = [&](std::int64_t pid) {
    auto it = remap.find(pid);
    return it == remap.end() ? pid : it->second;
  };

  std::vector<std::uint32_t> string_map(other.strings_.size());
  for (std::size_t i = 0; i < other.strings_.size(); ++i) string_map[i] = intern(other.strings_[i]);
  const auto extra_base = static_cast<std::uint32_t>(extras.size() - 1);
  for (std::size_t i = 1; i < other.extras.size(); ++i) extras.push_back(std::move(other.extras[i]));
  const auto event_base = static_cast<std::uint32_t>(events.size());
  const auto file_base = static_cast<std::int32_t>(files.size());

  events.reserve(events.size() + other.events.size());
  for (auto e : other.events) {
    e.pid = pid_of(e.pid);
    e.name = string_map[e.name];
    e.cat = string_map[e.cat];
    e.cause = string_map[e.cause];
    if (e.extra) e.extra += extra_base;
    if (e.async) e.async += async_ids;  // ids of different files stay apart
    e.file += file_base;
    events.push_back(e);
  }
  async_ids += other.async_ids;
  for (auto f : other.flows) flows.push_back({f.start + event_base, f.finish + event_base});
  for (auto& [key, a] : other.actors) {
    a.pid = pid_of(a.pid);
    actors[{a.pid, key.second}] = std::move(a);
  }
  for (auto& s : other.stages) {
    s.pid = pid_of(s.pid);
    stages.push_back(std::move(s));
  }
  for (auto r : other.ranks) {
    r.pid = pid_of(r.pid);
    ranks.push_back(r);
  }
  cross_process_flows += other.cross_process_flows;
  backward_flows += other.backward_flows;
  for (auto& s : other.schedules) {
    for (auto& p : s.pids) p = pid_of(p);
    s.file += file_base;
    schedules.push_back(std::move(s));
  }
  for (auto& [pid, name] : other.process_names) process_names[pid_of(pid)] = std::move(name);
  for (auto& f : other.files) {
    for (auto& [from, to] : f.pid_map) to = pid_of(to);
    files.push_back(std::move(f));
  }
}

}  // namespace nerve::trace

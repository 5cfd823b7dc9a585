// The `nerve` block of a trace file: its version, the actors, stages and ranks, and the
// planned schedule, each checked for range.
#include "apps/trace/detail/reader.hpp"

#include "apps/trace/detail/json_values.hpp"

#include <optional>
#include <set>

namespace nerve::trace::detail {
namespace {

// The planned schedule's shape, bounded far beyond real pipelines.
constexpr std::int64_t max_planned_stages = 65536;
constexpr std::int64_t max_planned_chunks = 1024;

}  // namespace

void reader::read_nerve(const json& nerve) {
  out_.files[0].nerve = true;
  if (!nerve.is_object()) {
    error(-1, "\"nerve\" must be an object");
    return;
  }
  if (auto it = nerve.find("version"); it == nerve.end() || !it->is_number_integer())
    warning(-1, "nerve: missing integer \"version\"");
  else if (*it != 1)
    warning(-1, "nerve: version " + it->dump() + " is newer than this viewer (1); reading what it knows");
  std::set<std::int64_t> file_pids;
  for (auto& e : out_.events) file_pids.insert(e.pid);
  for (auto& [pid, name] : out_.process_names) file_pids.insert(pid);
  if (file_pids.empty()) file_pids.insert(0);
  auto pids_of = [&](const json& entry) -> std::vector<std::int64_t> {
    if (auto it = entry.find("pid"); it != entry.end() && it->is_number_integer())
      if (auto pid = whole_number(*it, int64_min, int64_max)) return {*pid};
    return {file_pids.begin(), file_pids.end()};
  };
  // A numeric field in [lo, hi]; out of range is an error and reads as `fallback`.
  auto int_field = [this](const json& j, const char* k, std::int64_t fallback, std::int64_t lo = int32_min,
                          std::int64_t hi = int32_max) -> std::int64_t {
    auto it = j.find(k);
    if (it == j.end() || !it->is_number()) return fallback;
    if (auto x = whole_number(*it, lo, hi)) return *x;
    error(-1, "nerve: \"" + std::string(k) + "\" " + clipped(it->dump()) + " in " + clipped(j.dump(), 80) +
                  " is out of range: it must be " + range_text(lo, hi));
    return fallback;
  };
  auto str_field = [](const json& j, const char* k) -> std::string {
    auto it = j.find(k);
    return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  if (auto it = nerve.find("actors"); it != nerve.end()) {
    if (!it->is_array()) error(-1, "nerve.actors must be an array");
    else {
      std::size_t i = 0;
      for (auto& a : *it) {
        std::optional<std::int64_t> id;
        if (a.is_object() && a.contains("id") && a["id"].is_number_integer()) id = whole_number(a["id"], int64_min, int64_max);
        if (!id) {
          error(-1, "nerve.actors[" + std::to_string(i) + "] needs an integer \"id\", " + range_text(int64_min, int64_max));
        } else {
          for (auto pid : pids_of(a)) {
            auto& info = out_.actors[{pid, *id}];
            info.pid = pid;
            info.tid = *id;
            if (auto name = str_field(a, "name"); !name.empty()) info.name = name;
            info.loop = static_cast<std::int32_t>(int_field(a, "loop", info.loop));
            info.stage = static_cast<std::int32_t>(int_field(a, "stage", info.stage));
            info.group = str_field(a, "group");
          }
        }
        ++i;
      }
    }
  }
  if (auto it = nerve.find("stages"); it != nerve.end() && it->is_array()) {
    for (auto& s : *it) {
      if (!s.is_object() || !s.contains("stage")) {
        error(-1, "nerve.stages entries need \"stage\"");
        continue;
      }
      for (auto pid : pids_of(s)) {
        stage_info info;
        info.pid = pid;
        info.stage = static_cast<std::int32_t>(int_field(s, "stage", 0));
        info.loop = static_cast<std::int32_t>(int_field(s, "loop", -1));
        info.device = str_field(s, "device");
        if (auto a = s.find("actors"); a != s.end() && a->is_array())
          for (auto& id : *a)
            if (auto x = id.is_number_integer() ? whole_number(id, int64_min, int64_max) : std::nullopt) info.actors.push_back(*x);
        out_.stages.push_back(std::move(info));
      }
    }
  }
  if (auto it = nerve.find("ranks"); it != nerve.end()) {
    if (!it->is_array()) error(-1, "nerve.ranks must be an array");
    else
      for (auto& r : *it) {
        if (!r.is_object() || !r.contains("rank") || !r["rank"].is_number_integer()) {
          error(-1, "nerve.ranks entries need an integer \"rank\", got " + clipped(r.dump(), 80));
          continue;
        }
        rank_info info;
        info.rank = static_cast<std::int32_t>(int_field(r, "rank", 0, 0, int32_max));
        info.pid = int_field(r, "pid", info.rank, int64_min, int64_max);
        info.offset_ns = int_field(r, "offset_ns", 0, int64_min, int64_max);
        info.rtt_ns = int_field(r, "rtt_ns", 0, 0, int64_max);
        out_.ranks.push_back(info);
      }
  }
  if (auto it = nerve.find("schedule"); it != nerve.end() && it->is_object()) {
    schedule_info s;
    s.name = str_field(*it, "name");
    // Bounded so that playing the plan (chunk * stages + stage) stays far inside 32 bits.
    s.stages = static_cast<std::int32_t>(int_field(*it, "stages", 0, 0, max_planned_stages));
    s.microbatches = static_cast<std::int32_t>(int_field(*it, "microbatches", 0, 0, int32_max));
    s.chunks = static_cast<std::int32_t>(int_field(*it, "chunks", 1, 1, max_planned_chunks));
    if (auto a = it->find("actions"); a != it->end() && a->is_array() && a->size() > std::size_t(max_planned_stages)) {
      error(-1, "nerve.schedule: " + std::to_string(a->size()) + " stages of actions; at most " + std::to_string(max_planned_stages));
    } else if (a != it->end() && a->is_array()) {
      for (auto& stage : *a) {
        auto& list = s.actions.emplace_back();
        if (!stage.is_array()) continue;
        for (auto& act : stage) {
          auto op = str_field(act, "op");
          if (op.size() != 1 || std::string_view("FBW").find(op[0]) == std::string_view::npos) {
            error(-1, "nerve.schedule: action op must be \"F\", \"B\" or \"W\", got " + act.dump());
            continue;
          }
          list.push_back({op[0], static_cast<std::int32_t>(int_field(act, "mb", 0, 0, int32_max)),
                          static_cast<std::int32_t>(int_field(act, "chunk", 0, 0, max_planned_chunks - 1))});
        }
      }
    }
    if (s.stages == 0) s.stages = static_cast<std::int32_t>(s.actions.size());
    out_.schedules.push_back(std::move(s));
  }
}

}  // namespace nerve::trace::detail

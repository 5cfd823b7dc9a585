#include "apps/trace/html_page.hpp"

#include "apps/trace/critical_path.hpp"
#include "apps/trace/schedule_plan.hpp"
#include "apps/trace/summary.hpp"
#include "layers/module_path.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <set>
#include <tuple>

namespace nerve::trace {
namespace {

// Lanes sort by process, then section (outside, actors and stages, GPU streams), then
// stage, loop, sort index and id; a lane's counters follow it.
using lane_order = std::tuple<std::int64_t, int, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::string>;

struct row_item {
  double ts = 0;
  double dur = -1;
  std::uint32_t event = std::numeric_limits<std::uint32_t>::max();  // max: a planned action
  std::uint32_t name = 0;
  std::int32_t mb = -1;
};

struct row_def {
  std::string kind;  // "slice", "plan", "counter"
  std::int32_t depth = 0;
  std::vector<row_item> items;
};

struct lane_def {
  lane_order order;
  std::string label;
  std::string group;
  std::string kind;  // "actor", "stage", "outside", "gpu", "counter"
  std::int64_t pid = 0;
  std::int64_t tid = 0;
  std::vector<row_def> rows;  // slices by depth; stage lanes also get a "plan" row
};

constexpr int max_depth = 5;

// A JSON string, safe inside <script>: "</" would end the element.
std::string json_string(const std::string& s) {
  const auto text = nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    out += text[i];
    if (text[i] == '<' && i + 1 < text.size() && text[i + 1] == '/') out += '\\';
  }
  return out;
}

class page_builder {
 public:
  page_builder(const trace_index& index, const html_options& options) : index_(index), t_(index.tl), options_(options) {}

  html_stats build(std::ostream& out) {
    origin_ = std::numeric_limits<double>::infinity();
    for (const auto& e : t_.events) origin_ = std::min(origin_, e.ts);
    if (!std::isfinite(origin_)) origin_ = 0;
    plan_names_ = {local_string("F"), local_string("B"), local_string("W")};
    assign_events();
    add_plans();
    order_lanes();
    std::string data = data_json();
    std::string page(detail::viewer_page());
    detail::replace_all(page, "NERVE_TRACE_TITLE", detail::html_text(options_.title));
    detail::replace_all(page, "/*NERVE_TRACE_DATA*/", data);
    out << page;
    stats_.bytes = page.size();
    return stats_;
  }

 private:
  std::string process_label(std::int64_t pid) const {
    auto it = t_.process_names.find(pid);
    return it != t_.process_names.end() ? it->second : "pid " + std::to_string(pid);
  }

  std::int32_t stage_loop(std::int64_t pid, std::int32_t stage) const {
    for (const auto& s : t_.stages)
      if (s.pid == pid && s.stage == stage) return s.loop;
    return -1;
  }

  // A transformer's layers under their block (" · blocks.3" for `blocks.3.attn`), so its
  // lanes come under one heading per block; "" for any other name.
  static std::string block_of(const std::string& name) {
    const auto block = layers::block_of(name);
    return block.empty() ? std::string() : " · " + std::string(block);
  }

  // The lane of a track (pid, tid), created on first use.
  std::size_t track_lane(std::int64_t pid, std::int64_t tid) {
    if (tid >= stage_tid_base) return stage_lane(pid, static_cast<std::int32_t>(tid - stage_tid_base));
    auto key = std::make_pair(pid, tid);
    if (auto it = track_lanes_.find(key); it != track_lanes_.end()) return it->second;
    lane_def lane;
    lane.pid = pid;
    lane.tid = tid;
    lane.label = t_.actor_name(pid, tid);
    if (tid == 0) {
      lane.kind = "outside";
      lane.order = {pid, 0, 0, 0, 0, 0, ""};
      lane.group = process_label(pid);
    } else if (tid >= gpu_stream_tid_base) {
      lane.kind = "gpu";
      lane.order = {pid, 2, 0, 0, 0, tid, ""};
      lane.group = process_label(pid) + " · gpu";
    } else {
      lane.kind = "actor";
      std::int32_t loop = -1;
      std::int64_t sort = 0;
      if (auto it = t_.actors.find(key); it != t_.actors.end()) {
        loop = it->second.loop;
        sort = it->second.sort_index;
      }
      const auto stage = t_.actor_stage(pid, tid);
      lane.order = {pid, 1, stage, loop, sort, tid, ""};
      lane.group = process_label(pid) + (stage >= 0 ? " · stage " + std::to_string(stage) : std::string(" · no stage")) +
                   (loop >= 0 ? " · loop " + std::to_string(loop) : std::string()) + block_of(lane.label);
    }
    lanes_.push_back(std::move(lane));
    track_lanes_[key] = lanes_.size() - 1;
    return lanes_.size() - 1;
  }

  std::size_t stage_lane(std::int64_t pid, std::int32_t stage) {
    auto key = std::make_pair(pid, static_cast<std::int64_t>(stage));
    if (auto it = stage_lanes_.find(key); it != stage_lanes_.end()) return it->second;
    lane_def lane;
    lane.pid = pid;
    lane.tid = stage_tid_base + stage;
    lane.kind = "stage";
    lane.label = "stage " + std::to_string(stage);
    const auto loop = stage_loop(pid, stage);
    lane.order = {pid, 1, stage, std::numeric_limits<std::int64_t>::min(), 0, 0, ""};
    lane.group = process_label(pid) + " · stage " + std::to_string(stage) + (loop >= 0 ? " · loop " + std::to_string(loop) : std::string());
    lanes_.push_back(std::move(lane));
    stage_lanes_[key] = lanes_.size() - 1;
    return lanes_.size() - 1;
  }

  std::size_t counter_lane(std::size_t owner, const std::string& name) {
    auto key = std::make_pair(owner, name);
    if (auto it = counter_lanes_.find(key); it != counter_lanes_.end()) return it->second;
    lane_def lane;
    lane.pid = lanes_[owner].pid;
    lane.tid = lanes_[owner].tid;
    lane.kind = "counter";
    lane.label = lanes_[owner].label + " · " + name;
    lane.group = lanes_[owner].group;
    lane.order = lanes_[owner].order;
    std::get<6>(lane.order) = name;
    lane.rows.push_back({"counter", 0, {}});
    lanes_.push_back(std::move(lane));
    counter_lanes_[key] = lanes_.size() - 1;
    return lanes_.size() - 1;
  }

  void assign_events() {
    const auto action_cat = t_.find("action");
    const auto idle_cat = t_.find("idle");
    std::vector<std::vector<std::uint32_t>> slices;  // per lane
    auto add_slice = [&](std::size_t lane, std::uint32_t i) {
      if (slices.size() <= lane) slices.resize(lane + 1);
      slices[lane].push_back(i);
    };
    for (std::uint32_t i = 0; i < t_.events.size(); ++i) {
      const auto& e = t_.events[i];
      if (e.ph == 's' || e.ph == 't' || e.ph == 'f' || e.ph == 'M') continue;
      if (e.ph == 'C') {
        const auto owner = track_lane(e.pid, e.tid);
        const auto lane = counter_lane(owner, t_.str(e.name));
        lanes_[lane].rows[0].items.push_back({e.ts, -1, i, e.name, -1});
        continue;
      }
      std::size_t lane;
      if ((e.cat == action_cat && action_cat) || (e.cat == idle_cat && idle_cat)) {
        const auto stage = index_.stage_of(e);
        lane = stage >= 0 ? stage_lane(e.pid, stage) : track_lane(e.pid, e.tid);
      } else {
        lane = track_lane(e.pid, e.tid);
      }
      add_slice(lane, i);
    }
    // Flow ends need lanes too (a track may only receive).
    for (const auto& f : t_.flows) {
      track_lane(t_.events[f.start].pid, t_.events[f.start].tid);
      track_lane(t_.events[f.finish].pid, t_.events[f.finish].tid);
    }
    slices.resize(lanes_.size());
    // Nesting depth per lane: each depth is one row, whose slices never overlap.
    for (std::size_t l = 0; l < lanes_.size(); ++l) {
      auto& list = slices[l];
      if (list.empty()) continue;
      std::stable_sort(list.begin(), list.end(), [&](auto a, auto b) {
        const auto& x = t_.events[a];
        const auto& y = t_.events[b];
        return x.ts < y.ts || (x.ts == y.ts && x.dur > y.dur);
      });
      std::vector<double> open;
      auto& rows = lanes_[l].rows;
      for (auto i : list) {
        const auto& e = t_.events[i];
        std::size_t depth = 0;
        if (e.ph == 'X') {
          // Overlaps under 5 ns are rounding (ts and dur are rounded separately), not nesting.
          while (!open.empty() && open.back() <= e.ts + 0.005) open.pop_back();
          depth = std::min<std::size_t>(open.size(), max_depth);
          open.push_back(e.end());
        }
        while (rows.size() <= depth) rows.push_back({"slice", static_cast<std::int32_t>(rows.size()), {}});
        rows[depth].items.push_back({e.ts, e.ph == 'X' ? e.dur : -1, i, e.name, e.mb});
      }
    }
  }

  // The planned schedule, played with each stage's mean measured durations and placed
  // at the first measured action of every step. In a job each rank shows the plan of the
  // stages it ran, timed by every rank's actions and placed in the job's step.
  void add_plans() {
    const auto action_cat = t_.find("action");
    if (!action_cat) return;
    for (const auto& schedule : t_.schedules) {
      for (auto pid : schedule.pids) {
        const auto sources = plan_sources(index_, schedule, pid);
        std::vector<double> starts;  // of the sources' actions
        std::set<std::int32_t> own_stages;
        for (const auto& e : t_.events) {
          if (e.cat != action_cat || e.ph != 'X') continue;
          if (std::find(sources.begin(), sources.end(), e.pid) == sources.end()) continue;
          starts.push_back(e.ts);
          if (e.pid == pid) own_stages.insert(index_.stage_of(e));
        }
        if (own_stages.empty()) continue;
        std::sort(starts.begin(), starts.end());
        const auto mean = measured_durations(index_, schedule, sources, std::nullopt);
        if (!mean) continue;
        const auto p = play_schedule(schedule, *mean);
        if (!p.error.empty()) continue;
        auto steps_it = index_.steps.find(pid);
        if (steps_it == index_.steps.end()) continue;
        for (const auto& step : steps_it->second) {
          window span = step.span;  // the step of every source: the ranks' steps of its number
          for (auto q : sources)
            if (auto it = index_.steps.find(q); q != pid && it != index_.steps.end())
              for (const auto& other : it->second)
                if (other.step == step.step) span = {std::min(span.start, other.span.start), std::max(span.end, other.span.end)};
          auto first = std::lower_bound(starts.begin(), starts.end(), span.start);
          if (first == starts.end() || *first > span.end) continue;
          for (const auto& r : p.runs) {
            if (!own_stages.count(r.stage)) continue;
            auto& lane = lanes_[stage_lane(pid, r.stage)];
            auto plan_row = std::find_if(lane.rows.begin(), lane.rows.end(), [](const row_def& d) { return d.kind == "plan"; });
            if (plan_row == lane.rows.end()) {
              lane.rows.push_back({"plan", 0, {}});
              plan_row = lane.rows.end() - 1;
            }
            plan_row->items.push_back({*first + r.start, r.end - r.start, std::numeric_limits<std::uint32_t>::max(),
                                       plan_names_[static_cast<std::size_t>(r.op == 'F' ? 0 : r.op == 'B' ? 1 : 2)], r.mb});
          }
        }
      }
    }
  }

  void order_lanes() {
    std::vector<std::size_t> order(lanes_.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](auto a, auto b) { return lanes_[a].order < lanes_[b].order; });
    lane_position_.assign(lanes_.size(), 0);
    for (std::size_t i = 0; i < order.size(); ++i) lane_position_[order[i]] = i;
    lane_order_ = std::move(order);
  }
  // A string for the page's table: the timeline's own index, else one appended after it.
  std::uint32_t local_string(const std::string& text) {
    if (auto i = t_.find(text)) return i;
    for (std::size_t k = 0; k < local_strings_.size(); ++k)
      if (local_strings_[k] == text) return static_cast<std::uint32_t>(t_.strings().size() + k);
    local_strings_.push_back(text);
    return static_cast<std::uint32_t>(t_.strings().size() + local_strings_.size() - 1);
  }

  static void put(std::string& s, std::int64_t v) {
    char buf[24];
    auto [p, ec] = std::to_chars(buf, buf + sizeof buf, v);
    s.append(buf, p);
  }
  std::int64_t ns(double us) const { return std::llround((us - origin_) * 1000.0); }
  static std::int64_t ns_len(double us) { return std::llround(us * 1000.0); }

  template <class F>
  static void column(std::string& s, const char* key, const std::vector<row_item>& items, std::int64_t fallback, F value) {
    bool any = false;
    for (const auto& it : items)
      if (value(it) != fallback) {
        any = true;
        break;
      }
    if (!any) return;
    s += ",\"";
    s += key;
    s += "\":[";
    bool first = true;
    for (const auto& it : items) {
      if (!first) s += ',';
      first = false;
      put(s, value(it));
    }
    s += ']';
  }

  std::string data_json() {
    std::string s;
    s.reserve(t_.events.size() * 40 + 4096);
    s += "{\"title\":" + json_string(options_.title);
    s += ",\"origin_us\":" + std::to_string(origin_);
    s += ",\"strings\":[";
    for (std::size_t i = 0; i < t_.strings().size(); ++i) s += (i ? "," : "") + json_string(t_.strings()[i]);
    for (const auto& extra : local_strings_) s += "," + json_string(extra);
    s += "]";

    // Rows, in lane order; remember where each event landed (for the critical path).
    std::vector<std::int64_t> event_row(t_.events.size(), -1), event_pos(t_.events.size(), -1);
    std::string rows = "[";
    std::string lanes = "[";
    std::map<std::uint32_t, std::size_t> extra_index;
    std::vector<std::string> extras;
    std::size_t row_count = 0;
    for (std::size_t p = 0; p < lane_order_.size(); ++p) {
      auto& lane = lanes_[lane_order_[p]];
      std::vector<std::size_t> row_ids;
      for (auto& row : lane.rows) {
        std::stable_sort(row.items.begin(), row.items.end(), [](const row_item& a, const row_item& b) { return a.ts < b.ts; });
        const auto r = row_count++;
        row_ids.push_back(r);
        if (r) rows += ',';
        rows += "{\"lane\":" + std::to_string(p) + ",\"kind\":\"" + row.kind + "\",\"depth\":" + std::to_string(row.depth);
        rows += ",\"t\":[";
        std::int64_t previous = 0;
        for (std::size_t k = 0; k < row.items.size(); ++k) {
          const auto& it = row.items[k];
          const auto t = ns(it.ts);
          if (k) rows += ',';
          put(rows, t - previous);
          previous = t;
          if (it.event != std::numeric_limits<std::uint32_t>::max()) {
            event_row[it.event] = static_cast<std::int64_t>(r);
            event_pos[it.event] = static_cast<std::int64_t>(k);
          }
        }
        rows += ']';
        const auto& ev = t_.events;
        auto real = [](const row_item& it) { return it.event != std::numeric_limits<std::uint32_t>::max(); };
        if (row.kind == "counter") {
          rows += ",\"v\":[";
          for (std::size_t k = 0; k < row.items.size(); ++k) {
            char buf[32];
            std::snprintf(buf, sizeof buf, "%.6g", ev[row.items[k].event].value);
            rows += (k ? "," : "") + std::string(buf);
          }
          rows += ']';
        } else {
          column(rows, "d", row.items, -1, [&](const row_item& it) { return it.dur < 0 ? -1 : ns_len(it.dur); });
          column(rows, "n", row.items, 0, [&](const row_item& it) { return static_cast<std::int64_t>(it.name); });
          column(rows, "c", row.items, 0, [&](const row_item& it) { return real(it) ? static_cast<std::int64_t>(ev[it.event].cat) : 0; });
          column(rows, "m", row.items, -1, [&](const row_item& it) { return static_cast<std::int64_t>(it.mb); });
          column(rows, "q", row.items, -1,
                 [&](const row_item& it) { return real(it) && ev[it.event].queue_us >= 0 ? ns_len(ev[it.event].queue_us) : -1; });
          column(rows, "b", row.items, -1, [&](const row_item& it) { return real(it) ? ev[it.event].bytes : -1; });
          column(rows, "s", row.items, -1, [&](const row_item& it) { return real(it) ? ev[it.event].sender : -1; });
          column(rows, "k", row.items, 0, [&](const row_item& it) { return real(it) ? static_cast<std::int64_t>(ev[it.event].cause) : 0; });
          column(rows, "x", row.items, 0, [&](const row_item& it) -> std::int64_t {
            if (!real(it) || !ev[it.event].extra) return 0;
            auto [pos, fresh] = extra_index.emplace(ev[it.event].extra, extras.size() + 1);
            if (fresh) extras.push_back(t_.extras[ev[it.event].extra]);
            return static_cast<std::int64_t>(pos->second);
          });
        }
        rows += '}';
        stats_.events += row.items.size();
      }
      if (p) lanes += ',';
      lanes += "{\"label\":" + json_string(lane.label) + ",\"group\":" + json_string(lane.group) + ",\"kind\":\"" + lane.kind +
               "\",\"pid\":" + std::to_string(lane.pid) + ",\"tid\":" + std::to_string(lane.tid) + ",\"rows\":[";
      for (std::size_t k = 0; k < row_ids.size(); ++k) lanes += (k ? "," : "") + std::to_string(row_ids[k]);
      lanes += "]}";
      stats_.lane_labels.push_back(lane.label);
      stats_.lane_groups.push_back(lane.group);
    }
    rows += ']';
    lanes += ']';
    stats_.lanes = lane_order_.size();
    stats_.rows = row_count;
    s += ",\"lanes\":" + lanes + ",\"rows\":" + rows;
    s += ",\"extras\":[\"\"";
    for (const auto& x : extras) s += "," + json_string(x);
    s += "]";

    // Flows, sorted by send time: from lane, send time (delta), to lane, delivery after send, kind.
    struct flow_item {
      std::int64_t from_lane, from_ns, to_lane, to_ns;
      std::uint32_t name;
    };
    std::vector<flow_item> flows;
    for (const auto& f : t_.flows) {
      const auto& a = t_.events[f.start];
      const auto& b = t_.events[f.finish];
      flows.push_back({static_cast<std::int64_t>(lane_position_[track_lane(a.pid, a.tid)]), ns(a.ts),
                       static_cast<std::int64_t>(lane_position_[track_lane(b.pid, b.tid)]), ns(b.ts), a.name});
    }
    std::sort(flows.begin(), flows.end(), [](const auto& x, const auto& y) { return x.from_ns < y.from_ns; });
    stats_.flows = flows.size();
    std::string fl, ft, tl, tt, fn;
    std::int64_t previous = 0;
    for (std::size_t k = 0; k < flows.size(); ++k) {
      const char* sep = k ? "," : "";
      fl += sep; put(fl, flows[k].from_lane);
      ft += sep; put(ft, flows[k].from_ns - previous);
      previous = flows[k].from_ns;
      tl += sep; put(tl, flows[k].to_lane);
      tt += sep; put(tt, flows[k].to_ns - flows[k].from_ns);
      fn += sep; put(fn, flows[k].name);
    }
    s += ",\"flows\":{\"fl\":[" + fl + "],\"ft\":[" + ft + "],\"tl\":[" + tl + "],\"tt\":[" + tt + "],\"n\":[" + fn + "]}";

    // Actor names by "pid:id", for senders in the details panel.
    s += ",\"names\":{";
    bool first = true;
    for (const auto& [key, a] : t_.actors) {
      if (a.name.empty()) continue;
      s += (first ? "" : ",") + json_string(std::to_string(key.first) + ":" + std::to_string(key.second)) + ":" + json_string(a.name);
      first = false;
    }
    s += "}";

    // Critical paths and a one-line summary.
    summary_options so;
    so.select = options_.select;
    so.top = 0;
    const auto sum = summarize(index_, so);
    nlohmann::json paths = nlohmann::json::array();
    std::string info;
    for (const auto& path : sum.paths) {
      nlohmann::json links = nlohmann::json::array();
      for (const auto& l : path.links) {
        if (event_row[l.run] < 0) continue;
        links.push_back({event_row[l.run], event_pos[l.run], to_string(l.via)});
      }
      paths.push_back({{"pid", path.pid}, {"step", path.step.step}, {"length_us", path.length_us}, {"links", links}});
      char buf[160];
      if (path.pid < 0)  // a job's ranks together
        std::snprintf(buf, sizeof buf, "critical path (all ranks, step %d): %.1f µs over %zu runs. ", path.step.step,
                      path.length_us, path.links.size());
      else
        std::snprintf(buf, sizeof buf, "critical path (pid %lld, step %d): %.1f µs over %zu runs. ",
                      static_cast<long long>(path.pid), path.step.step, path.length_us, path.links.size());
      info += buf;
    }
    const bool several = sum.windows.size() > 1;  // say whose stage it is
    for (const auto& [pid, us] : sum.evaluation_us) {
      if (several) info += process_label(pid) + " ";
      char buf[160];
      std::snprintf(buf, sizeof buf, "evaluation %.1f ms (%zu), apart from training: not in the bubbles. ", us / 1000.0,
                    sum.evaluation_counts.at(pid));
      info += buf;
    }
    for (const auto& st : sum.stages) {
      if (several) info += process_label(st.pid) + " ";
      char buf[160];
      if (st.planned_bubble_pct >= 0)
        std::snprintf(buf, sizeof buf, "stage %d bubble %.1f%% (plan %.1f%%). ", st.stage, st.bubble_pct, st.planned_bubble_pct);
      else
        std::snprintf(buf, sizeof buf, "stage %d bubble %.1f%%. ", st.stage, st.bubble_pct);
      info += buf;
    }
    s += ",\"critical\":" + paths.dump();
    s += ",\"info\":" + json_string(info);
    s += "}";
    return s;
  }

  const trace_index& index_;
  const timeline& t_;
  html_options options_;
  double origin_ = 0;
  std::vector<lane_def> lanes_;
  std::map<std::pair<std::int64_t, std::int64_t>, std::size_t> track_lanes_, stage_lanes_;
  std::map<std::pair<std::size_t, std::string>, std::size_t> counter_lanes_;
  std::vector<std::size_t> lane_order_, lane_position_;
  std::array<std::uint32_t, 3> plan_names_{};
  html_stats stats_;

  std::vector<std::string> local_strings_;
};

}  // namespace

html_stats write_html_page(const trace_index& index, const html_options& options, std::ostream& out) {
  return page_builder(index, options).build(out);
}

namespace detail {

void replace_all(std::string& s, const std::string& what, const std::string& with) {
  std::string out;
  std::size_t from = 0;
  for (auto p = s.find(what); p != std::string::npos; p = s.find(what, from)) {
    out.append(s, from, p - from);
    out += with;
    from = p + what.size();
  }
  out.append(s, from, std::string::npos);
  s = std::move(out);
}

std::string html_text(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else out += c;
  }
  return out;
}

}  // namespace detail

}  // namespace nerve::trace

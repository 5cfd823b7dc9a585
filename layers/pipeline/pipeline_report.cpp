// What a pipeline says of itself: the trace's metadata and stage tracks, the bubble each
// stage would have as cut, and the measured timeline as a table.
#include "layers/pipeline/pipeline.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <future>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "bus/all_reduce.hpp"
#include "layers/pipeline/stage_gate.hpp"
#include "layers/pipeline/stall_watch.hpp"

namespace nerve::pipeline {

using detail::stage_aborted;
using detail::stage_report;
using detail::step_msg;

nlohmann::json pipeline::trace_metadata() const {
  // Across ranks each rank describes the stages it runs (the merged trace keeps each
  // rank's under its process).
  nlohmann::json stages = nlohmann::json::array();
  for (std::uint32_t s = 0; s < plan_.stages; ++s) {
    nlohmann::json ids = nlohmann::json::array();
    nlohmann::json layer_ids = nlohmann::json::array();  // the stage's group, every replica's here
    int first = -1;
    for (std::uint32_t r = 0; r < replicas_; ++r) {
      if (!here(r, s)) continue;
      if (first < 0) first = int(r);
      ids.push_back(stages_[r * plan_.stages + s].id());
      for (auto& a : stage_group(r, s).members()) layer_ids.push_back(a.id());
    }
    if (first < 0) continue;
    const auto& be = backends_[std::size_t(first) * plan_.stages + s];
    stages.push_back({{"stage", s},
                      {"actors", ids},
                      {"layers", layer_ids},
                      {"loop", stages_[std::size_t(first) * plan_.stages + s].loop()},
                      {"rank", me_},
                      {"device", be ? std::string(be->name()) : "cpu"}});
  }
  nlohmann::json actions = nlohmann::json::array();
  for (const auto& l : plan_.actions) {
    nlohmann::json row = nlohmann::json::array();
    if (!options_.emergent)
      for (const auto& a : l) row.push_back({{"op", std::string(1, char(a.op))}, {"mb", a.micro_batch}, {"chunk", a.chunk}});
    actions.push_back(row);
  }
  return {{"stages", stages},
          {"schedule",
           {{"name", options_.emergent ? std::string("emergent") : plan_.name},
            {"stages", plan_.stages},
            {"microbatches", plan_.micro_batches},
            {"chunks", plan_.chunks},
            {"actions", actions}}}};
}

void name_stage_tracks(actors::runtime& rt, const pipeline& p) {
  const std::uint32_t S = p.plan().stages;
  for (std::uint32_t s = 0; s < S * p.replicas(); ++s)
    if (p.stage_actors()[s])  // empty: a stage on another rank, which names its own
    rt.trace().name_track(stage_track(s),
                          p.replicas() > 1 ? "replica " + std::to_string(s / S) + " stage " + std::to_string(s % S)
                                           : "stage " + std::to_string(s),
                          long(s));
}

void write_trace(actors::runtime& rt, const pipeline& p, const std::string& path) {
  name_stage_tracks(rt, p);
  rt.write_trace(path, p.trace_metadata());
}

std::vector<double> predicted_bubbles(const schedule& plan, const std::vector<stage_metrics>& m) {
  if (m.size() != plan.stages)
    throw std::invalid_argument("predicted_bubbles: " + std::to_string(m.size()) + " stage metrics for " +
                                std::to_string(plan.stages) + " stages");
  auto mean = [](double total, std::int64_t n) { return n > 0 ? total / double(n) : 0.0; };
  std::vector<action_costs> costs(plan.stages);
  std::vector<double> optimizer(plan.stages, 0);
  for (std::uint32_t s = 0; s < plan.stages; ++s) {
    // A non-split B is all of backward: its measured mean goes in b, and w stays 0.
    costs[s] = {mean(m[s].f_s, m[s].f_count), mean(m[s].b_s, m[s].b_count), mean(m[s].w_s, m[s].w_count)};
    optimizer[s] = mean(m[s].optimizer_s, m[s].steps);
  }
  const auto sim = simulate(plan, costs);
  double step_end = 0;
  std::vector<double> busy(plan.stages, 0);
  for (std::uint32_t s = 0; s < plan.stages; ++s) {
    for (std::size_t i = 0; i < sim.end[s].size(); ++i) busy[s] += sim.end[s][i] - sim.start[s][i];
    busy[s] += optimizer[s];
    // A stage's actions run one after another: its last ends last.
    step_end = std::max(step_end, (sim.end[s].empty() ? 0.0 : sim.end[s].back()) + optimizer[s]);
  }
  for (auto& b : busy) b = step_end > 0 ? 1.0 - b / step_end : 0.0;  // now the bubble
  return busy;
}

std::string measured_table(const pipeline& p, std::size_t columns) {
  const auto& steps = p.last_step();
  double end = 0;
  for (auto& l : steps)
    for (auto& a : l) end = std::max(end, a.end);
  std::ostringstream o;
  if (end <= 0) return "";
  const bool chunks = p.plan().chunks > 1;
  o << "measured (last step, " << std::fixed;
  o.precision(2);
  o << end * 1e3 << " ms; one column = " << end * 1e3 / double(columns)
    << " ms; capitals mark where an action starts, '.' = idle):\n";
  for (std::size_t s = 0; s < steps.size(); ++s) {
    std::string row(columns, '.');
    for (auto& a : steps[s]) {
      auto c0 = std::size_t(a.start / end * double(columns));
      auto c1 = std::max(c0 + 1, std::size_t(a.end / end * double(columns) + 0.5));
      c1 = std::min(c1, columns);
      const char lower = char(std::tolower(char(a.a.op)));
      for (std::size_t c = c0; c < c1; ++c) row[c] = lower;
      if (c0 < columns) row[c0] = char(a.a.op);
    }
    o << "stage " << s << " |" << row << "|\n";
  }
  o << "order:\n";
  for (std::size_t s = 0; s < steps.size(); ++s) {
    o << "stage " << s << " |";
    for (auto& a : steps[s]) o << ' ' << to_string(a.a, chunks);
    o << '\n';
  }
  return o.str();
}


}  // namespace nerve::pipeline

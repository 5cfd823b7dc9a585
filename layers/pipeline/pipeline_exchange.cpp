// What a pipeline hands between steps: the optimizer state out and in, the device stages'
// weights down into the graphs, and, across ranks, every stage's report and prediction
// from the rank that ran it. Construction and wiring are in layers/pipeline/pipeline.cpp.
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

// Reports and optimizer states cross between ranks as CBOR: doubles in binary, so every
// bit (a NaN loss too) arrives as it was sent.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(action, op, micro_batch, chunk)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(timed_action, a, start, end)
namespace detail {
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(stage_report, losses, correct, begin_ns, end_ns, busy_ns, input_wait_ns,
                                   backpressure_ns, optimizer_ns, peak_stashed, peak_bytes, actions)
}  // namespace detail

namespace {

std::string to_wire(const nlohmann::json& j) {
  std::string out;
  nlohmann::json::to_cbor(j, out);
  return out;
}

nlohmann::json from_wire(const std::string& in, const std::string& what) {
  try {
    return nlohmann::json::from_cbor(in);
  } catch (const nlohmann::json::exception&) {
    throw std::runtime_error("pipeline: " + what + " from another rank is cut short");
  }
}

}  // namespace


layers::optimizer_state pipeline::optimizer_state_of() const {
  // Each layer's optimizer, on whichever backend, named as a network names them (replica
  // 0's: every replica steps the same sums).
  const auto N = graph_->nodes().size();
  std::vector<actors::address> first(layers_.begin(), layers_.begin() + std::ptrdiff_t(N));
  auto all = layers::ask_optimizer_state(rt_, *graph_, first);
  if (!options_.link) return all;
  // Across ranks: every rank's replica-0 stages, gathered on every rank, in rank order.
  nlohmann::json mine = {{"buffers", nlohmann::json::array()}, {"counters", all.counters}};
  // A buffer's floats go as one CBOR byte string, not a JSON value per float.
  for (const auto& b : all.buffers) {
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(b.values.data());
    mine["buffers"].push_back({b.parameter, b.name,
                               nlohmann::json::binary({bytes, bytes + b.values.size() * sizeof(float)})});
  }
  layers::optimizer_state merged;
  for (const auto& part : options_.link->all_gather(to_wire(mine))) {
    const auto j = from_wire(part, "an optimizer state");
    for (const auto& b : j.at("buffers")) {
      const auto& bytes = b.at(2).get_binary();
      std::vector<float> values(bytes.size() / sizeof(float));
      std::memcpy(values.data(), bytes.data(), values.size() * sizeof(float));
      merged.buffers.push_back({b.at(0).get<std::string>(), b.at(1).get<std::string>(), std::move(values)});
    }
    for (const auto& [k, v] : j.at("counters").items()) merged.counters.emplace(k, v.get<std::int64_t>());
  }
  return merged;
}

void pipeline::load_optimizer_state(const layers::optimizer_state& state) {
  const auto& nodes = graph_->nodes();
  std::vector<layers::optimizer_state> parts(nodes.size());
  // The node a parameter's name belongs to, whichever rank runs it (`nodes.size()`: none).
  const auto owner_of = [&](const std::string& name) {
    return std::size_t(std::find_if(nodes.begin(), nodes.end(), [&](auto& n) {
                         return !n.is_input() && name.starts_with(n.name + '.');
                       }) - nodes.begin());
  };
  for (const auto& b : state.buffers) {
    const auto i = owner_of(b.parameter);
    if (i == nodes.size())
      throw std::invalid_argument("optimizer state: '" + b.parameter + "' belongs to no layer of the pipeline");
    parts[i].buffers.push_back({b.parameter.substr(nodes[i].name.size() + 1), b.name, b.values});
  }
  for (const auto& [k, v] : state.counters) {
    const auto i = owner_of(k);
    if (i < nodes.size()) parts[i].counters[k.substr(nodes[i].name.size() + 1)] = v;
    else  // a stage-wide counter (`steps` of a checkpoint written by stage optimizers): every layer's
      for (auto& part : parts) part.counters.emplace(k, v);
  }
  for (const auto& t : graph_->ties()) parts[t.copy] = parts[t.owner];  // it made the owner's updates
  std::vector<std::future<bool>> done;  // every replica's layers: they step alike
  for (std::size_t k = 0; k < layers_.size(); ++k)
    if (layers_[k])
      done.push_back(rt_.ask<bool>(layers_[k], layers::set_optimizer_state{parts[k % nodes.size()]},
                                   std::chrono::nanoseconds::max()));
  for (auto& f : done) f.get();
}


void pipeline::download() {
  for (auto& be : backends_)  // every replica's into its own graph
    if (be) be->download();
  if (!options_.link) return;
  // Every rank sends the weights of replica 0's stages it runs, in node order (parameters,
  // then buffers), and takes the others'. Both ends know the layout from the partition.
  const auto each_tensor = [&](std::uint32_t s, auto&& f) {
    for (std::size_t i = 0; i < node_stage_.size(); ++i) {
      if (graph_->nodes()[i].is_input() || node_stage_[i] != s) continue;
      auto& l = *graph_->nodes()[i].layer;
      for (auto& p : l.parameters()) f(*p.value);
      for (auto& b : l.buffers()) f(*b.value);
    }
  };
  std::string mine;
  for (std::uint32_t s = 0; s < plan_.stages; ++s)
    if (here(0, s))
      each_tensor(s, [&](const layers::tensor& t) {
        mine.append(reinterpret_cast<const char*>(t.data()), std::size_t(t.size()) * sizeof(float));
      });
  const auto all = options_.link->all_gather(mine);
  std::vector<std::size_t> at(all.size(), 0);
  for (std::uint32_t s = 0; s < plan_.stages; ++s) {
    const auto k = std::size_t(rank_of(0, s));
    if (int(k) == me_) continue;
    each_tensor(s, [&](layers::tensor& t) {
      const auto bytes = std::size_t(t.size()) * sizeof(float);
      if (at[k] + bytes > all[k].size())
        throw std::runtime_error("pipeline: rank " + std::to_string(k) + " sent fewer weights than stage " +
                                 std::to_string(s) + " holds (the ranks were built differently)");
      std::memcpy(t.data(), all[k].data() + at[k], bytes);
      at[k] += bytes;
    });
  }
}

void pipeline::exchange(std::vector<stage_report>& reports, const std::vector<bool>& local) {
  nlohmann::json mine = nlohmann::json::array();
  for (std::size_t i = 0; i < reports.size(); ++i)
    if (local[i]) mine.push_back({i, reports[i]});
  const auto all = gather_watched(to_wire(mine), "the reports of the step");
  for (std::size_t k = 0; k < all.size(); ++k) {
    if (int(k) == me_) continue;
    for (const auto& r : from_wire(all[k], "a stage report")) {
      const auto i = r.at(0).get<std::size_t>();
      if (i >= reports.size() || local[i] || rank_of(std::uint32_t(i / plan_.stages), std::uint32_t(i % plan_.stages)) != int(k))
        throw std::runtime_error("pipeline: rank " + std::to_string(k) + " reported stage " + std::to_string(i) +
                                 ", which is not its own");
      reports[i] = r.at(1).get<stage_report>();
    }
  }
}

void pipeline::exchange_outputs(std::vector<stage_report>& reports, const std::vector<bool>& local) {
  // Per output: its sample shape, then its rows (floats survive JSON's doubles exactly).
  nlohmann::json mine = nlohmann::json::array();
  for (std::size_t i = 0; i < reports.size(); ++i) {
    if (!local[i] || reports[i].outputs.empty()) continue;
    nlohmann::json outs = nlohmann::json::array();
    for (const auto& o : reports[i].outputs)
      outs.push_back({o.sample_shape().dims(), std::vector<float>(o.data(), o.data() + o.matrix().size())});
    mine.push_back({i, std::move(outs)});
  }
  const auto all = gather_watched(to_wire(mine), "the reports of the step");
  for (std::size_t k = 0; k < all.size(); ++k) {
    if (int(k) == me_) continue;
    for (const auto& r : from_wire(all[k], "a prediction")) {
      const auto i = r.at(0).get<std::size_t>();
      if (i >= reports.size() || local[i])
        throw std::runtime_error("pipeline: rank " + std::to_string(k) + " sent the prediction of stage " +
                                 std::to_string(i) + ", which is not its own");
      auto& outs = reports[i].outputs;
      outs.clear();
      for (const auto& o : r.at(1)) {
        const layers::shape sh(o.at(0).get<std::vector<std::int64_t>>());
        const auto values = o.at(1).get<std::vector<float>>();
        if (sh.numel() == 0 || values.size() % std::size_t(sh.numel()) != 0)
          throw std::runtime_error("pipeline: rank " + std::to_string(k) + " sent a malformed prediction");
        layers::tensor t(std::int64_t(values.size() / std::size_t(sh.numel())), sh);
        std::copy(values.begin(), values.end(), t.data());
        outs.push_back(std::move(t));
      }
    }
  }
}


std::vector<std::string> pipeline::gather_watched(const std::string& mine, const std::string& waiting_for) {
  if (options_.stall_timeout_s <= 0) return options_.link->all_gather(mine);
  // The collective blocks its caller until every rank joins: it runs on a thread of its
  // own, which a stopped rank leaves blocked (the process then ends through `on_stall`).
  auto done = std::make_shared<std::promise<std::vector<std::string>>>();
  auto f = done->get_future();
  std::thread([link = options_.link, done, mine] {
    try {
      done->set_value(link->all_gather(mine));
    } catch (...) {
      done->set_exception(std::current_exception());
    }
  }).detach();
  if (f.wait_for(std::chrono::duration<double>(options_.stall_timeout_s)) == std::future_status::timeout) {
    char secs[32];
    std::snprintf(secs, sizeof secs, "%g", options_.stall_timeout_s);
    std::string others, stages;
    for (int k = 0; k < options_.link->size(); ++k)
      if (k != me_) others += (others.empty() ? "" : ", ") + std::to_string(k);
    for (std::uint32_t r = 0; r < replicas_; ++r)
      for (std::uint32_t s = 0; s < plan_.stages; ++s)
        if (!here(r, s))
          stages += (stages.empty() ? "" : ", ") + (replicas_ > 1 ? "replica " + std::to_string(r) + " " : std::string()) +
                    "stage " + std::to_string(s) + " (rank " + std::to_string(rank_of(r, s)) + ")";
    stall("pipeline stalled: the stages of rank " + std::to_string(me_) + " wait for " + waiting_for + " from " + stages +
          ", which did not come for " + secs + " s (--stall-timeout): nothing came from rank " + others + " for " +
          secs + " s");
  }
  return f.get();
}


}  // namespace nerve::pipeline

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

pipeline::pipeline(actors::runtime& rt, layers::graph& g, partition pieces, schedule plan,
                   std::shared_ptr<const layers::loss> criterion, layers::optimizer_factory make_optimizer,
                   pipeline_options options)
    : pipeline(rt, std::vector<layers::graph*>{&g}, std::move(pieces), std::move(plan), std::move(criterion),
               std::move(make_optimizer), std::move(options)) {}

pipeline::pipeline(actors::runtime& rt, std::vector<layers::graph*> replicas, partition pieces, schedule plan,
                   std::shared_ptr<const layers::loss> criterion, layers::optimizer_factory make_optimizer,
                   pipeline_options options)
    : rt_(rt),
      replicas_(std::uint32_t(replicas.size())),
      pieces_(std::move(pieces)),
      plan_(std::move(plan)),
      options_(std::move(options)) {
  if (replicas.empty()) throw std::invalid_argument("pipeline: no graph");
  graph_ = replicas[0];
  if (options_.emergent) {
    if (plan_.chunks != 1 || plan_.split_backward)
      throw std::invalid_argument("pipeline: emergent mode runs one chunk per stage and a whole backward");
  } else {
    validate(plan_);
  }
  if (pieces_.size() != plan_.pieces())
    throw std::invalid_argument("pipeline: the schedule has " + std::to_string(plan_.stages) + " stages × " +
                                std::to_string(plan_.chunks) + " chunks = " + std::to_string(plan_.pieces()) +
                                " pieces, the partition " + std::to_string(pieces_.size()));
  for (auto* g : replicas)
    if (g->inputs().size() != 1) throw std::invalid_argument("pipeline: the graph must have exactly one input");
  const std::uint32_t S = plan_.stages;
  if (!options_.loops.empty() && options_.loops.size() != std::size_t(S) * replicas_)
    throw std::invalid_argument("pipeline: " + std::to_string(options_.loops.size()) + " loops given for " +
                                std::to_string(S * replicas_) + " stages");
  if (!options_.backends.empty() && options_.backends.size() != S &&
      options_.backends.size() != std::size_t(S) * replicas_)
    throw std::invalid_argument("pipeline: " + std::to_string(options_.backends.size()) + " stage backends given for " +
                                std::to_string(S) + " stages" +
                                (replicas_ > 1 ? " (or " + std::to_string(S * replicas_) + ", one per replica's stage)"
                                               : std::string()));
  if (options_.link) {
    const int size = options_.link->size();
    me_ = options_.link->rank();
    ranks_ = options_.ranks;
    if (ranks_.empty()) {
      if (std::uint32_t(size) != S * replicas_)
        throw std::invalid_argument("pipeline: " + std::to_string(S) + " stages x " + std::to_string(replicas_) +
                                    " replicas run on " + std::to_string(S * replicas_) + " ranks, one each; the job has " +
                                    std::to_string(size));
      for (int k = 0; k < size; ++k) ranks_.push_back(k);
    }
    if (ranks_.size() != std::size_t(S) * replicas_)
      throw std::invalid_argument("pipeline: " + std::to_string(ranks_.size()) + " ranks given for " +
                                  std::to_string(S * replicas_) + " stages");
    for (auto k : ranks_)
      if (k < 0 || k >= size)
        throw std::invalid_argument("pipeline: rank " + std::to_string(k) + " is not in a job of " + std::to_string(size));
    // The all-reduce across ranks has one member per rank: a stage's replicas are all on
    // one rank (summed in process) or each on its own.
    for (std::uint32_t s = 0; s < S && replicas_ > 1; ++s) {
      std::vector<int> on;
      for (std::uint32_t r = 0; r < replicas_; ++r) on.push_back(ranks_[r * S + s]);
      std::sort(on.begin(), on.end());
      const bool one = on.front() == on.back(), each = std::adjacent_find(on.begin(), on.end()) == on.end();
      if (!one && !each)
        throw std::invalid_argument("pipeline: the replicas of stage " + std::to_string(s) +
                                    " must be all on one rank or each on its own");
    }
  }
  spawn_groups(replicas, criterion, make_optimizer);
  reset_metrics();
}

void pipeline::spawn_groups(const std::vector<layers::graph*>& replicas, std::shared_ptr<const layers::loss> criterion,
                            const layers::optimizer_factory& make_optimizer) {
  const std::uint32_t S = plan_.stages, P = plan_.pieces(), M = plan_.micro_batches;
  const auto shared_plan = std::make_shared<const schedule>(plan_);
  const auto loop_of = [&](std::uint32_t r, std::uint32_t s) {
    return options_.loops.empty() ? (r * S + s) % rt_.loop_count() : options_.loops[r * S + s];
  };
  auto& g0 = *replicas[0];
  const auto& nodes0 = g0.nodes();
  const std::size_t N = nodes0.size();
  const auto flow = layers::make_plan(g0);  // the graph's edges
  // The piece of every node (graph inputs count as piece 0's), checked against the cut.
  std::vector<std::uint32_t> piece_of(N, 0);
  std::vector<bool> placed(N, false);
  for (std::uint32_t p = 0; p < P; ++p) {
    if (pieces_[p].empty()) throw std::invalid_argument("pipeline: piece " + std::to_string(p) + " is empty");
    for (auto i : pieces_[p]) {
      if (i >= N || nodes0[i].is_input())
        throw std::invalid_argument("pipeline: node " + std::to_string(i) + " of piece " + std::to_string(p) + " is not a layer");
      piece_of[i] = p;
      placed[i] = true;
    }
  }
  for (std::size_t i = 0; i < N; ++i) {
    if (!nodes0[i].is_input() && !placed[i])
      throw std::invalid_argument("pipeline: layer '" + nodes0[i].name + "' is in no piece");
    for (auto x : nodes0[i].inputs)
      if (placed[i] && piece_of[x] > piece_of[i])
        throw std::invalid_argument("pipeline: layer '" + nodes0[i].name + "' in piece " + std::to_string(piece_of[i]) +
                                    " needs '" + nodes0[x].name + "' from a later piece");
  }
  if (piece_of[g0.output()] + 1 != P)
    throw std::invalid_argument("pipeline: the graph output '" + nodes0[g0.output()].name + "' is not in the last piece");
  const std::uint32_t last_stage = (P - 1) % S;
  // A backend per stage of each replica here: a device's over the stage's nodes (each its
  // own stream: several replicas may share a device), made from its replica's graph, or the
  // CPU's. Another rank's stages stay null.
  backends_.assign(std::size_t(S) * replicas_, nullptr);
  for (std::uint32_t s = 0; s < S; ++s) {
    // The replicas of a stage sum their gradients where they are: all on devices or all on the CPU.
    for (std::uint32_t r = 1; r < replicas_; ++r)
      if (bool(factory_of(r, s)) != bool(factory_of(0, s)))
        throw std::invalid_argument("pipeline: the replicas of stage " + std::to_string(s) +
                                    " must all run on devices or all on the CPU");
    for (std::uint32_t r = 0; r < replicas_; ++r) {
      if (!here(r, s)) continue;
      if (!factory_of(r, s)) {
        backends_[r * S + s] = layers::make_cpu_backend(make_optimizer);
        continue;
      }
      std::vector<std::size_t> mine;
      for (std::uint32_t k = 0; k < plan_.chunks; ++k)
        for (auto i : pieces_[plan_.piece(s, k)]) mine.push_back(i);
      backends_[r * S + s] = (*factory_of(r, s))(*replicas[r], mine);
    }
  }
  node_stage_.assign(N, 0);
  for (std::size_t i = 0; i < N; ++i) node_stage_[i] = piece_of[i] % S;
  const auto stage_of = [&](std::size_t node) { return node_stage_[node]; };
  const auto tied = [&](std::size_t node) {
    const auto& ties = graph_->ties();
    return std::any_of(ties.begin(), ties.end(), [&](const auto& t) { return t.copy == node || t.owner == node; });
  };
  // How a value of a node in stage `from` of replica r leaves for stage `to`: CPU stages and
  // values that stay in their stage leave as they are; a device stage's go to another stream
  // of its device as a copy with its ready event, anywhere else (another rank too: the wire
  // carries host tensors) through the host.
  const auto crossing = [&](std::uint32_t r, std::uint32_t from, std::uint32_t to) {
    const auto &a = backends_[r * S + from], &b = backends_[r * S + to];
    if (!a->on_device() || from == to) return layers::crossing::none;
    if (rank_of(r, from) != rank_of(r, to)) return layers::crossing::host;
    return b->on_device() && b->domain() == a->domain() ? layers::crossing::device : layers::crossing::host;
  };
  // Edges between ranks: a channel each, numbered in wiring order (the same on every rank).
  auto* link = options_.link.get();
  rank_link::channel next_channel = 0;
  // The last stage's backend computes the loss where it can (a device on its stream, so
  // the logits and their gradient stay there); a loss a device cannot run is the CPU's.
  bool own_loss = true;
  for (std::uint32_t r = 0; r < replicas_; ++r) {
    const auto& b = backends_[r * S + last_stage];
    if (!b) continue;
    try {
      b->check_loss(*criterion);
    } catch (const std::invalid_argument&) {
      own_loss = false;
    }
  }

  layers_.assign(std::size_t(replicas_) * N, actors::address{});
  watches_.assign(std::size_t(replicas_) * S, nullptr);
  std::vector<layers::layer_gating> gating(std::size_t(replicas_) * N);  // given once the reducers exist
  for (std::uint32_t r = 0; r < replicas_; ++r) {
    auto& g = *replicas[r];
    auto& nodes = g.nodes();
    const std::string group = replicas_ > 1 ? "replica " + std::to_string(r) : "pipeline";
    const auto* stage_backends = &backends_[std::size_t(r) * S];
    const auto loss_backend = own_loss ? stage_backends[last_stage] : layers::make_cpu_backend(nullptr);
    // The gates first: they supervise their layers. Another rank's stage keeps its index, empty.
    std::vector<stage_gate*> gates(S);
    for (std::uint32_t s = 0; s < S; ++s) {
      stages_.emplace_back();
      if (!here(r, s)) continue;
      // Its messages of a step (arrivals, done reports) fit whatever the order.
      const actors::spawn_options so{.loop = loop_of(r, s),
                                     .capacity = std::size_t(8) * (M + 1) * (N + 2) * plan_.chunks};
      stage_gate::config gc{s, shared_plan, criterion, options_.emergent ? admission::emergent : admission::schedule, options_.credits ? options_.credits : S - s};
      if (s == last_stage) gc.loss_backend = loss_backend;
      if (options_.stall_timeout_s > 0) gc.watch = watches_[std::size_t(r) * S + s] = std::make_shared<stage_watch>();
      stages_.back() = rt_.spawn_with<stage_gate>(so, std::move(gc));
      gates[s] = static_cast<stage_gate*>(stages_.back().get());
      rt_.annotate(stages_.back().id(), int(s), group);
    }
    auto* at = &layers_[std::size_t(r) * N];
    auto actor_at = [&](std::size_t i) -> layers::layer_actor& { return *static_cast<layers::layer_actor*>(at[i].get()); };
    for (std::size_t i : g.order()) {
      if (nodes[i].is_input()) continue;
      const std::uint32_t s = piece_of[i] % S;
      if (!here(r, s)) continue;
      // Every forward and gradient of a step fits, held or not, with the gate's admits.
      const actors::spawn_options so{
          .loop = loop_of(r, s),
          .capacity = std::size_t(M + 1) * (nodes[i].inputs.size() + flow.nodes[i].edge_count() + 4) + 16,
          .supervisor = stages_[r * S + s]};
      at[i] = rt_.spawn_with<layers::layer_actor>(
          so, nodes[i], std::uint32_t(i), flow.nodes[i],
          stage_backends[s]->kernels_for(nodes[i]));
      rt_.annotate(at[i].id(), int(s), group);
    }
    // Edges are bus signals, as in a network; forwards that enter a piece and gradients that
    // come back into one are held by the layer until its gate admits them.
    std::vector<gate_piece> chunks(std::size_t(S) * plan_.chunks);  // by piece
    std::int32_t next_edge = 0;
    // An edge from stage `from` to stage `to` of this replica, from signal `out()` to
    // `at[receiver]`: subscribed here when both ends are, through the link when one is
    // (each rank wires its own end).
    auto connect = [&](std::uint32_t from, std::uint32_t to, auto&& out, std::uint32_t port, std::size_t receiver,
                       auto remote, auto receive) {
      if (rank_of(r, from) == rank_of(r, to)) {
        if (here(r, from)) out().subscribe(at[receiver], port);
        return;
      }
      const auto ch = next_channel++;
      if (here(r, from)) out().subscribe((link->*remote)(rank_of(r, to), ch), port);
      else if (here(r, to)) (link->*receive)(ch, at[receiver]);
    };
    for (std::size_t i = 0; i < N; ++i) {
      const auto& np = flow.nodes[i];
      if (nodes[i].is_input()) {
        for (auto& e : np.edges)
          connect(0, stage_of(e.consumer), [&]() -> auto& { return gates[0]->input(); }, e.port, e.consumer,
                  &rank_link::forward_to, &rank_link::receive_forward);
        continue;
      }
      const auto p = piece_of[i], s = p % S;
      layers::layer_gating gate{
          .gate = stages_[r * S + s], .piece = p, .defer_weight = plan_.split_backward, .defer_step = true, .rank = r};
      std::vector<std::int32_t> edge_ids;
      std::set<std::uint32_t> to;  // the stages its output goes to
      for (std::uint32_t k = 0; k < np.edges.size(); ++k) {
        const auto& e = np.edges[k];
        connect(s, stage_of(e.consumer), [&]() -> auto& { return actor_at(i).output(); }, e.port, e.consumer,
                &rank_link::forward_to, &rank_link::receive_forward);
        connect(stage_of(e.consumer), s, [&]() -> auto& { return actor_at(e.consumer).input_gradient(e.port); }, k, i,
                &rank_link::backward_to, &rank_link::receive_backward);
        edge_ids.push_back(next_edge++);
        gate.hold_backward.push_back(piece_of[e.consumer] != p);
        to.insert(stage_of(e.consumer));
      }
      if (!here(r, s)) {  // another rank's layer: only the ends of its edges that are here were wired
        next_edge += np.feeds_loss;
        continue;
      }
      auto& a = actor_at(i);
      // Its output leaves device-resident only toward one other stage of its device.
      for (auto t : to) gate.output = std::max(gate.output, crossing(r, s, t));
      if (np.feeds_loss && loss_backend != stage_backends[s] && stage_backends[s]->on_device())
        gate.output = layers::crossing::host;  // a device's output to a loss on the host
      if (gate.output == layers::crossing::device && to.size() > 1) gate.output = layers::crossing::host;
      for (auto x : nodes[i].inputs)
        gate.gradients.push_back(nodes[x].is_input() ? layers::crossing::none : crossing(r, s, stage_of(x)));
      if (np.feeds_loss) {
        a.output().subscribe(stages_[r * S + last_stage], 0);
        gates[last_stage]->loss_gradient().subscribe(at[i], std::uint32_t(np.edges.size()));
        edge_ids.push_back(next_edge++);
      }
      for (std::size_t q = 0; q < nodes[i].inputs.size(); ++q)
        if (piece_of[nodes[i].inputs[q]] != p) gate.hold_forward |= layers::input_mask{1} << q;
      auto& ch = chunks[p];
      ch.layers.push_back(at[i]);
      if (gate.hold_forward) ch.entries.push_back(at[i]);
      ch.forwards_in += std::uint32_t(std::popcount(gate.hold_forward));
      const auto held_back = std::count(gate.hold_backward.begin(), gate.hold_backward.end(), true);
      if (held_back) ch.exits.push_back(at[i]);
      ch.gradients_in += std::uint32_t(held_back);
      a.wire(stages_[r * S + s], std::move(edge_ids));
      gating[r * N + i] = std::move(gate);
    }
    for (std::uint32_t s = 0; s < S; ++s) {
      bus::group members("stage " + std::to_string(s) + (replicas_ > 1 ? " of replica " + std::to_string(r) : ""));
      if (here(r, s)) {  // another rank's stays empty: it keeps the indices
        std::vector<gate_piece> mine;
        for (std::uint32_t k = 0; k < plan_.chunks; ++k) {
          mine.push_back(std::move(chunks[plan_.piece(s, k)]));
          for (auto& l : mine.back().layers) members.add(l);
        }
        gates[s]->wire(std::move(mine), members.members());
      }
      groups_.push_back(std::move(members));
    }
  }
  // Device stages whose replicas are each on a rank of their own: how each sums among its
  // ranks (the backends' own way, NCCL, where every member has it; else through the host).
  // Read only where a stage's replicas are on several ranks, so with a link.
  const auto rank_sums = replicas_ > 1 && link ? agree_rank_sums() : std::vector<std::string>{};
  // Data parallelism: the replicas of each layer with parameters form a group whose
  // all-reduce sums its gradients (in rank order: the same bits whatever the arrival order),
  // started as soon as the layer's last W of the step ran.
  if (replicas_ > 1)
    for (std::size_t i = 0; i < N; ++i) {
      if (nodes0[i].is_input() || !nodes0[i].layer->has_parameters()) continue;
      if (tied(i)) continue;  // its group is the tie's, below
      const std::uint32_t s = stage_of(i);
      const auto name = "all-reduce " + nodes0[i].name;
      if (rank_of(0, s) != rank_of(1, s)) {  // each replica on its own rank (checked): the link's all-reduce
        const auto ch = next_channel++;
        std::vector<int> ranks;
        for (std::uint32_t r = 0; r < replicas_; ++r) ranks.push_back(rank_of(r, s));
        for (std::uint32_t r = 0; r < replicas_; ++r) {
          if (!here(r, s)) continue;
          const auto& local = layers_[r * N + i];
          layers::rank_reduce how{replicas_, r, rank_sums[s], {}};
          how.host = [&, ch, r](actors::address to) {
            reducers_.push_back(link->spawn_reducer(rt_, to.loop(), ch, ranks, r, std::move(to), name));
            return reducers_.back();
          };
          // A device stage's reducer takes its gradients off the device (or sums them among
          // the ranks' devices); the CPU's go to the ranks' all-reduce directly.
          actors::address reducer;
          if (auto& be = backends_[r * S + s]; be->on_device()) {
            const actors::spawn_options so{.loop = local.loop(), .supervisor = stages_[r * S + s]};
            reducer = be->spawn_rank_reducer(rt_, so, name, local, how);
            if (reducer) reducers_.push_back(reducer);
          }
          gating[r * N + i].reducer = reducer ? reducer : how.host(local);
        }
        continue;
      }
      if (!here(0, s)) continue;
      bus::group members(nodes0[i].name + " replicas");
      for (std::uint32_t r = 0; r < replicas_; ++r) members.add(layers_[r * N + i]);
      const actors::spawn_options so{.loop = layers_[i].loop(), .supervisor = stages_[s]};
      // Device stages sum where the gradients are (on the device, or NCCL across devices);
      // the CPU's on the host.
      actors::address reducer;
      if (auto& be = backends_[s]; be->on_device()) {
        std::vector<layers::backend*> each;
        for (std::uint32_t r = 0; r < replicas_; ++r) each.push_back(backends_[r * S + s].get());
        reducer = be->spawn_reducer(rt_, so, name, members, each);
      }
      if (!reducer) reducer = rt_.spawn_with<bus::all_reduce>(so, name, std::move(members));
      reducers_.push_back(reducer);
      for (std::uint32_t r = 0; r < replicas_; ++r) gating[r * N + i].reducer = reducers_.back();
    }
  // Tied weights (a head that shares its token embedding's, on the last stage and the
  // first): every replica's owner and copy form one group, members in the order owner of
  // replica 0…R-1, then copy of replica 0…R-1, so the sum has the same bits whatever the cut.
  for (const auto& t : graph_->ties()) {
    std::vector<std::pair<std::uint32_t, std::size_t>> who;  // (replica, node) per member
    for (const auto node : {t.owner, t.copy})
      for (std::uint32_t r = 0; r < replicas_; ++r) who.emplace_back(r, node);
    const auto name = "all-reduce " + nodes0[t.owner].name + " tied to " + nodes0[t.copy].name;
    std::vector<int> ranks;
    for (const auto& [r, i] : who) ranks.push_back(rank_of(r, stage_of(i)));
    const bool one_rank = std::all_of(ranks.begin(), ranks.end(), [&](int k) { return k == ranks[0]; });
    if (!one_rank) {
      // Each member on a rank of its own: the link's all-reduce, through the host.
      auto sorted = ranks;
      std::sort(sorted.begin(), sorted.end());
      if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
        throw std::invalid_argument("pipeline: the weights of '" + nodes0[t.copy].name + "' tied to '" +
                                    nodes0[t.owner].name + "' are on ranks that hold several of their " +
                                    std::to_string(who.size()) + " copies: give each stage with a tied weight a rank "
                                    "of its own");
      const auto ch = next_channel++;
      for (std::uint32_t k = 0; k < who.size(); ++k) {
        const auto [r, i] = who[k];
        const auto s = stage_of(i);
        if (!here(r, s)) continue;
        if (backends_[r * S + s]->on_device())
          throw std::invalid_argument("pipeline: the weights of '" + nodes0[t.copy].name + "' tied to '" +
                                      nodes0[t.owner].name + "' across ranks are summed on the host: run their "
                                      "stages on the CPU");
        const auto& local = layers_[r * N + i];
        reducers_.push_back(link->spawn_reducer(rt_, local.loop(), ch, ranks, k, local, name));
        gating[r * N + i].reducer = reducers_.back();
        gating[r * N + i].rank = k;
      }
      continue;
    }
    if (!here(0, stage_of(t.owner))) continue;
    bus::group members(name);
    std::vector<layers::backend*> each;
    for (const auto& [r, i] : who) {
      members.add(layers_[r * N + i]);
      each.push_back(backends_[r * S + stage_of(i)].get());
    }
    const actors::spawn_options so{.loop = layers_[t.owner].loop(), .supervisor = stages_[stage_of(t.owner)]};
    auto reducer = backends_[stage_of(t.owner)]->on_device()
                       ? backends_[stage_of(t.owner)]->spawn_reducer(rt_, so, name, members, each)
                       : actors::address{};
    if (!reducer) reducer = rt_.spawn_with<bus::all_reduce>(so, name, std::move(members));
    reducers_.push_back(reducer);
    for (std::uint32_t k = 0; k < who.size(); ++k) {
      gating[who[k].first * N + who[k].second].reducer = reducer;
      gating[who[k].first * N + who[k].second].rank = k;
    }
  }
  for (std::size_t k = 0; k < layers_.size(); ++k)
    if (layers_[k]) static_cast<layers::layer_actor*>(layers_[k].get())->gate(std::move(gating[k]));
  if (link) {
    // Every rank built the same pipeline (or the channels would not meet): the shape of
    // the graph, the cut, the schedule and the placement, checked on every rank. It also
    // holds every rank here until all have listened, so no value leaves before its
    // receiver is wired.
    std::string mine = "S=" + std::to_string(S) + " M=" + std::to_string(M) + " chunks=" +
                       std::to_string(plan_.chunks) + " replicas=" + std::to_string(replicas_) + " schedule=" +
                       (options_.emergent ? std::string("emergent") : plan_.name) + " channels=" +
                       std::to_string(next_channel) + " layers=";
    for (std::size_t i = 0; i < N; ++i)
      mine += nodes0[i].name + "/" + std::to_string(nodes0[i].output_shape.numel()) + ":" +
              std::to_string(piece_of[i]) + (i + 1 < N ? "," : "");
    const auto all = link->all_gather(mine);
    std::string differ;
    for (std::size_t k = 0; k < all.size(); ++k)
      if (all[k] != mine) differ += (differ.empty() ? "" : ", ") + std::to_string(k);
    if (!differ.empty())
      throw std::invalid_argument("pipeline: rank " + std::to_string(me_) + " and rank" +
                                  (differ.find(',') == std::string::npos ? " " : "s ") + differ +
                                  " were built differently (start every rank with the same model, cut, schedule and "
                                  "placement); here: " + mine);
  }
}

const stage_backend_factory* pipeline::factory_of(std::uint32_t r, std::uint32_t s) const {
  if (options_.backends.empty()) return nullptr;
  const auto& f = options_.backends[options_.backends.size() == plan_.stages ? s : r * plan_.stages + s];
  return f ? &f : nullptr;
}

std::vector<std::string> pipeline::agree_rank_sums() {
  // Every rank takes part in every collective, whether or not it runs such a stage: which
  // stages they concern follows from the placement, the same on every rank.
  const std::uint32_t S = plan_.stages;
  std::vector<std::uint32_t> spread;
  for (std::uint32_t s = 0; s < S; ++s)
    if (factory_of(0, s) && rank_of(0, s) != rank_of(1, s)) spread.push_back(s);
  std::vector<std::string> ids(S);
  if (spread.empty()) return ids;
  auto& link = *options_.link;
  // First what each rank's backends can do ('1': sum among the ranks, '0': only through the
  // host, '-': no replica of that stage here); a stage sums among its ranks where all can.
  std::string can;
  for (auto s : spread) {
    char c = '-';
    for (std::uint32_t r = 0; r < replicas_; ++r)
      if (here(r, s)) c = backends_[r * S + s]->sums_across_ranks() ? '1' : '0';
    can += c;
  }
  const auto all_can = link.all_gather(can);
  // Then each stage that sums among its ranks gets its id, made on member 0's rank and read
  // by every rank (the same stages on every rank: `all_can` is).
  for (std::size_t k = 0; k < spread.size(); ++k) {
    if (!std::all_of(all_can.begin(), all_can.end(), [&](auto& c) { return c.size() == spread.size() && c[k] != '0'; }))
      continue;
    const auto st = spread[k];
    const auto mine = here(0, st) ? backends_[st]->new_rank_id() : std::string();
    ids[st] = link.all_gather(mine).at(std::size_t(rank_of(0, st)));
  }
  return ids;
}

void pipeline::stop_all() {
  // The layers first, while their gates (their supervisors) still hear what a stopped
  // neighbour does to them; then the gates and the all-reduces.
  auto sync = [&] {
    try {
      rt_.synchronize();
    } catch (...) {  // a failure elsewhere on the runtime: a step reports its own
    }
  };
  for (auto& a : layers_)
    if (a && !a.stopped()) rt_.stop(a);
  if (!layers_.empty()) sync();
  for (auto* v : {&reducers_, &stages_})
    for (auto& a : *v)
      if (!a.stopped()) rt_.stop(a);
  sync();
}

pipeline::~pipeline() { stop_all(); }

layers::bus_traffic pipeline::traffic() const {
  layers::bus_traffic t;
  const auto& nodes = graph_->nodes();
  for (std::size_t k = 0; k < layers_.size(); ++k) {
    auto* la = static_cast<layers::layer_actor*>(layers_[k].get());
    if (!la) continue;
    t.forward += la->output().deliveries();
    for (std::size_t q = 0; q < nodes[k % nodes.size()].inputs.size(); ++q) t.backward += la->input_gradient(q).deliveries();
  }
  for (auto& a : stages_) {
    auto* gate = static_cast<stage_gate*>(a.get());
    if (!gate) continue;
    t.feed += gate->input().deliveries();
    t.backward += gate->loss_gradient().deliveries();
  }
  return t;
}

bool pipeline::stopped() const noexcept {
  for (auto* v : {&stages_, &layers_})
    for (auto& a : *v)
      if (a && !a.stopped()) return false;
  return true;
}

void pipeline::reset_metrics() {
  metrics_.resize(plan_.stages);
  for (std::uint32_t s = 0; s < plan_.stages; ++s) metrics_[s] = stage_metrics{s};
}


}  // namespace nerve::pipeline

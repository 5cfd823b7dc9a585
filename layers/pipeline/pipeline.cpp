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
  // Device stages: a backend over the stage's nodes, one per replica (each its own stream:
  // several replicas may share a device), made from its replica's graph.
  backends_.assign(std::size_t(S) * replicas_, nullptr);
  for (std::uint32_t s = 0; s < S; ++s) {
    // The replicas of a stage sum their gradients where they are: all on devices or all on the CPU.
    for (std::uint32_t r = 1; r < replicas_; ++r)
      if (bool(factory_of(r, s)) != bool(factory_of(0, s)))
        throw std::invalid_argument("pipeline: the replicas of stage " + std::to_string(s) +
                                    " must all run on devices or all on the CPU");
    for (std::uint32_t r = 0; r < replicas_; ++r) {
      if (!factory_of(r, s) || !here(r, s)) continue;
      std::vector<std::size_t> mine;
      for (std::uint32_t k = 0; k < plan_.chunks; ++k)
        for (auto i : pieces_[plan_.piece(s, k)]) mine.push_back(i);
      backends_[r * S + s] = (*factory_of(r, s))(*replicas[r], mine);
    }
  }
  node_stage_.assign(N, 0);
  for (std::size_t i = 0; i < N; ++i) node_stage_[i] = piece_of[i] % S;
  const auto stage_of = [&](std::size_t node) { return node_stage_[node]; };
  // How a value of a node in stage `from` of replica r leaves for stage `to`: CPU stages and
  // values that stay in their stage leave as they are; a device stage's go to another stream
  // of its device as a copy with its ready event, anywhere else (another rank too: the wire
  // carries host tensors) through the host.
  const auto crossing = [&](std::uint32_t r, std::uint32_t from, std::uint32_t to) {
    const auto &a = backends_[r * S + from], &b = backends_[r * S + to];
    if (!a || from == to) return layers::crossing::none;
    if (rank_of(r, from) != rank_of(r, to)) return layers::crossing::host;
    return b && b->domain() == a->domain() ? layers::crossing::device : layers::crossing::host;
  };
  // Edges between ranks: a channel each, numbered in wiring order (the same on every rank).
  auto* link = options_.link.get();
  rank_link::channel next_channel = 0;
  // A device last stage computes the loss on its stream where it can (its gate then
  // enqueues it), so the logits and their gradient stay on the device.
  bool device_loss = false;
  for (std::uint32_t r = 0; r < replicas_; ++r) {
    const auto& b = backends_[r * S + last_stage];
    if (!b) continue;
    try {
      b->check_loss(*criterion);
      device_loss = true;
    } catch (const std::invalid_argument&) {
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
    const auto loss_backend = device_loss ? stage_backends[last_stage] : nullptr;
    // The gates first: they supervise their layers. Another rank's stage keeps its index, empty.
    std::vector<stage_gate*> gates(S);
    for (std::uint32_t s = 0; s < S; ++s) {
      stages_.emplace_back();
      if (!here(r, s)) continue;
      // Its messages of a step (arrivals, done reports) fit whatever the order.
      const actors::spawn_options so{.loop = loop_of(r, s),
                                     .capacity = std::size_t(8) * (M + 1) * (N + 2) * plan_.chunks};
      stage_gate::config gc{s, shared_plan, criterion, options_.emergent, options_.credits ? options_.credits : S - s};
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
      auto& be = stage_backends[s];
      at[i] = rt_.spawn_with<layers::layer_actor>(
          so, nodes[i], std::uint32_t(i), flow.nodes[i],
          be ? be->kernels_for(nodes[i]) : layers::make_cpu_kernels(nodes[i], make_optimizer()));
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
      if (np.feeds_loss && stage_backends[s] && !loss_backend) gate.output = layers::crossing::host;  // a loss on the host
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
          if (auto& be = backends_[r * S + s]) {
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
      if (auto& be = backends_[s]) {
        std::vector<layers::backend*> each;
        for (std::uint32_t r = 0; r < replicas_; ++r) each.push_back(backends_[r * S + s].get());
        reducer = be->spawn_reducer(rt_, so, name, members, each);
      }
      if (!reducer) reducer = rt_.spawn_with<bus::all_reduce>(so, name, std::move(members));
      reducers_.push_back(reducer);
      for (std::uint32_t r = 0; r < replicas_; ++r) gating[r * N + i].reducer = reducers_.back();
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
  // Each CPU layer's optimizer, named as a network names them (replica 0's: every replica
  // steps the same sums), and each device stage's, as its backend names them.
  const auto N = graph_->nodes().size();
  std::vector<actors::address> cpu(layers_.begin(), layers_.begin() + std::ptrdiff_t(N));
  for (std::size_t i = 0; i < N; ++i)
    if (backend_of(i)) cpu[i] = {};
  auto all = layers::ask_optimizer_state(rt_, *graph_, cpu);
  for (std::uint32_t s = 0; s < plan_.stages; ++s)  // replica 0's stages (r * S + s with r = 0)
    if (const auto& be = backends_[s]) {
      auto st = be->save_optimizer_state();
      for (auto& b : st.buffers) all.buffers.push_back(std::move(b));
      all.counters.merge(st.counters);
    }
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
  std::vector<layers::optimizer_state> parts(nodes.size()), devices(plan_.stages);
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
    if (backend_of(i)) devices[node_stage_[i]].buffers.push_back(b);  // named as the backend names them
    else parts[i].buffers.push_back({b.parameter.substr(nodes[i].name.size() + 1), b.name, b.values});
  }
  for (const auto& [k, v] : state.counters) {
    const auto i = owner_of(k);
    if (i < nodes.size() && backend_of(i)) devices[node_stage_[i]].counters[k] = v;
    else if (i < nodes.size()) parts[i].counters[k.substr(nodes[i].name.size() + 1)] = v;
    else  // a stage-wide counter (`steps` of a checkpoint written by stage optimizers): every layer's
      for (auto& part : parts) part.counters.emplace(k, v);
  }
  for (std::size_t k = 0; k < backends_.size(); ++k)  // every replica's: they step alike
    if (backends_[k]) backends_[k]->load_optimizer_state(devices[k % plan_.stages]);
  std::vector<std::future<bool>> done;
  for (std::size_t k = 0; k < layers_.size(); ++k)
    if (layers_[k] && !backend_of(k % nodes.size()))
      done.push_back(rt_.ask<bool>(layers_[k], layers::set_optimizer_state{parts[k % nodes.size()]},
                                   std::chrono::nanoseconds::max()));
  for (auto& f : done) f.get();
}

layers::backend* pipeline::backend_of(std::size_t node) const noexcept {
  return node < node_stage_.size() ? backends_[node_stage_[node]].get() : nullptr;
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
  const auto all = gather_watched(to_wire(mine));
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
  const auto all = gather_watched(to_wire(mine));
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

std::vector<stage_report> pipeline::run_stages(std::vector<step_msg>& msgs, const std::vector<bool>& local) {
  std::vector<std::future<stage_report>> futures(msgs.size());
  // Last stage first: a stage's first message of the step is then usually its step_msg.
  for (std::size_t i = msgs.size(); i-- > 0;)
    if (local[i]) futures[i] = rt_.ask<stage_report>(stages_[i], std::move(msgs[i]), std::chrono::nanoseconds::max());
  std::vector<stage_report> reports(msgs.size());
  if (options_.stall_timeout_s > 0) watch_stages(futures, local);
  // A failing stage fails its request with its error and makes every other stage fail
  // with `stage_aborted` (see abort_msg): rethrow the error itself.
  std::exception_ptr first_error, aborted;
  for (std::size_t i = 0; i < msgs.size(); ++i) {
    if (!local[i]) continue;
    try {
      reports[i] = futures[i].get();
    } catch (const stage_aborted&) {
      if (!aborted) aborted = std::current_exception();
    } catch (...) {
      if (!first_error) first_error = std::current_exception();
    }
  }
  if (!first_error) first_error = aborted;
  if (first_error) {
    failed_ = true;
    // Wait until the stops are handled and the stages let go of their requests, while the
    // futures still hold the errors: the last reference to each is then on this thread,
    // and every stage has stopped when the error reaches the caller.
    stop_all();
    std::rethrow_exception(first_error);
  }
  return reports;
}

void pipeline::watch_stages(std::vector<std::future<stage_report>>& futures, const std::vector<bool>& local) {
  using clock = std::chrono::steady_clock;
  const auto timeout = std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(options_.stall_timeout_s));
  // A look every eighth of the timeout: a stall is told between 1 and 1⅛ timeouts after
  // the last message, and a step that moves costs one clock read per finished stage.
  const auto look = std::max<clock::duration>(timeout / 8, std::chrono::milliseconds(1));
  const auto moved = [&] {
    std::uint64_t n = 0;
    for (auto& w : watches_)
      if (w) n += w->events();
    return n;
  };
  auto seen = moved();
  auto since = clock::now();
  for (std::size_t i = 0; i < futures.size(); ++i) {
    if (!local[i]) continue;
    while (futures[i].wait_for(look) == std::future_status::timeout) {
      const auto n = moved();
      const auto t = clock::now();
      if (n != seen) {
        seen = n;
        since = t;
        continue;
      }
      if (t - since < timeout) continue;
      stall(stall_report(options_.stall_timeout_s, local));
    }
  }
}

void pipeline::stall(const std::string& report) {
  // The stages are told to stop; a stage whose loop is blocked hears it once it is free
  // (the destructor waits for that), so the caller hears of the stall now.
  failed_ = true;
  for (std::size_t k = 0; k < stages_.size(); ++k)
    if (stages_[k] && !stages_[k].stopped())
      (void)stages_[k].get()->try_tell(detail::abort_msg{std::uint32_t(k % plan_.stages), "the step stalled"},
                                       actors::lane::urgent);
  if (options_.on_stall) options_.on_stall(report);
  throw stall_error(report);
}

std::vector<std::string> pipeline::gather_watched(const std::string& mine) {
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
    stall("pipeline stalled: the stages of rank " + std::to_string(me_) + " finished the step and wait for the reports of " +
          stages + ", which did not come for " + secs + " s (--stall-timeout): nothing came from rank " + others +
          " for " + secs + " s");
  }
  return f.get();
}

std::string pipeline::stall_report(double seconds, const std::vector<bool>& local) const {
  const std::uint32_t S = plan_.stages;
  char secs[32];
  std::snprintf(secs, sizeof secs, "%g", seconds);
  std::string out = "pipeline stalled: no stage";
  out += options_.link ? " of rank " + std::to_string(me_) : std::string();
  out += " handled a message for " + std::string(secs) + " s (--stall-timeout) while a step was in flight";
  const auto name = [&](std::uint32_t r, std::uint32_t s) {
    std::string n = (replicas_ > 1 ? "replica " + std::to_string(r) + " " : std::string()) + "stage " + std::to_string(s);
    if (options_.link) n += " (rank " + std::to_string(rank_of(r, s)) + ")";
    return n;
  };
  const auto act = [](const action& a) {
    return std::string(1, char(a.op)) + std::to_string(a.micro_batch) + (a.chunk ? " of chunk " + std::to_string(a.chunk) : "");
  };
  std::set<int> silent;  // ranks this one waits for
  for (std::size_t k = 0; k < watches_.size(); ++k) {
    if (!watches_[k] || !local[k]) continue;
    const auto r = std::uint32_t(k / S), s = std::uint32_t(k % S);
    const auto g = watches_[k]->state();
    out += "\n  " + name(r, s) + ": ";
    using ph = gate_state::phase;
    switch (g.now) {
      case ph::idle: out += "has not started the step"; break;
      case ph::failed: out += "failed"; break;
      case ph::stepping:
        out += "stopped in its optimizer step: " + std::to_string(g.done) + " of " + std::to_string(g.layers) +
               " layers done";
        break;
      case ph::running:
        out += "stopped in " + act(g.next) + ", admitted and running: " + std::to_string(g.done) + " of " +
               std::to_string(g.layers) + " layers done (a layer of this stage does not return)";
        break;
      case ph::waiting:
        out += g.has_next ? "admitted to run " + act(g.next) + " next, " : std::string();
        if (g.credits) {
          out += "waits for a credit: a gradient from " + name(r, std::uint32_t(g.from_stage));
        } else if (g.from_stage >= 0 && !g.has_next) {
          out += "waits for gradients from " + name(r, std::uint32_t(g.from_stage));
        } else if (g.from_stage >= 0) {
          out += "waits for the " + std::string(g.forward ? "activations" : "gradients") + " of micro-batch " +
                 std::to_string(g.next.micro_batch) + " from " + name(r, std::uint32_t(g.from_stage)) + " (" +
                 std::to_string(g.have) + " of " + std::to_string(g.need) + " arrived)";
        } else {
          out += "waits";
        }
        if (g.from_stage >= 0 && rank_of(r, std::uint32_t(g.from_stage)) != me_)
          silent.insert(rank_of(r, std::uint32_t(g.from_stage)));
        break;
    }
    out += "; " + std::to_string(g.actions_done) + " of " + std::to_string(g.actions) + " actions done";
    if (s + 1 < S || plan_.chunks > 1)
      out += "; edge to " + name(r, (s + 1) % S) + ": " + std::to_string(g.out) + " micro-batches out, gradients not back" +
             (g.credit_limit ? " (credits " + std::to_string(g.credit_limit) + ")" : std::string());
  }
  for (int q : silent) out += "\n  nothing came from rank " + std::to_string(q) + " for " + secs + " s";
  return out;
}

layers::step_result pipeline::evaluate(layers::tensor input, const layers::targets& t) {
  return forward_only(std::move(input), &t, nullptr);
}

layers::tensor pipeline::predict(layers::tensor input) {
  layers::tensor out;
  forward_only(std::move(input), nullptr, &out);
  return out;
}

layers::step_result pipeline::forward_only(layers::tensor input, const layers::targets* t, layers::tensor* out) {
  if (failed_) throw std::logic_error("pipeline: a previous step failed; the stages are stopped");
  const std::int64_t n = input.batch();
  if (n < 1) throw std::invalid_argument("pipeline: nothing to evaluate (a batch of 0 rows)");
  if (t && t->size() != n)
    throw std::invalid_argument("pipeline: " + std::to_string(t->size()) + " targets for a batch of " +
                                std::to_string(n));
  const std::uint32_t S = plan_.stages;
  // As many replicas and micro-batches as the rows allow: a small last batch still runs.
  const auto R = std::uint32_t(std::min<std::int64_t>(replicas_, n));
  auto addrs = std::make_shared<const std::vector<actors::address>>(stages_);
  std::vector<step_msg> msgs(std::size_t(S) * replicas_);
  std::vector<bool> local(msgs.size());
  for (std::size_t i = 0; i < msgs.size(); ++i) {
    const auto r = std::uint32_t(i / S);
    local[i] = r < R && here(r, std::uint32_t(i % S));
    msgs[i] = {.stages = addrs, .replica = r, .train = false, .want_output = out != nullptr};
  }
  const auto parts = layers::split_micro_batches(n, R);
  std::vector<std::int64_t> counts;  // per (replica, micro-batch), in row order
  std::vector<std::size_t> last_of;  // the report index of each of those micro-batches
  for (std::uint32_t r = 0; r < R; ++r) {
    const auto M = std::uint32_t(std::min<std::int64_t>(plan_.micro_batches, parts[r].count));
    const auto micro = layers::split_micro_batches(parts[r].count, M);
    for (std::uint32_t m = 0; m < M; ++m) {
      const std::int64_t first = parts[r].first + micro[m].first, count = micro[m].count;
      for (std::uint32_t s = 0; s < S; ++s) ++msgs[r * S + s].evaluations;
      if (local[r * S]) msgs[r * S].inputs.push_back(input.slice(first, count));
      if (local[r * S + S - 1]) msgs[r * S + S - 1].targets.push_back(t ? t->slice(first, count) : layers::targets{});
      counts.push_back(count);
      last_of.push_back(r * S + S - 1);
    }
  }
  auto reports = run_stages(msgs, local);
  if (options_.link) {
    exchange(reports, local);
    if (out) exchange_outputs(reports, local);
  }
  layers::step_result result;
  result.samples = n;
  std::vector<std::size_t> next(reports.size(), 0);  // the next micro-batch of each last stage
  std::vector<const layers::tensor*> rows;
  for (std::size_t k = 0; k < counts.size(); ++k) {
    const auto& last = reports[last_of[k]];
    const auto m = next[last_of[k]]++;
    result.loss += double(counts[k]) / double(n) * last.losses.at(m);
    result.correct += last.correct.at(m);
    if (out) rows.push_back(&last.outputs.at(m));
  }
  if (out) {
    *out = layers::tensor(n, rows.front()->sample_shape());
    std::int64_t at = 0;
    for (const auto* r : rows) {
      out->matrix().middleRows(at, r->batch()) = r->matrix();
      at += r->batch();
    }
  }
  return result;
}

layers::step_result pipeline::train_step(layers::tensor input, const layers::targets& t, std::uint64_t step, double lr) {
  if (failed_) throw std::logic_error("pipeline: a previous step failed; the stages are stopped");
  const std::int64_t n = input.batch();
  const std::uint32_t M = plan_.micro_batches, S = plan_.stages, R = replicas_;
  if (n < std::int64_t(M) * R)
    throw std::invalid_argument("pipeline: cannot split a batch of " + std::to_string(n) + " into " +
                                (R > 1 ? std::to_string(R) + " replicas × " : std::string()) + std::to_string(M) +
                                " micro-batches");
  if (t.size() != n)
    throw std::invalid_argument("pipeline: " + std::to_string(t.size()) + " targets for a batch of " + std::to_string(n));
  auto addrs = std::make_shared<const std::vector<actors::address>>(stages_);
  // Replica r takes rows [first_r, first_r + n_r), cut into M micro-batches; the loss
  // gradient of each is scaled by its share of all n rows, so the replicas' sum is the
  // gradient of the mean over the whole batch.
  std::vector<step_msg> msgs(std::size_t(S) * R);
  std::vector<std::int64_t> counts;  // per (replica, micro-batch)
  // The one split rule (layers/plan.hpp), twice: the batch over the replicas, each part
  // over the micro-batches.
  const auto parts = layers::split_micro_batches(n, R);
  // Across ranks a rank asks only its own stages (the others' slices are not cut).
  std::vector<bool> local(msgs.size());
  for (std::size_t i = 0; i < msgs.size(); ++i) {
    local[i] = here(std::uint32_t(i / S), std::uint32_t(i % S));
    msgs[i] = {.step = step, .lr = lr, .stages = addrs, .replica = std::uint32_t(i / S)};
  }
  for (std::uint32_t r = 0; r < R; ++r) {
    const auto micro = layers::split_micro_batches(parts[r].count, M);
    for (std::uint32_t m = 0; m < M; ++m) {
      const std::int64_t first = parts[r].first + micro[m].first, count = micro[m].count;
      auto& out = msgs[r * S + S - 1];
      if (local[r * S]) msgs[r * S].inputs.push_back(M == 1 && R == 1 ? std::move(input) : input.slice(first, count));
      if (local[r * S + S - 1]) {
        out.targets.push_back(M == 1 && R == 1 ? t.clone() : t.slice(first, count));
        out.shares.push_back(double(count) / double(n));
      }
      counts.push_back(count);
    }
  }
  const auto t0 = rt_.trace().now();
  for (auto& m : msgs) m.t0_ns = t0;
  auto reports = run_stages(msgs, local);
  const auto t1 = rt_.trace().now();
  const double wall = double(t1 - t0) * 1e-9;
  if (options_.link) exchange(reports, local);
  layers::step_result result;
  result.samples = n;
  for (std::uint32_t r = 0; r < R; ++r) {
    const auto& last = reports[r * S + S - 1];
    for (std::uint32_t m = 0; m < M; ++m) {
      const double share = double(counts[r * M + m]) / double(n);
      result.loss += share * last.losses[m];  // the direct executor's expression, so the same rounding
      result.correct += last.correct[m];
    }
  }
  last_step_.assign(S, {});
  for (std::uint32_t s = 0; s < S; ++s) {
    auto& r = reports[s];  // replica 0
    auto& x = metrics_[s];
    const double busy = double(r.busy_ns) * 1e-9, waited = double(r.input_wait_ns) * 1e-9,
                 bp = double(r.backpressure_ns) * 1e-9;
    x.busy_s += busy;
    x.idle_s += std::max(0.0, wall - busy);
    x.idle_input_s += waited;
    x.idle_backpressure_s += bp;
    x.idle_optimizer_s += std::max(0.0, wall - busy - waited - bp);
    x.wall_s += wall;
    ++x.steps;
    x.actions += std::int64_t(r.actions.size());
    x.peak_stashed = std::max(x.peak_stashed, r.peak_stashed);
    x.peak_stash_bytes = std::max(x.peak_stash_bytes, r.peak_bytes);
    x.optimizer_s += double(r.optimizer_ns) * 1e-9;
    for (const auto& done : r.actions) {
      const double d = done.end - done.start;
      switch (done.a.op) {
        case op::F: x.f_s += d, ++x.f_count; break;
        case op::B: x.b_s += d, ++x.b_count; break;
        case op::W: x.w_s += d, ++x.w_count; break;
      }
    }
    last_step_[s] = std::move(r.actions);
  }
  auto& rec = rt_.trace();
  if (rec.enabled()) {
    for (std::size_t i = 0; i < reports.size(); ++i) {
      if (!local[i]) continue;  // another rank records its own
      // The wait before the first action and after the optimizer: the step barrier.
      const auto track = stage_track(std::uint32_t(i));
      if (reports[i].begin_ns > t0) rec.span(track, "idle", "idle", t0, reports[i].begin_ns, -1, "optimizer", int(i % S));
      if (t1 > reports[i].end_ns) rec.span(track, "idle", "idle", reports[i].end_ns, t1, -1, "optimizer", int(i % S));
    }
    rec.span(0, "step", "step", t0, t1, -1, nullptr, -1, -1, std::int64_t(step));
  }
  return result;
}

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

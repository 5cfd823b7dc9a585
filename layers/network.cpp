#include "layers/network.hpp"

#include <algorithm>
#include <deque>
#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <future>
#include <optional>
#include <stdexcept>

#include "bus/all_reduce.hpp"
#include "layers/memory.hpp"
#include "layers/pipeline/stage_gate.hpp"

namespace nerve::layers {

using coordinator = pipeline::stage_gate;

network::network(actors::runtime& rt, graph& g, std::shared_ptr<const loss> criterion, optimizer_factory make_optimizer,
                 network_options opt)
    : rt_(rt), graph_(g), failure_at_start_(rt.error()), stall_timeout_s_(opt.stall_timeout_s) {
  if (!criterion) throw std::invalid_argument("network: no loss given");
  backend_ = opt.backend ? std::move(opt.backend) : make_cpu_backend(std::move(make_optimizer));
  backend_->check_loss(*criterion);
  if (backend_->on_device() && (opt.spread || !opt.loops.empty()))
    throw std::invalid_argument("network: the " + std::string(backend_->name()) +
                                " backend's actors share its stream, hence one loop (no spread or loops)");
  keep_freed_memory();  // steps reuse the pages of the previous step (layers/memory.hpp)
  auto& nodes = g.nodes();
  const auto loops = rt.loop_count();
  if (!opt.loops.empty() && opt.loops.size() != nodes.size())
    throw std::invalid_argument("network: " + std::to_string(opt.loops.size()) + " loops given for " +
                                std::to_string(nodes.size()) + " nodes");
  auto check_loop = [&](unsigned l) {
    if (l >= loops)
      throw std::invalid_argument("network: loop " + std::to_string(l) + " but the runtime has " + std::to_string(loops));
    return l;
  };

  // The one step coordinator, without admission: it feeds the inputs, owns the loss and
  // answers each step once every layer reported it done (layers/pipeline/stage_gate.hpp).
  std::size_t layer_nodes = 0;
  for (auto& n : nodes) layer_nodes += n.layer ? 1 : 0;
  coordinator::config cc;
  cc.criterion = std::move(criterion);
  cc.policy = pipeline::admission::none;
  cc.loss_backend = backend_;
  cc.steps_in_flight = backend_->steps_in_flight();
  cc.layer_count = layer_nodes;
  cc.name = "coordinator";
  coordinator_failed_ = cc.failed = std::make_shared<pipeline::own_failure>();
  coordinator_ = rt.spawn_on<coordinator>(0, std::move(cc));
  auto& coord = *static_cast<coordinator*>(coordinator_.get());

  // One actor per layer node.
  plan_ = make_plan(g);
  node_actors_.resize(nodes.size());
  unsigned next = 0;
  for (std::size_t i : g.order()) {
    auto& n = nodes[i];
    if (!n.layer) continue;
    const unsigned loop = !opt.loops.empty() ? opt.loops[i] : opt.spread ? next++ % loops : 0;
    node_actors_[i] = rt.spawn_on<layer_actor>(check_loop(loop), n, static_cast<std::uint32_t>(i), plan_.nodes[i],
                                                backend_->kernels_for(n));
  }
  auto actor_at = [&](std::size_t i) -> layer_actor& { return *static_cast<layer_actor*>(node_actors_[i].get()); };
  // Tied weights: the owner (rank 0) and its copy (rank 1) sum their gradients before each
  // update, as replicas do (where they are: on the device, or on the host).
  for (const auto& t : g.ties()) {
    bus::group members(nodes[t.owner].name + " tied to " + nodes[t.copy].name);
    members.add(node_actors_[t.owner]);
    members.add(node_actors_[t.copy]);
    const actors::spawn_options so{.loop = node_actors_[t.owner].loop()};
    const auto name = "all-reduce " + nodes[t.owner].name;
    auto reducer = backend_->spawn_reducer(rt, so, name, members, {backend_.get(), backend_.get()});
    if (!reducer) reducer = rt.spawn_with<bus::all_reduce>(so, name, std::move(members));
    reducers_.push_back(reducer);
    actor_at(t.owner).gate({.reducer = reducer, .rank = 0});
    actor_at(t.copy).gate({.reducer = reducer, .rank = 1});
  }

  // Edges are bus signals: each edge subscribes its consumer to the producer's output on
  // the consumer's input port, and the producer to the consumer's input gradient on the
  // edge's index among the producer's edges. Every graph input is the coordinator's input
  // signal (each gets the batch), and the output feeds its loss.
  std::int32_t next_edge = 0;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const auto& np = plan_.nodes[i];
    if (nodes[i].is_input()) {
      for (auto& e : np.edges) coord.input().subscribe(node_actors_[e.consumer], e.port);
      continue;
    }
    auto& a = actor_at(i);
    std::vector<std::int32_t> edge_ids;
    for (std::uint32_t k = 0; k < np.edges.size(); ++k) {
      const auto& e = np.edges[k];
      a.output().subscribe(node_actors_[e.consumer], e.port);
      actor_at(e.consumer).input_gradient(e.port).subscribe(node_actors_[i], k);
      edge_ids.push_back(next_edge++);
    }
    if (np.feeds_loss) {
      a.output().subscribe(coordinator_, 0);
      coord.loss_gradient().subscribe(node_actors_[i], static_cast<std::uint32_t>(np.edges.size()));
      edge_ids.push_back(next_edge++);
    }
    a.wire(coordinator_, std::move(edge_ids));
  }
  coord.wire({}, layer_actors());
  for (std::size_t i = 0; i < nodes.size(); ++i)
    if (node_actors_[i]) rt.annotate(node_actors_[i].id(), -1, "network");
}

network::~network() {
  for (auto& a : node_actors_)
    if (a) rt_.stop(a);
  for (auto& a : reducers_) rt_.stop(a);
  rt_.stop(coordinator_);
}

namespace {

using pipeline::detail::run_msg;
using pipeline::detail::run_outcome;

/// The `part` of the coordinator's answer to `r`; a future that already holds `dead` if set.
template <class T>
std::future<T> ask_coordinator(actors::runtime& rt, const actors::address& coordinator, std::exception_ptr dead,
                               run_msg r, T run_outcome::*part,
                               std::function<void(std::future<run_outcome>&)> watch = {}) {
  if (dead) {
    std::promise<T> p;
    p.set_exception(std::move(dead));
    return p.get_future();
  }
  auto f = rt.ask<run_outcome>(coordinator, std::move(r), std::chrono::nanoseconds::max());
  return std::async(std::launch::deferred, [f = std::move(f), part, watch = std::move(watch)]() mutable {
    if (watch) watch(f);
    return std::move(f.get().*part);
  });
}

}  // namespace

std::exception_ptr network::stopped_error() const {
  // A failure stops every actor of the runtime (runtime::report_failure), so a failure
  // that came after this network was built killed it, even if the stop has not reached
  // the coordinator yet. Without one, a stopped coordinator means the runtime shut down.
  if (stalled_)
    return std::make_exception_ptr(
        std::runtime_error("network: a step stalled (see its stall_error); the network is stopped and must be rebuilt"));
  auto failure = rt_.error();
  if (failure == failure_at_start_) failure = nullptr;
  // A coordinator that failed itself stops before the runtime hears of it.
  if (!failure) failure = coordinator_failed_->get();
  if (!failure && !coordinator_.stopped()) return nullptr;
  auto error = [](const std::string& why) {
    return std::runtime_error("network: the network stopped because " + why +
                              "; it cannot run again and must be rebuilt (a new runtime and a new network)");
  };
  if (!failure) return std::make_exception_ptr(error("the runtime was shut down"));
  // Called inside a handler of `failure`: the error nests it.
  auto nested = [](const std::runtime_error& e) {
    try {
      std::throw_with_nested(e);
    } catch (...) {
      return std::current_exception();
    }
  };
  try {
    std::rethrow_exception(failure);
  } catch (const std::exception& e) {
    return nested(error(std::string("of the first failure: ") + e.what()));
  } catch (...) {
    return nested(error("of the first failure (a non-standard exception)"));
  }
}

template <class F>
void network::watch_step(F& f, std::uint64_t k) {
  using clock = std::chrono::steady_clock;
  const auto timeout = std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(stall_timeout_s_));
  // A look every eighth of the timeout: a stall is told between 1 and 1⅛ timeouts after the
  // last message, and a step that moves costs nothing but its own wait.
  const auto look = std::max<clock::duration>(timeout / 8, std::chrono::milliseconds(1));
  const auto moved = [&] {
    std::uint64_t n = 0;
    for (auto& a : node_actors_)
      if (a) n += static_cast<const layer_actor*>(a.get())->handled();
    return n;
  };
  auto seen = moved();
  auto since = clock::now();
  while (f.wait_for(look) == std::future_status::timeout) {
    const auto n = moved();
    const auto t = clock::now();
    if (n != seen) {
      seen = n;
      since = t;
      continue;
    }
    if (t - since < timeout) continue;
    char secs[32];
    std::snprintf(secs, sizeof secs, "%g", stall_timeout_s_);
    std::string waiting;
    for (auto& a : node_actors_) {
      if (!a) continue;
      const auto* la = static_cast<const layer_actor*>(a.get());
      if (la->steps_done() < k) waiting += (waiting.empty() ? "" : ", ") + la->name();
    }
    // Stopped where they can hear it; a layer whose loop is blocked hears it once it is free.
    stalled_ = true;
    for (auto& a : node_actors_)
      if (a) rt_.stop(a);
    rt_.stop(coordinator_);
    throw stall_error("network stalled: no layer handled a message for " + std::string(secs) +
                      " s (--stall-timeout) while training step " + std::to_string(k) +
                      " was in flight; layers that have not finished it: " + (waiting.empty() ? "none" : waiting));
  }
}

std::future<step_result> network::train_step(tensor input, targets t, std::size_t micro_batches, std::uint64_t step,
                                             double lr) {
  std::function<void(std::future<run_outcome>&)> watch;
  const auto k = ++trains_;
  if (stall_timeout_s_ > 0) watch = [this, k](std::future<run_outcome>& f) { watch_step(f, k); };
  return ask_coordinator(rt_, coordinator_, stopped_error(),
                         run_msg{std::move(input), std::move(t), micro_batches, step, true, false, lr}, &run_outcome::result, std::move(watch));
}

std::future<step_result> network::evaluate(tensor input, targets t) {
  return ask_coordinator(rt_, coordinator_, stopped_error(),
                         run_msg{std::move(input), std::move(t), 1, 0, false, false}, &run_outcome::result);
}

std::future<tensor> network::predict(tensor input) {
  return ask_coordinator(rt_, coordinator_, stopped_error(), run_msg{std::move(input), {}, 1, 0, false, true}, &run_outcome::output);
}

actors::address network::actor_of(std::string_view name) const { return node_actors_.at(graph_.index_of(name)); }

bus_traffic network::traffic() const {
  bus_traffic t;
  auto& coord = *static_cast<coordinator*>(coordinator_.get());
  t.feed += coord.input().deliveries();
  for (std::size_t i = 0; i < node_actors_.size(); ++i) {
    if (!node_actors_[i]) continue;
    auto& la = *static_cast<layer_actor*>(node_actors_[i].get());
    t.forward += la.output().deliveries();
    for (std::size_t k = 0; k < graph_.nodes()[i].inputs.size(); ++k) t.backward += la.input_gradient(k).deliveries();
  }
  t.backward += coord.loss_gradient().deliveries();
  return t;
}

optimizer_state ask_optimizer_state(actors::runtime& rt, const graph& g, const std::vector<actors::address>& by_node) {
  optimizer_state all;
  for (std::size_t i = 0; i < by_node.size(); ++i) {
    if (!by_node[i] || g.is_tied_copy(i)) continue;  // a tied copy's state is its owner's
    const auto prefix = g.nodes()[i].name + ".";
    auto st = rt.ask<optimizer_state>(by_node[i], get_optimizer_state{}, std::chrono::nanoseconds::max()).get();
    for (auto& b : st.buffers) all.buffers.push_back({prefix + b.parameter, std::move(b.name), std::move(b.values)});
    for (auto& [k, v] : st.counters) all.counters[prefix + k] = v;
  }
  return all;
}

std::size_t owner_of(const graph& g, const std::vector<actors::address>& by_node, const std::string& name) {
  const auto& nodes = g.nodes();
  for (std::size_t i = 0; i < nodes.size() && i < by_node.size(); ++i) {
    const auto& n = nodes[i].name;
    if (by_node[i] && name.size() > n.size() && name.compare(0, n.size(), n) == 0 && name[n.size()] == '.') return i;
  }
  return nodes.size();
}

optimizer_state network::optimizer_state_of() const { return ask_optimizer_state(rt_, graph_, node_actors_); }

void network::load_optimizer_state(const optimizer_state& state) {
  std::vector<optimizer_state> parts(node_actors_.size());
  auto owner = [&](const std::string& name) {
    const auto i = owner_of(graph_, node_actors_, name);
    if (i == graph_.nodes().size())
      throw std::invalid_argument("optimizer state: '" + name + "' belongs to no layer of the network");
    return std::pair{i, name.substr(graph_.nodes()[i].name.size() + 1)};
  };
  for (const auto& b : state.buffers) {
    auto [i, local] = owner(b.parameter);
    parts[i].buffers.push_back({local, b.name, b.values});
  }
  for (const auto& [k, v] : state.counters) {
    auto [i, local] = owner(k);
    parts[i].counters[local] = v;
  }
  for (const auto& t : graph_.ties()) parts[t.copy] = parts[t.owner];  // it made the owner's updates
  std::vector<std::future<bool>> done;
  for (std::size_t i = 0; i < node_actors_.size(); ++i)
    if (node_actors_[i])
      done.push_back(rt_.ask<bool>(node_actors_[i], set_optimizer_state{std::move(parts[i])}, std::chrono::nanoseconds::max()));
  for (auto& f : done) f.get();
}

std::vector<actors::address> network::layer_actors() const {
  std::vector<actors::address> out;
  for (auto& a : node_actors_)
    if (a) out.push_back(a);
  return out;
}

}  // namespace nerve::layers

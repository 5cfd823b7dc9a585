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

#include "layers/memory.hpp"

namespace nerve::layers {

namespace {

/// A batch to run (train or evaluate), sent to the coordinator as a request.
struct step_request {
  static constexpr std::string_view kind = "step";
  tensor input;
  targets t;
  std::size_t micro_batches = 1;
  std::uint64_t step = 0;
  bool train = true;
  bool want_output = false;
  double lr = -1;
};

/// What the coordinator answers.
struct step_outcome {
  step_result result;
  tensor output;
};

/// Computes the loss of each micro-batch when both its output and its targets are in (on
/// the backend), and sends the gradient back into the network's output node.
class loss_actor : public actors::actor {
 public:
  loss_actor(std::shared_ptr<const loss> criterion, std::shared_ptr<backend> be)
      : actor("loss"), criterion_(std::move(criterion)), backend_(std::move(be)) {
    on<backend_done>([](backend_done& d) { handle_backend_done(d); });
    on<forward_msg>([this](forward_msg& m) {
      const key k{m.step, m.micro_batch};
      pending_[k].output = std::move(m.x);
      try_finish(k);
    });
    on<targets_msg>([this](targets_msg& m) {
      const key k{m.step, m.micro_batch};
      pending_[k].target = std::move(m);
      try_finish(k);
    });
  }
  /// The gradient of the network's output, back along the output's edge into the loss.
  bus::signal<backward_msg>& gradient() noexcept { return grad_; }
  void wire(actors::address coordinator) { coordinator_ = std::move(coordinator); }

 private:
  struct slot {
    std::optional<value> output;
    std::optional<targets_msg> target;
  };
  using key = std::pair<std::uint64_t, std::int64_t>;  // (step, micro-batch): steps may overlap
  void try_finish(key k) {
    const auto mb = k.second;
    auto it = pending_.find(k);
    if (!it->second.output || !it->second.target) return;
    auto s = std::move(it->second);
    pending_.erase(it);
    const auto& tm = *s.target;
    backend_->loss(
        *this, *criterion_, std::move(*s.output), tm.t, tm.first, tm.step, tm.share, tm.train, tm.want_output,
        [&](value g) { grad_.emit(backward_msg{mb, tm.step, 0, std::move(g)}); },
        [this, mb, step = tm.step, share = tm.share, rows = tm.t.size()](loss_figures& f) {
          send(coordinator_, loss_report{mb, step, f.loss, share, f.correct, rows, std::move(f.output)});
        });
  }

  std::shared_ptr<const loss> criterion_;
  std::shared_ptr<backend> backend_;
  bus::signal<backward_msg> grad_{*this, "grad"};
  actors::address coordinator_;
  std::map<key, slot> pending_;
};

/// Splits batches into micro-batches, feeds the network, and answers when a step is done.
/// Training steps overlap up to the backend's `steps_in_flight` (a layer runs the next
/// step's forwards once it issued its update); any other request runs alone. Answers go
/// out in request order.
class coordinator_actor : public actors::actor {
 public:
  coordinator_actor(std::size_t layer_nodes, std::shared_ptr<backend> be)
      : actor("coordinator"), layer_nodes_(layer_nodes), depth_(std::max<std::size_t>(1, be->steps_in_flight())),
        backend_(std::move(be)) {
    on<step_request>([this](step_request& r) {
      queue_.push_back({std::move(r), defer_reply<step_outcome>()});
      start_more();
    });
    on<loss_report>([this](loss_report& r) {
      auto& j = running(r.step);
      j.result.loss += r.share * r.loss;
      j.result.correct += r.correct;
      j.output = std::move(r.output);  // empty unless asked for
      ++j.reports;
      finish_done();
    });
    on<node_done>([this](node_done& d) {
      ++running(d.step).nodes_done;
      finish_done();
    });
  }
  /// Stopped (the run failed, or the network is going away): whoever waits hears of it.
  void on_stop() override {
    auto err = system().error();
    if (!err) err = std::make_exception_ptr(std::runtime_error("network stopped before the step finished"));
    for (auto& j : queue_) j.reply.fail(err);
    queue_.clear();
    running_ = 0;
  }
  /// One signal per graph input: the batch's micro-batches go out on them.
  void add_input(const std::string& name) { inputs_.push_back(std::make_unique<bus::signal<forward_msg>>(*this, name)); }
  bus::signal<forward_msg>& input(std::size_t k) { return *inputs_.at(k); }
  std::size_t input_count() const noexcept { return inputs_.size(); }
  void wire(actors::address loss) { loss_ = std::move(loss); }

 private:
  struct job {
    step_request req;
    actors::deferred_reply<step_outcome> reply;
    step_result result{};
    std::int64_t start_ns = -1;  // recorder time the step began (-1: not recording)
    std::size_t reports = 0, nodes_done = 0;
    tensor output{};  // `predict`'s, which runs one micro-batch
  };

  job& running(std::uint64_t step) {
    for (std::size_t k = 0; k < running_; ++k)
      if (queue_[k].req.step == step) return queue_[k];
    throw std::logic_error("network: a report of step " + std::to_string(step) + ", which is not running");
  }

  /// Starts the queued requests that may run beside the ones running.
  void start_more() {
    while (running_ < queue_.size()) {
      const auto& r = queue_[running_].req;
      if (running_ > 0) {
        if (running_ >= depth_ || !r.train) return;
        for (std::size_t k = 0; k < running_; ++k)
          if (!queue_[k].req.train || queue_[k].req.step == r.step) return;
      }
      if (start(queue_[running_])) ++running_;
      else queue_.erase(queue_.begin() + std::ptrdiff_t(running_));
    }
  }

  bool start(job& j) {
    auto& r = j.req;
    const std::int64_t n = r.input.batch();
    std::vector<micro_batch_rows> split;
    try {
      split = split_micro_batches(n, r.micro_batches);
    } catch (const std::invalid_argument& e) {
      j.reply.fail(std::make_exception_ptr(std::invalid_argument(std::string("network: ") + e.what())));
      return false;
    }
    const auto m = static_cast<std::int64_t>(split.size());
    j.result.samples = n;
    j.start_ns = system().trace().enabled() ? system().trace().now() : -1;
    for (std::int64_t k = 0; k < m; ++k) {
      const auto [first, count] = split[static_cast<std::size_t>(k)];
      targets_msg tm{k, r.step, r.train, r.want_output, double(count) / double(n), first,
                     m == 1 ? std::move(r.t) : r.t.slice(first, count)};
      send(loss_, std::move(tm));
      value x = backend_->feed(r.input, first, count, r.step);
      for (std::size_t e = 0; e < inputs_.size(); ++e) {
        forward_msg f{k, r.step, 0, static_cast<std::uint32_t>(m), r.train, r.lr,
                      e + 1 == inputs_.size() ? std::move(x) : x.clone()};
        inputs_[e]->emit(std::move(f));
      }
    }
    return true;
  }

  bool done(const job& j) const {
    return j.reports >= j.req.micro_batches && (!j.req.train || j.nodes_done >= layer_nodes_);
  }

  /// Answers the finished steps at the front, in order, and starts what may follow.
  void finish_done() {
    while (running_ > 0 && done(queue_.front())) {
      auto j = std::move(queue_.front());
      queue_.pop_front();
      --running_;
      step_outcome out{j.result, std::move(j.output)};
      if (j.req.train && j.start_ns >= 0) {  // the step's slice on track 0 (docs/trace-format.md)
        auto& rec = system().trace();
        rec.span(0, "step", "step", j.start_ns, rec.now(), -1, nullptr, -1, -1, static_cast<std::int64_t>(j.req.step));
      }
      j.reply.deliver(std::move(out));
    }
    start_more();
  }

  std::size_t layer_nodes_;
  std::size_t depth_;
  std::shared_ptr<backend> backend_;
  std::vector<std::unique_ptr<bus::signal<forward_msg>>> inputs_;
  actors::address loss_;
  std::deque<job> queue_;  // the first running_ are running
  std::size_t running_ = 0;
};

}  // namespace

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

  std::size_t layer_nodes = 0;
  for (auto& n : nodes) layer_nodes += n.layer ? 1 : 0;
  coordinator_ = rt.spawn_on<coordinator_actor>(0, layer_nodes, backend_);
  auto& coord = *static_cast<coordinator_actor*>(coordinator_.get());

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
  loss_ = rt.spawn_on<loss_actor>(0, std::move(criterion), backend_);
  auto& loss_a = *static_cast<loss_actor*>(loss_.get());
  auto actor_at = [&](std::size_t i) -> layer_actor& { return *static_cast<layer_actor*>(node_actors_[i].get()); };

  // Edges are bus signals: each edge subscribes its consumer to the producer's output on
  // the consumer's input port, and the producer to the consumer's input gradient on the
  // edge's index among the producer's edges. Graph inputs are the coordinator's signals.
  for (std::size_t i = 0; i < nodes.size(); ++i)
    if (nodes[i].is_input()) coord.add_input(nodes[i].name);
  std::int32_t next_edge = 0;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const auto& np = plan_.nodes[i];
    if (nodes[i].is_input()) {
      auto& sig = coord.input(static_cast<std::size_t>(
          std::find(g.inputs().begin(), g.inputs().end(), i) - g.inputs().begin()));
      for (auto& e : np.edges) sig.subscribe(node_actors_[e.consumer], e.port);
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
      a.output().subscribe(loss_, 0);
      loss_a.gradient().subscribe(node_actors_[i], static_cast<std::uint32_t>(np.edges.size()));
      edge_ids.push_back(next_edge++);
    }
    a.wire(coordinator_, std::move(edge_ids));
  }
  coord.wire(loss_);
  loss_a.wire(coordinator_);
  for (std::size_t i = 0; i < nodes.size(); ++i)
    if (node_actors_[i]) rt.annotate(node_actors_[i].id(), -1, "network");
}

network::~network() {
  for (auto& a : node_actors_)
    if (a) rt_.stop(a);
  rt_.stop(coordinator_);
  rt_.stop(loss_);
}

namespace {

/// The `part` of the coordinator's answer to `r`; a future that already holds `dead` if set.
template <class T>
std::future<T> ask_coordinator(actors::runtime& rt, const actors::address& coordinator, std::exception_ptr dead,
                               step_request r, T step_outcome::*part,
                               std::function<void(std::future<step_outcome>&)> watch = {}) {
  if (dead) {
    std::promise<T> p;
    p.set_exception(std::move(dead));
    return p.get_future();
  }
  auto f = rt.ask<step_outcome>(coordinator, std::move(r), std::chrono::nanoseconds::max());
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
    rt_.stop(loss_);
    rt_.stop(coordinator_);
    throw stall_error("network stalled: no layer handled a message for " + std::string(secs) +
                      " s (--stall-timeout) while training step " + std::to_string(k) +
                      " was in flight; layers that have not finished it: " + (waiting.empty() ? "none" : waiting));
  }
}

std::future<step_result> network::train_step(tensor input, targets t, std::size_t micro_batches, std::uint64_t step,
                                             double lr) {
  std::function<void(std::future<step_outcome>&)> watch;
  const auto k = ++trains_;
  if (stall_timeout_s_ > 0) watch = [this, k](std::future<step_outcome>& f) { watch_step(f, k); };
  return ask_coordinator(rt_, coordinator_, stopped_error(),
                         step_request{std::move(input), std::move(t), micro_batches, step, true, false, lr},
                         &step_outcome::result, std::move(watch));
}

std::future<step_result> network::evaluate(tensor input, targets t) {
  return ask_coordinator(rt_, coordinator_, stopped_error(),
                         step_request{std::move(input), std::move(t), 1, 0, false, false}, &step_outcome::result);
}

std::future<tensor> network::predict(tensor input) {
  return ask_coordinator(rt_, coordinator_, stopped_error(), step_request{std::move(input), {}, 1, 0, false, true},
                         &step_outcome::output);
}

actors::address network::actor_of(std::string_view name) const { return node_actors_.at(graph_.index_of(name)); }

bus_traffic network::traffic() const {
  bus_traffic t;
  auto& coord = *static_cast<coordinator_actor*>(coordinator_.get());
  for (std::size_t k = 0; k < coord.input_count(); ++k) t.feed += coord.input(k).deliveries();
  for (std::size_t i = 0; i < node_actors_.size(); ++i) {
    if (!node_actors_[i]) continue;
    auto& la = *static_cast<layer_actor*>(node_actors_[i].get());
    t.forward += la.output().deliveries();
    for (std::size_t k = 0; k < graph_.nodes()[i].inputs.size(); ++k) t.backward += la.input_gradient(k).deliveries();
  }
  t.backward += static_cast<loss_actor*>(loss_.get())->gradient().deliveries();
  return t;
}

optimizer_state ask_optimizer_state(actors::runtime& rt, const graph& g, const std::vector<actors::address>& by_node) {
  optimizer_state all;
  for (std::size_t i = 0; i < by_node.size(); ++i) {
    if (!by_node[i]) continue;
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

#include "layers/network.hpp"

#include <deque>
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

/// Computes the loss of each micro-batch when both its output and its targets are in, and
/// sends the gradient back into the network's output node.
class loss_actor : public actors::actor {
 public:
  loss_actor(std::shared_ptr<const loss> criterion, std::uint32_t out_edge)
      : actor("loss"), criterion_(std::move(criterion)), out_edge_(out_edge) {
    on<forward_msg>([this](forward_msg& m) {
      auto& s = pending_[m.micro_batch];
      s.output = std::move(m.x);
      s.have_output = true;
      try_finish(m.micro_batch);
    });
    on<targets_msg>([this](targets_msg& m) {
      auto& s = pending_[m.micro_batch];
      s.target = std::move(m);
      s.have_target = true;
      try_finish(m.micro_batch);
    });
  }
  void wire(actors::address output_node, actors::address coordinator) {
    output_node_ = std::move(output_node);
    coordinator_ = std::move(coordinator);
  }

 private:
  struct slot {
    tensor output;
    targets_msg target;
    bool have_output = false, have_target = false;
  };
  void try_finish(std::int64_t mb) {
    auto it = pending_.find(mb);
    if (!it->second.have_output || !it->second.have_target) return;
    auto s = std::move(it->second);
    pending_.erase(it);
    loss_report rep{mb, s.target.step, 0, s.target.share, 0, s.output.batch(), {}};
    if (!s.target.t.labels.empty() || !s.target.t.values.empty()) {
      auto r = criterion_->forward(s.output, s.target.t);
      rep.loss = r.loss;
      rep.correct = r.correct;
      if (s.target.train)
        send(output_node_, backward_msg{mb, s.target.step, out_edge_, criterion_->backward(r.stash, float(s.target.share))});
    }
    if (s.target.want_output) rep.output = std::move(s.output);
    send(coordinator_, std::move(rep));
  }

  std::shared_ptr<const loss> criterion_;
  std::uint32_t out_edge_;
  actors::address output_node_, coordinator_;
  std::map<std::int64_t, slot> pending_;
};

/// Splits batches into micro-batches, feeds the network, and answers when a step is done.
class coordinator_actor : public actors::actor {
 public:
  coordinator_actor(std::size_t layer_nodes) : actor("coordinator"), layer_nodes_(layer_nodes) {
    on<step_request>([this](step_request& r) {
      queue_.push_back({std::move(r), defer_reply<step_outcome>()});
      if (queue_.size() == 1) start_front();
    });
    on<loss_report>([this](loss_report& r) {
      auto& cur = queue_.front();
      result_.loss += r.share * r.loss;
      result_.correct += r.correct;
      if (cur.req.want_output) outputs_[r.micro_batch] = std::move(r.output);
      ++reports_;
      maybe_finish();
    });
    on<node_done>([this](node_done&) {
      ++nodes_done_;
      maybe_finish();
    });
  }
  struct input_edge {
    actors::address to;
    std::uint32_t port;
  };
  /// Stopped (the run failed, or the network is going away): whoever waits hears of it.
  void on_stop() override {
    auto err = system().error();
    if (!err) err = std::make_exception_ptr(std::runtime_error("network stopped before the step finished"));
    for (auto& j : queue_) j.reply.fail(err);
    queue_.clear();
  }
  void wire(std::vector<input_edge> inputs, actors::address loss) {
    inputs_ = std::move(inputs);
    loss_ = std::move(loss);
  }

 private:
  struct job {
    step_request req;
    actors::deferred_reply<step_outcome> reply;
  };

  void start_front() {
    auto& r = queue_.front().req;
    const std::int64_t n = r.input.batch();
    const auto m = static_cast<std::int64_t>(r.micro_batches);
    if (m <= 0 || m > n) {
      auto j = std::move(queue_.front());
      queue_.pop_front();
      j.reply.fail(std::make_exception_ptr(std::invalid_argument(
          "network: cannot split a batch of " + std::to_string(n) + " into " + std::to_string(m) + " micro-batches")));
      if (!queue_.empty()) start_front();
      return;
    }
    result_ = step_result{};
    result_.samples = n;
    step_start_ns_ = system().trace().enabled() ? system().trace().now() : -1;
    reports_ = 0;
    nodes_done_ = 0;
    outputs_.clear();
    std::int64_t first = 0;
    for (std::int64_t k = 0; k < m; ++k) {
      // The direct executor's split: sizes differ by at most one, the larger ones first.
      const std::int64_t count = n / m + (k < n % m);
      targets_msg tm{k, r.step, r.train, r.want_output, double(count) / double(n),
                     m == 1 ? std::move(r.t) : r.t.slice(first, count)};
      send(loss_, std::move(tm));
      tensor x = m == 1 ? std::move(r.input) : r.input.slice(first, count);
      for (std::size_t e = 0; e < inputs_.size(); ++e) {
        forward_msg f{k, r.step, inputs_[e].port, static_cast<std::uint32_t>(m), r.train, r.lr,
                      e + 1 == inputs_.size() ? std::move(x) : x.clone()};
        send(inputs_[e].to, std::move(f));
      }
      first += count;
    }
  }

  void maybe_finish() {
    auto& cur = queue_.front();
    if (reports_ < cur.req.micro_batches) return;
    if (cur.req.train && nodes_done_ < layer_nodes_) return;
    step_outcome out{result_, {}};
    if (cur.req.train && step_start_ns_ >= 0) {  // the step's slice on track 0 (docs/trace-format.md)
      auto& rec = system().trace();
      rec.span(0, "step", "step", step_start_ns_, rec.now(), -1, nullptr, -1, -1,
               static_cast<std::int64_t>(cur.req.step));
    }
    if (cur.req.want_output) {
      if (outputs_.size() == 1) {
        out.output = std::move(outputs_.begin()->second);
      } else {  // stitch the micro-batches back together, in order
        std::int64_t rows = 0;
        for (auto& [k, t] : outputs_) rows += t.batch();
        out.output = tensor(rows, outputs_.begin()->second.sample_shape());
        std::int64_t at = 0;
        for (auto& [k, t] : outputs_) {
          out.output.matrix().middleRows(at, t.batch()) = t.matrix();
          at += t.batch();
        }
      }
    }
    auto j = std::move(queue_.front());
    queue_.pop_front();
    j.reply.deliver(std::move(out));
    if (!queue_.empty()) start_front();
  }

  std::size_t layer_nodes_;
  std::vector<input_edge> inputs_;
  actors::address loss_;
  std::deque<job> queue_;
  step_result result_;
  std::int64_t step_start_ns_ = -1;  // recorder time the current step began (-1: not recording)
  std::size_t reports_ = 0, nodes_done_ = 0;
  std::map<std::int64_t, tensor> outputs_;
};

}  // namespace

network::network(actors::runtime& rt, graph& g, std::shared_ptr<const loss> criterion, optimizer_factory make_optimizer,
                 network_options opt)
    : rt_(rt), graph_(g) {
  if (!criterion) throw std::invalid_argument("network: no loss given");
  if (!make_optimizer) throw std::invalid_argument("network: no optimizer factory given");
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
  const unsigned control = check_loop(opt.control_loop >= 0 ? unsigned(opt.control_loop) : opt.first_loop);

  std::size_t layer_nodes = 0;
  for (auto& n : nodes) layer_nodes += n.layer ? 1 : 0;
  coordinator_ = rt.spawn_on<coordinator_actor>(control, layer_nodes);

  // Spawn one actor per layer node.
  node_actors_.resize(nodes.size());
  unsigned next = opt.first_loop;
  for (std::size_t i : g.order()) {
    auto& n = nodes[i];
    if (!n.layer) continue;
    unsigned loop = opt.first_loop;
    if (!opt.loops.empty()) loop = opt.loops[i];
    else if (opt.spread) loop = next++ % loops;
    node_actors_[i] = rt.spawn_on<layer_actor>(check_loop(loop), n, static_cast<std::uint32_t>(i), make_optimizer());
  }
  // The output node's single consumer edge is the loss.
  const std::size_t out = g.output();
  loss_ = rt.spawn_on<loss_actor>(control, std::move(criterion), static_cast<std::uint32_t>(nodes[out].consumers.size()));

  // Position of each node in the topological order, for the gradient summation order.
  std::vector<std::size_t> topo_pos(nodes.size());
  for (std::size_t k = 0; k < g.order().size(); ++k) topo_pos[g.order()[k]] = k;

  std::vector<coordinator_actor::input_edge> graph_input_edges;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    auto& n = nodes[i];
    // Consumer edges of node i: one per (consumer, input port) that reads it, in the order
    // of `consumers` (a consumer reading it twice appears twice).
    layer_actor::wiring w;
    w.coordinator = coordinator_;
    struct edge {
      std::size_t consumer;
      std::uint32_t port;
    };
    std::vector<edge> edges;
    std::vector<std::size_t> seen;
    for (std::size_t c : n.consumers) {
      if (std::find(seen.begin(), seen.end(), c) != seen.end()) continue;
      seen.push_back(c);
      auto& cn = nodes[c];
      for (std::size_t k = 0; k < cn.inputs.size(); ++k)
        if (cn.inputs[k] == i) edges.push_back({c, static_cast<std::uint32_t>(k)});
    }
    if (!n.layer) {
      for (auto& e : edges) graph_input_edges.push_back({node_actors_[e.consumer], e.port});
      continue;
    }
    for (auto& e : edges) {
      w.consumers.push_back(node_actors_[e.consumer]);
      w.consumer_ports.push_back(e.port);
    }
    if (i == out) {
      w.consumers.push_back(loss_);
      w.consumer_ports.push_back(0);
    }
    // The direct executor visits consumers in reverse topological order and, within one
    // consumer, its inputs in port order; the loss (output node) comes first of all.
    std::vector<std::uint32_t> order(w.consumers.size());
    for (std::uint32_t k = 0; k < order.size(); ++k) order[k] = k;
    auto rank = [&](std::uint32_t k) -> std::pair<long, std::uint32_t> {
      if (k >= edges.size()) return {-1, 0};  // the loss edge
      return {-static_cast<long>(topo_pos[edges[k].consumer]), edges[k].port};
    };
    std::stable_sort(order.begin(), order.end(), [&](auto a, auto b) { return rank(a) < rank(b); });
    w.grad_order = std::move(order);
    // Producers: for input port k, the producer's actor and the index of this edge among
    // the producer's consumer edges.
    for (std::size_t k = 0; k < n.inputs.size(); ++k) {
      std::size_t p = n.inputs[k];
      if (!nodes[p].layer) {
        w.producers.emplace_back();
        w.producer_edges.push_back(0);
        continue;
      }
      // Recompute the producer's edge list the same way to find our index in it.
      std::uint32_t idx = 0, found = 0;
      std::vector<std::size_t> pseen;
      bool done = false;
      for (std::size_t c : nodes[p].consumers) {
        if (done) break;
        if (std::find(pseen.begin(), pseen.end(), c) != pseen.end()) continue;
        pseen.push_back(c);
        for (std::size_t kk = 0; kk < nodes[c].inputs.size(); ++kk) {
          if (nodes[c].inputs[kk] != p) continue;
          if (c == i && kk == k) {
            found = idx;
            done = true;
            break;
          }
          ++idx;
        }
      }
      w.producers.push_back(node_actors_[p]);
      w.producer_edges.push_back(found);
    }
    static_cast<layer_actor*>(node_actors_[i].get())->wire(std::move(w));
  }
  static_cast<coordinator_actor*>(coordinator_.get())->wire(std::move(graph_input_edges), loss_);
  static_cast<loss_actor*>(loss_.get())->wire(node_actors_[out], coordinator_);
  for (std::size_t i = 0; i < nodes.size(); ++i)
    if (node_actors_[i]) rt.annotate(node_actors_[i].id(), -1, "network");
}

network::~network() {
  for (auto& a : node_actors_)
    if (a) rt_.stop(a);
  rt_.stop(coordinator_);
  rt_.stop(loss_);
}

std::future<step_result> network::train_step(tensor input, targets t, std::size_t micro_batches, std::uint64_t step,
                                             double lr) {
  auto f = rt_.ask<step_outcome>(coordinator_,
                                 step_request{std::move(input), std::move(t), micro_batches, step, true, false, lr},
                                 std::chrono::nanoseconds::max());
  return std::async(std::launch::deferred, [f = std::move(f)]() mutable { return f.get().result; });
}

std::future<step_result> network::evaluate(tensor input, targets t) {
  auto f = rt_.ask<step_outcome>(coordinator_, step_request{std::move(input), std::move(t), 1, 0, false, false},
                                 std::chrono::nanoseconds::max());
  return std::async(std::launch::deferred, [f = std::move(f)]() mutable { return f.get().result; });
}

std::future<tensor> network::predict(tensor input) {
  auto f = rt_.ask<step_outcome>(coordinator_, step_request{std::move(input), {}, 1, 0, false, true},
                                 std::chrono::nanoseconds::max());
  return std::async(std::launch::deferred, [f = std::move(f)]() mutable { return std::move(f.get().output); });
}

actors::address network::actor_of(std::string_view name) const { return node_actors_.at(graph_.index_of(name)); }

std::vector<actors::address> network::layer_actors() const {
  std::vector<actors::address> out;
  for (auto& a : node_actors_)
    if (a) out.push_back(a);
  return out;
}

}  // namespace nerve::layers

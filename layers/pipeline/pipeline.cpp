#include "layers/pipeline/pipeline.hpp"

#include <algorithm>
#include <bit>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "bus/all_reduce.hpp"
#include "layers/pipeline/detail/stage_protocol.hpp"
#include "layers/pipeline/piece.hpp"
#include "layers/pipeline/stage_engine.hpp"
#include "layers/pipeline/stage_gate.hpp"

namespace nerve::pipeline {

namespace {

using layers::tensor;

/// Host bytes of a payload (a device payload's bytes stay on the device: 0 here).
std::size_t host_bytes(const stage_payload& p) noexcept {
  std::size_t b = 0;
  for (auto& t : p.host) b += t.payload_bytes();
  return b;
}

/// The tensors of one micro-batch into piece `piece` (forward): host tensors, or
/// device tensors with their ready event between two stages on one device.
struct activation_msg {
  static constexpr std::string_view kind = "activation";
  std::int64_t micro_batch = 0;
  std::uint32_t piece = 0;
  stage_payload x;
  std::size_t payload_bytes() const noexcept { return host_bytes(x); }
};

/// The gradients of one micro-batch into piece `piece` (backward).
struct gradient_msg {
  static constexpr std::string_view kind = "gradient";
  std::int64_t micro_batch = 0;
  std::uint32_t piece = 0;
  stage_payload g;
  std::size_t payload_bytes() const noexcept { return host_bytes(g); }
};

/// To the stage itself, on its loop: a device payload's copy to the host completed
/// (or failed); send it on to `piece`.
struct host_copy_done {
  static constexpr std::string_view kind = "host_copy_done";
  std::int64_t micro_batch = 0;
  std::uint32_t piece = 0;
  bool forward = true;
  std::exception_ptr error;
  std::vector<tensor> x;
};

/// To the stage itself: the device work of its step completed (or failed).
struct engine_done {
  static constexpr std::string_view kind = "engine_done";
  std::exception_ptr error;
};

using detail::abort_msg;
using detail::op_name;
using detail::stage_aborted;
using detail::stage_report;
using detail::step_msg;
using detail::what_of;

constexpr std::uint32_t stage_track_base = 2000000;

}  // namespace

/// Runs one stage: its pieces, its action list (or the emergent policy), its optimizer.
class stage_actor : public actors::actor {
 public:
  struct config {
    std::uint32_t stage = 0;
    std::shared_ptr<const ::nerve::pipeline::schedule> plan;  // shared: a stopping actor may outlive its pipeline
    std::vector<std::unique_ptr<piece_executor>> chunks;  // by chunk
    std::unique_ptr<layers::optimizer> opt;
    std::shared_ptr<const layers::loss> criterion;
    bool emergent = false;
    std::uint32_t credits = 1;
    /// Set: the chunks run on a device through the engine (`chunks` then only give the frontiers).
    std::shared_ptr<stage_engine> engine;
    /// Each stage's engine domain (null: CPU), to tell whether a payload may stay on the device.
    std::vector<const void*> domains;
  };

  explicit stage_actor(config c) : actor("stage " + std::to_string(c.stage)), c_(std::move(c)) {
    S_ = c_.plan->stages;
    P_ = c_.plan->pieces();
    on<step_msg>([this](step_msg& m) { guarded([&] { on_step(m); }); });
    // Checkpoints, between steps: the stage's optimizer over the parameters of its pieces.
    // A device stage's state is the engine's, read off the loops (pipeline::optimizer_state_of).
    on<layers::get_optimizer_state>([this](layers::get_optimizer_state&) {
      if (c_.engine) throw std::logic_error("stage " + std::to_string(c_.stage) + ": ask the device stage's engine");
      layers::optimizer_state st;
      c_.opt->save_state(st);
      return st;
    });
    on<layers::set_optimizer_state>([this](layers::set_optimizer_state& m) {
      if (c_.engine) throw std::logic_error("stage " + std::to_string(c_.stage) + ": load the device stage's engine");
      auto params = parameters();
      layers::optimizer_state mine;  // the buffers of this stage's parameters, and the counters
      for (auto& b : m.state.buffers)
        for (auto& p : params)
          if (p.name == b.parameter) mine.buffers.push_back(b);
      mine.counters = m.state.counters;
      c_.opt->load_state(mine, params);
      return true;
    });
    on<activation_msg>([this](activation_msg& m) {
      guarded([&] {
        acts_[{m.micro_batch, m.piece}] = std::move(m.x);
        advance();
      });
    });
    on<gradient_msg>([this](gradient_msg& m) {
      guarded([&] {
        grads_[{m.micro_batch, m.piece}] = std::move(m.g);
        advance();
      });
    });
    on<host_copy_done>([this](host_copy_done& m) {
      guarded([&] {
        // Moved out first: no copy of the error stays in the message once it is on its way.
        if (m.error) std::rethrow_exception(std::exchange(m.error, nullptr));
        stage_payload p;
        p.host = std::move(m.x);
        send_to_piece(m.piece, m.micro_batch, std::move(p), m.forward);
      });
    });
    on<engine_done>([this](engine_done& m) {
      guarded([&] {
        if (m.error) std::rethrow_exception(std::exchange(m.error, nullptr));
        deliver();
      });
    });
    on<abort_msg>([this](abort_msg& m) {
      if (reply_) {
        // Made in its own statement so the temporary is gone before the caller can see the error.
        auto e = std::make_exception_ptr(
            stage_aborted("stage " + std::to_string(c_.stage) + " stopped: stage " + std::to_string(m.from) + " failed: " + m.what));
        reply_.fail(std::move(e));
      }
      stop();
    });
  }

 protected:
  // The pipeline holds the engine too and lets it go off the loops (its destructor waits
  // for the stream), after this has run.
  void on_stop() override { c_.engine.reset(); }

 private:
  using key = std::pair<std::int64_t, std::uint32_t>;  // (micro-batch, piece)

  template <class F>
  void guarded(F&& f) {
    if (failed_) return;
    std::exception_ptr e;
    try {
      f();
    } catch (...) {
      e = std::current_exception();
    }
    if (!e) return;
    failed_ = true;
    // Every other stage (of every replica) ends its step with an abort and stops; so does this one.
    const std::string what = what_of(e);
    if (stages_)
      for (std::uint32_t s = 0; s < stages_->size(); ++s)
        if (s != replica_ * S_ + c_.stage) (void)try_send((*stages_)[s], abort_msg{c_.stage, what}, actors::lane::urgent);
    // Handed over last, outside the catch block: this thread then holds no reference to the
    // exception, so the caller's is the last one (TSan cannot see libstdc++'s reference counts).
    if (reply_) reply_.fail(std::move(e));
    stop();
  }

  std::int64_t now() { return system().trace().now(); }

  void on_step(step_msg& m) {
    reply_ = defer_reply<stage_report>();
    stages_ = m.stages;
    replica_ = m.replica;
    step_ = m.step;
    t0_ = m.t0_ns;
    inputs_ = std::move(m.inputs);
    targets_ = std::move(m.targets);
    shares_ = std::move(m.shares);
    if (c_.engine) {
      c_.engine->begin_step(m.lr, executor());
    } else {
      if (m.lr >= 0) c_.opt->set_lr(m.lr);
      for (auto& p : c_.chunks) p->zero_grad();
    }
    rep_ = stage_report{};
    rep_.begin_ns = now();
    const std::uint32_t M = c_.plan->micro_batches;
    rep_.losses.assign(M, 0);
    rep_.correct.assign(M, 0);
    cursor_ = 0;
    waiting_ = false;
    next_f_ = 0;
    in_flight_ = 0;
    active_ = true;
    finishing_ = false;
    advance();
  }

  bool have_input(const action& a, std::uint32_t p) const {
    if (a.op == op::F) return p == 0 ? a.micro_batch < inputs_.size() : acts_.count({a.micro_batch, p}) > 0;
    if (a.op == op::B) return grads_.count({a.micro_batch, p}) > 0;
    return true;
  }

  /// The next action the emergent policy allows, if any: a B whose gradient is in
  /// (lowest micro-batch first), else an F whose input is in while credits last.
  std::optional<action> emergent_next(bool& blocked_by_credits) {
    blocked_by_credits = false;
    for (auto& [k, g] : grads_) return action{op::B, std::uint32_t(k.first), 0};
    const std::uint32_t M = c_.plan->micro_batches;
    if (next_f_ < M && have_input(action{op::F, next_f_, 0}, c_.stage)) {
      if (in_flight_ < c_.credits) return action{op::F, next_f_, 0};
      blocked_by_credits = true;
    }
    return std::nullopt;
  }

  void advance() {
    if (!active_) return;  // an activation that came before this stage's step_msg waits in acts_
    const auto& list = c_.plan->actions[c_.stage];
    const std::uint32_t M = c_.plan->micro_batches;
    const std::size_t total = c_.emergent ? std::size_t(M) * 2 : list.size();
    while (cursor_ < total) {
      action a;
      bool credit_block = false;
      if (c_.emergent) {
        auto n = emergent_next(credit_block);
        if (!n) {
          block(credit_block);
          return;
        }
        a = *n;
      } else {
        a = list[cursor_];
        if (!have_input(a, c_.plan->piece(c_.stage, a.chunk))) {
          block(false);
          return;
        }
      }
      unblock();
      run(a);
      ++cursor_;
    }
    finish();
  }

  void block(bool credits) {
    if (waiting_) return;
    waiting_ = true;
    wait_credits_ = credits;
    wait_since_ = now();
  }
  void unblock() {
    if (!waiting_) return;
    waiting_ = false;
    const auto t = now();
    (wait_credits_ ? rep_.backpressure_ns : rep_.input_wait_ns) += t - wait_since_;
    auto& rec = system().trace();
    if (rec.enabled())
      rec.span(stage_track_base + replica_ * S_ + c_.stage, "idle", "idle", wait_since_, t, -1,
               wait_credits_ ? "backpressure" : "input", int(c_.stage));
  }

  void send_to_piece(std::uint32_t piece, std::int64_t mb, stage_payload v, bool forward) {
    const std::uint32_t dest = piece % S_;
    if (dest == c_.stage) {  // the next chunk lives here: no message
      (forward ? acts_ : grads_)[{mb, piece}] = std::move(v);
      return;
    }
    if (v.on_device() && (c_.domains.empty() || c_.domains[dest] == nullptr || c_.domains[dest] != c_.domains[c_.stage])) {
      // Another device or a CPU stage: through pinned memory; sent once the copy's event
      // has come back on this loop (as a message to this stage, so in its context).
      auto& rt = system();
      c_.engine->to_host(std::move(v), executor(),
                         [&rt, self = self(), mb, piece, forward](std::exception_ptr e, std::vector<tensor> x) {
                           (void)rt.try_send(self, host_copy_done{mb, piece, forward, std::move(e), std::move(x)},
                                             actors::lane::urgent);
                         });
      return;
    }
    const auto& to = (*stages_)[replica_ * S_ + dest];
    if (forward) send(to, activation_msg{mb, piece, std::move(v)});
    else
      send(to, gradient_msg{mb, piece, std::move(v)},
           c_.emergent ? actors::lane::urgent : actors::lane::normal);  // backward first
  }

  void run(const action& a) {
    const auto start = now();
    const std::uint32_t p = c_.plan->piece(c_.stage, a.chunk);
    auto& exec = *c_.chunks[a.chunk];
    const std::int64_t mb = a.micro_batch;
    switch (a.op) {
      case op::F: {
        stage_payload in;
        if (p == 0) in.host.push_back(std::move(inputs_[a.micro_batch]));
        else {
          auto it = acts_.find({mb, p});
          in = std::move(it->second);
          acts_.erase(it);
        }
        stage_payload out;
        if (c_.engine) {
          out = c_.engine->forward(a.chunk, a.micro_batch, std::move(in));
        } else {
          if (in.on_device()) throw std::logic_error("pipeline: a device payload reached a CPU stage");
          out.host = exec.forward(a.micro_batch, std::move(in.host), layers::forward_context{a.micro_batch, step_});
        }
        if (p + 1 < P_) {
          send_to_piece(p + 1, mb, std::move(out), true);
        } else if (c_.engine) {
          grads_[{mb, p}] = c_.engine->loss(a.micro_batch, std::move(out), targets_.at(a.micro_batch),
                                            shares_.at(a.micro_batch));
        } else {
          auto r = c_.criterion->forward(out.host.at(0), targets_.at(a.micro_batch));
          rep_.losses[a.micro_batch] = r.loss;
          rep_.correct[a.micro_batch] = r.correct;
          stage_payload g;
          g.host.push_back(c_.criterion->backward(r.stash, float(shares_.at(a.micro_batch))));
          grads_[{mb, p}] = std::move(g);
        }
        if (c_.emergent) ++next_f_, ++in_flight_;
        break;
      }
      case op::B: {
        auto it = grads_.find({mb, p});
        auto g = std::move(it->second);
        grads_.erase(it);
        stage_payload gin;
        if (c_.engine) {
          gin = c_.engine->backward_input(a.chunk, a.micro_batch, std::move(g));
          if (!c_.plan->split_backward) c_.engine->backward_weight(a.chunk, a.micro_batch);
        } else {
          if (g.on_device()) throw std::logic_error("pipeline: a device payload reached a CPU stage");
          gin.host = exec.backward_input(a.micro_batch, std::move(g.host));
          if (!c_.plan->split_backward) exec.backward_weight(a.micro_batch);
        }
        if (p > 0) send_to_piece(p - 1, mb, std::move(gin), false);
        if (c_.emergent) --in_flight_;
        break;
      }
      case op::W:
        if (c_.engine) c_.engine->backward_weight(a.chunk, a.micro_batch);
        else exec.backward_weight(a.micro_batch);
        break;
    }
    std::size_t held = 0, bytes = 0;
    if (c_.engine) held = c_.engine->stashed(), bytes = c_.engine->stash_bytes();
    else
      for (auto& c : c_.chunks) held += c->stashed(), bytes += c->stash_bytes();
    rep_.peak_stashed = std::max(rep_.peak_stashed, held);
    rep_.peak_bytes = std::max(rep_.peak_bytes, bytes);
    const auto end = now();
    rep_.busy_ns += end - start;
    rep_.actions.push_back({a, double(start - t0_) * 1e-9, double(end - t0_) * 1e-9});
    auto& rec = system().trace();
    if (rec.enabled())
      rec.span(stage_track_base + replica_ * S_ + c_.stage, "action", op_name(a.op), start, end, mb, nullptr, int(c_.stage),
               c_.emergent ? -1 : int(cursor_), a.chunk);
  }

  void finish() {
    if (!active_ || finishing_) return;
    finishing_ = true;
    const auto start = now();
    if (c_.engine) {
      // Enqueued; the report goes out when the stream's work is done (engine_done).
      c_.engine->optimizer_step();
      const auto enqueued = now() - start;
      rep_.busy_ns += enqueued;
      rep_.optimizer_ns += enqueued;
      auto& rt = system();
      c_.engine->when_done(executor(), [&rt, self = self()](std::exception_ptr e) {
        (void)rt.try_send(self, engine_done{std::move(e)}, actors::lane::urgent);
      });
      return;
    }
    c_.opt->step(parameters());
    const auto stepped = now() - start;
    rep_.busy_ns += stepped;
    rep_.optimizer_ns += stepped;
    deliver();
  }

  /// The parameters of the stage's pieces, named as in the graph.
  std::vector<layers::parameter_ref> parameters() {
    std::vector<layers::parameter_ref> params;
    for (auto& c : c_.chunks)
      for (auto& p : c->parameters()) params.push_back(std::move(p));
    return params;
  }

  void deliver() {
    if (!active_) return;
    if (c_.engine && c_.plan->piece(c_.stage, c_.plan->chunks - 1) + 1 == P_)
      for (std::uint32_t m = 0; m < c_.plan->micro_batches; ++m) {
        const auto f = c_.engine->loss_of(m);
        rep_.losses[m] = f.loss;
        rep_.correct[m] = f.correct;
      }
    rep_.end_ns = now();
    inputs_.clear();
    active_ = false;
    if (reply_) reply_.deliver(std::move(rep_));
  }

  config c_;
  std::uint32_t S_ = 1, P_ = 1;
  std::shared_ptr<const std::vector<actors::address>> stages_;
  actors::deferred_reply<stage_report> reply_;
  stage_report rep_;
  std::uint64_t step_ = 0;
  std::int64_t t0_ = 0;
  std::vector<tensor> inputs_;
  std::vector<layers::targets> targets_;
  std::vector<double> shares_;
  std::map<key, stage_payload> acts_, grads_;
  std::size_t cursor_ = 0;
  bool active_ = false, waiting_ = false, wait_credits_ = false, failed_ = false, finishing_ = false;
  std::int64_t wait_since_ = 0;
  // Emergent mode.
  std::uint32_t next_f_ = 0, in_flight_ = 0;
  // Data parallelism.
  std::uint32_t replica_ = 0;
};

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
  if (!options_.engines.empty()) {
    if (options_.engines.size() != S)
      throw std::invalid_argument("pipeline: " + std::to_string(options_.engines.size()) + " stage engines given for " +
                                  std::to_string(S) + " stages");
    if (replicas_ > 1) throw std::invalid_argument("pipeline: device stages run one replica");
  }
  // Device stages: one engine per stage whose factory is set (the others run on their loop's CPU).
  engines_.assign(S, nullptr);
  std::vector<const void*> domains(S, nullptr);
  for (std::uint32_t s = 0; s < S && !options_.engines.empty(); ++s) {
    if (!options_.engines[s]) continue;
    stage_engine_context ctx{*replicas[0], pieces_, s, {}, false, criterion};
    for (std::uint32_t k = 0; k < plan_.chunks; ++k) ctx.piece_of_chunk.push_back(plan_.piece(s, k));
    ctx.holds_last = plan_.piece(s, plan_.chunks - 1) + 1 == plan_.pieces();
    engines_[s] = options_.engines[s](ctx);
    if (engines_[s]) domains[s] = engines_[s]->domain();
  }
  auto shared_plan = std::make_shared<const schedule>(plan_);
  const auto loop_of = [&](std::uint32_t r, std::uint32_t s) {
    return options_.loops.empty() ? (r * S + s) % rt.loop_count() : options_.loops[r * S + s];
  };
  if (std::none_of(engines_.begin(), engines_.end(), [](auto& e) { return e != nullptr; })) {
    spawn_groups(replicas, shared_plan, criterion, make_optimizer, loop_of);
  } else {
    // Device stages (and the CPU stages beside them): one stage actor per stage that runs
    // its pieces itself (piece_executor) or through its engine. Until layer actors have a
    // device backend; then these stages become groups as well.
    for (std::uint32_t r = 0; r < replicas_; ++r)
      for (std::uint32_t s = 0; s < S; ++s) {
        stage_actor::config c;
        c.engine = engines_[s];
        c.domains = domains;
        c.stage = s;
        c.plan = shared_plan;
        for (std::uint32_t k = 0; k < plan_.chunks; ++k)
          c.chunks.push_back(std::make_unique<piece_executor>(*replicas[r], pieces_, plan_.piece(s, k)));
        c.opt = make_optimizer();
        c.criterion = criterion;
        c.emergent = options_.emergent;
        c.credits = options_.credits ? options_.credits : S - s;
        actors::spawn_options so;
        so.loop = loop_of(r, s);
        // Every message of a step fits: nothing is refused for room in scheduled mode.
        so.capacity = std::size_t(4) * plan_.micro_batches * plan_.chunks + 16;
        stages_.push_back(rt.spawn_with<stage_actor>(so, std::move(c)));
        rt.annotate(stages_.back().id(), int(s), replicas_ > 1 ? "replica " + std::to_string(r) : "pipeline");
      }
  }
  metrics_.resize(S);
  reset_metrics();
}

void pipeline::spawn_groups(const std::vector<layers::graph*>& replicas, std::shared_ptr<const schedule> shared_plan,
                            std::shared_ptr<const layers::loss> criterion, const layers::optimizer_factory& make_optimizer,
                            const std::function<unsigned(std::uint32_t, std::uint32_t)>& loop_of) {
  const std::uint32_t S = plan_.stages, P = plan_.pieces(), M = plan_.micro_batches;
  auto& g0 = *replicas[0];
  const auto& nodes0 = g0.nodes();
  const std::size_t N = nodes0.size();
  flow_ = layers::make_plan(g0);
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

  layers_.assign(std::size_t(replicas_) * N, actors::address{});
  std::vector<layers::layer_gating> gating(std::size_t(replicas_) * N);  // given once the reducers exist
  for (std::uint32_t r = 0; r < replicas_; ++r) {
    auto& g = *replicas[r];
    auto& nodes = g.nodes();
    const std::string group = replicas_ > 1 ? "replica " + std::to_string(r) : "pipeline";
    // The gates first: they supervise their layers.
    std::vector<stage_gate*> gates(S);
    for (std::uint32_t s = 0; s < S; ++s) {
      actors::spawn_options so;
      so.loop = loop_of(r, s);
      // Its messages of a step (arrivals, done reports) fit whatever the order.
      so.capacity = std::size_t(8) * (M + 1) * (N + 2) * plan_.chunks;
      stages_.push_back(rt_.spawn_with<stage_gate>(
          so, stage_gate::config{s, shared_plan, criterion, options_.emergent, options_.credits ? options_.credits : S - s}));
      gates[s] = static_cast<stage_gate*>(stages_.back().get());
      rt_.annotate(stages_.back().id(), int(s), group);
    }
    auto* at = &layers_[std::size_t(r) * N];
    auto actor_at = [&](std::size_t i) -> layers::layer_actor& { return *static_cast<layers::layer_actor*>(at[i].get()); };
    for (std::size_t i : g.order()) {
      if (nodes[i].is_input()) continue;
      const std::uint32_t s = piece_of[i] % S;
      actors::spawn_options so;
      so.loop = loop_of(r, s);
      so.supervisor = stages_[r * S + s];
      // Every forward and gradient of a step fits, held or not, with the gate's admits.
      so.capacity = std::size_t(M + 1) * (nodes[i].inputs.size() + flow_.nodes[i].edge_count() + 4) + 16;
      at[i] = rt_.spawn_with<layers::layer_actor>(so, nodes[i], std::uint32_t(i), flow_.nodes[i],
                                                     layers::make_cpu_kernels(nodes[i], make_optimizer()));
      rt_.annotate(at[i].id(), int(s), group);
    }
    // Edges are bus signals, as in a network; forwards that enter a piece and gradients that
    // come back into one are held by the layer until its gate admits them.
    std::vector<gate_piece> chunks(std::size_t(S) * plan_.chunks);  // by piece
    std::int32_t next_edge = 0;
    for (std::size_t i = 0; i < N; ++i) {
      const auto& np = flow_.nodes[i];
      if (nodes[i].is_input()) {
        for (auto& e : np.edges) gates[0]->input().subscribe(at[e.consumer], e.port);
        continue;
      }
      auto& a = actor_at(i);
      const auto p = piece_of[i];
      layers::layer_gating gate{stages_[r * S + p % S], p, 0, {}, plan_.split_backward, true, {}, r};
      std::vector<std::int32_t> edge_ids;
      for (std::uint32_t k = 0; k < np.edges.size(); ++k) {
        const auto& e = np.edges[k];
        a.output().subscribe(at[e.consumer], e.port);
        actor_at(e.consumer).input_gradient(e.port).subscribe(at[i], k);
        edge_ids.push_back(next_edge++);
        gate.hold_backward.push_back(piece_of[e.consumer] != p);
      }
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
      a.wire(stages_[r * S + p % S], std::move(edge_ids));
      gating[r * N + i] = std::move(gate);
    }
    for (std::uint32_t s = 0; s < S; ++s) {
      bus::group members("stage " + std::to_string(s) + (replicas_ > 1 ? " of replica " + std::to_string(r) : ""));
      std::vector<gate_piece> mine;
      for (std::uint32_t k = 0; k < plan_.chunks; ++k) {
        mine.push_back(std::move(chunks[plan_.piece(s, k)]));
        for (auto& l : mine.back().layers) members.add(l);
      }
      gates[s]->wire(std::move(mine), members.members());
      groups_.push_back(std::move(members));
    }
  }
  // Data parallelism: the replicas of each layer with parameters form a group whose
  // all-reduce sums its gradients (in rank order: the same bits whatever the arrival order),
  // started as soon as the layer's last W of the step ran.
  if (replicas_ > 1)
    for (std::size_t i = 0; i < N; ++i) {
      if (nodes0[i].is_input() || !nodes0[i].layer->has_parameters()) continue;
      bus::group members(nodes0[i].name + " replicas");
      for (std::uint32_t r = 0; r < replicas_; ++r) members.add(layers_[r * N + i]);
      actors::spawn_options so;
      so.loop = layers_[i].loop();
      so.supervisor = stages_[piece_of[i] % S];
      reducers_.push_back(rt_.spawn_with<bus::all_reduce>(so, "all-reduce " + nodes0[i].name, std::move(members)));
      for (std::uint32_t r = 0; r < replicas_; ++r) gating[r * N + i].reducer = reducers_.back();
    }
  for (std::size_t k = 0; k < layers_.size(); ++k)
    if (layers_[k]) static_cast<layers::layer_actor*>(layers_[k].get())->gate(std::move(gating[k]));
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
  // The stage actors let their engines go when they stop: wait for that, so the last
  // reference (whose destructor waits for its stream) goes here, off the loops.
  sync();
}

pipeline::~pipeline() { stop_all(); }

layers::bus_traffic pipeline::traffic() const {
  layers::bus_traffic t;
  if (layers_.empty()) return t;  // device stages: no layer actors
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

layers::optimizer_state pipeline::optimizer_state_of() const {
  layers::optimizer_state all;  // replica 0's: every replica steps the same sums
  if (!layers_.empty()) {  // each layer's optimizer, named as a network names them (`fc1.weight`, `fc1.steps`)
    for (std::size_t i = 0; i < graph_->nodes().size(); ++i) {
      if (!layers_[i]) continue;
      const auto prefix = graph_->nodes()[i].name + ".";
      auto st = rt_.ask<layers::optimizer_state>(layers_[i], layers::get_optimizer_state{}, std::chrono::nanoseconds::max()).get();
      for (auto& b : st.buffers) all.buffers.push_back({prefix + b.parameter, std::move(b.name), std::move(b.values)});
      for (auto& [k, v] : st.counters) all.counters[prefix + k] = v;
    }
    return all;
  }
  for (std::uint32_t s = 0; s < plan_.stages; ++s) {
    auto st = engine_of(s) ? engine_of(s)->optimizer_state()
                          : rt_.ask<layers::optimizer_state>(stages_[s], layers::get_optimizer_state{},
                                                             std::chrono::nanoseconds::max())
                                .get();
    for (auto& b : st.buffers) all.buffers.push_back(std::move(b));
    for (auto& [k, v] : st.counters) all.counters.emplace(k, v);
  }
  return all;
}

void pipeline::load_optimizer_state(const layers::optimizer_state& state) {
  std::vector<std::future<bool>> done;
  if (!layers_.empty()) {
    const auto& nodes = graph_->nodes();
    std::vector<layers::optimizer_state> parts(nodes.size());
    auto owner = [&](const std::string& name) -> std::size_t {
      for (std::size_t i = 0; i < nodes.size(); ++i)
        if (layers_[i] && name.size() > nodes[i].name.size() && name.rfind(nodes[i].name + ".", 0) == 0) return i;
      return nodes.size();
    };
    for (const auto& b : state.buffers) {
      const auto i = owner(b.parameter);
      if (i == nodes.size())
        throw std::invalid_argument("optimizer state: '" + b.parameter + "' belongs to no layer of the pipeline");
      parts[i].buffers.push_back({b.parameter.substr(nodes[i].name.size() + 1), b.name, b.values});
    }
    for (const auto& [k, v] : state.counters) {
      const auto i = owner(k);
      if (i < nodes.size()) parts[i].counters[k.substr(nodes[i].name.size() + 1)] = v;
      else  // a stage-wide counter (`steps` of a checkpoint written by stage optimizers): every layer's
        for (auto& part : parts) part.counters.emplace(k, v);
    }
    for (std::size_t k = 0; k < layers_.size(); ++k)
      if (layers_[k])
        done.push_back(rt_.ask<bool>(layers_[k], layers::set_optimizer_state{parts[k % nodes.size()]},
                                     std::chrono::nanoseconds::max()));
    for (auto& f : done) f.get();
    return;
  }
  for (std::size_t k = 0; k < stages_.size(); ++k) {
    const auto s = k % plan_.stages;
    if (auto* e = engine_of(s)) {  // device stages run one replica
      layers::optimizer_state mine;  // the buffers of the stage's own parameters, and the counters
      for (auto& b : state.buffers)
        for (std::uint32_t c = 0; c < plan_.chunks; ++c)
          for (auto i : pieces_[plan_.piece(std::uint32_t(s), c)])
            if (b.parameter.rfind(graph_->nodes()[i].name + ".", 0) == 0) mine.buffers.push_back(b);
      mine.counters = state.counters;
      e->load_optimizer_state(mine);
    } else {
      done.push_back(rt_.ask<bool>(stages_[k], layers::set_optimizer_state{state}, std::chrono::nanoseconds::max()));
    }
  }
  for (auto& f : done) f.get();
}

stage_engine* pipeline::engine_of(std::uint32_t stage) const noexcept {
  return stage < engines_.size() ? engines_[stage].get() : nullptr;
}

void pipeline::download() {
  for (auto& e : engines_)
    if (e) e->download();
}

bool pipeline::stopped() const noexcept {
  for (auto* v : {&stages_, &layers_})
    for (auto& a : *v)
      if (a && !a.stopped()) return false;
  return true;
}

void pipeline::reset_metrics() {
  for (std::uint32_t s = 0; s < metrics_.size(); ++s) metrics_[s] = stage_metrics{s};
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
  for (std::uint32_t r = 0; r < R; ++r) {
    const auto micro = layers::split_micro_batches(parts[r].count, M);
    for (std::uint32_t m = 0; m < M; ++m) {
      const std::int64_t first = parts[r].first + micro[m].first, count = micro[m].count;
      auto& in = msgs[r * S].inputs;
      auto& out = msgs[r * S + S - 1];
      in.push_back(M == 1 && R == 1 ? std::move(input) : input.slice(first, count));
      out.targets.push_back(M == 1 && R == 1 ? t.clone() : t.slice(first, count));
      out.shares.push_back(double(count) / double(n));
      counts.push_back(count);
    }
  }
  const auto t0 = rt_.trace().now();
  std::vector<std::future<stage_report>> futures(msgs.size());
  // Last stage first: a stage's first message of the step is then usually its step_msg.
  for (std::size_t i = msgs.size(); i-- > 0;) {
    msgs[i].step = step;
    msgs[i].lr = lr;
    msgs[i].t0_ns = t0;
    msgs[i].stages = addrs;
    msgs[i].replica = std::uint32_t(i / S);
    msgs[i].replicas = R;
    futures[i] = rt_.ask<stage_report>(stages_[i], std::move(msgs[i]), std::chrono::nanoseconds::max());
  }
  std::vector<stage_report> reports(msgs.size());
  // A failing stage fails its request with its error and makes every other stage fail
  // with `stage_aborted` (see abort_msg): rethrow the error itself.
  std::exception_ptr first_error, aborted;
  for (std::size_t i = 0; i < msgs.size(); ++i) {
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
  const auto t1 = rt_.trace().now();
  const double wall = double(t1 - t0) * 1e-9;
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
    const double busy = double(r.busy_ns) * 1e-9;
    const double waited = double(r.input_wait_ns) * 1e-9;
    const double bp = double(r.backpressure_ns) * 1e-9;
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
      // The wait before the first action and after the optimizer: the step barrier.
      const auto track = stage_track_base + std::uint32_t(i);
      if (reports[i].begin_ns > t0) rec.span(track, "idle", "idle", t0, reports[i].begin_ns, -1, "optimizer", int(i % S));
      if (t1 > reports[i].end_ns) rec.span(track, "idle", "idle", reports[i].end_ns, t1, -1, "optimizer", int(i % S));
    }
    rec.span(0, "step", "step", t0, t1, -1, nullptr, -1, -1, std::int64_t(step));
  }
  return result;
}

nlohmann::json pipeline::trace_metadata() const {
  nlohmann::json stages = nlohmann::json::array();
  for (std::uint32_t s = 0; s < plan_.stages; ++s) {
    nlohmann::json ids = nlohmann::json::array();
    nlohmann::json layer_ids = nlohmann::json::array();  // the stage's group (CPU stages), every replica's
    for (std::uint32_t r = 0; r < replicas_; ++r) {
      ids.push_back(stages_[r * plan_.stages + s].id());
      if (!groups_.empty())
        for (auto& a : stage_group(r, s).members()) layer_ids.push_back(a.id());
    }
    stages.push_back({{"stage", s},
                      {"actors", ids},
                      {"layers", layer_ids},
                      {"loop", stages_[s].loop()},
                      {"device", engines_.size() > s && engines_[s] ? engines_[s]->device_name() : "cpu"}});
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

void write_trace(actors::runtime& rt, const pipeline& p, const std::string& path) {
  rt.write_trace(path, p.trace_metadata());
  // Name the stage tracks (the recorder names actor tracks only).
  std::ifstream in(path);
  auto j = nlohmann::json::parse(in);
  in.close();
  auto& ev = j["traceEvents"];
  const std::uint32_t S = p.plan().stages;
  for (std::uint32_t s = 0; s < S * p.replicas(); ++s) {
    const std::string name = p.replicas() > 1
                                 ? "replica " + std::to_string(s / S) + " stage " + std::to_string(s % S)
                                 : "stage " + std::to_string(s);
    ev.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", 0}, {"tid", stage_track_base + s},
                  {"args", {{"name", name}}}});
    ev.push_back({{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", 0}, {"tid", stage_track_base + s},
                  {"args", {{"sort_index", -100 + int(s)}}}});
  }
  std::ofstream out(path);
  out << j.dump();
  if (!out) throw std::runtime_error("pipeline: cannot write the trace to " + path);
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
  std::vector<double> busy(plan.stages, 0), last(plan.stages, 0);
  for (std::uint32_t s = 0; s < plan.stages; ++s) {
    for (std::size_t i = 0; i < sim.end[s].size(); ++i) {
      busy[s] += sim.end[s][i] - sim.start[s][i];
      last[s] = std::max(last[s], sim.end[s][i]);
    }
    busy[s] += optimizer[s];
    step_end = std::max(step_end, last[s] + optimizer[s]);
  }
  std::vector<double> out(plan.stages, 0);
  for (std::uint32_t s = 0; s < plan.stages; ++s) out[s] = step_end > 0 ? 1.0 - busy[s] / step_end : 0.0;
  return out;
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

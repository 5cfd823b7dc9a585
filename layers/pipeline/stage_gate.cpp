#include "layers/pipeline/stage_gate.hpp"

#include <algorithm>
#include <exception>
#include <stdexcept>
#include <string>

#include "actors/runtime.hpp"

namespace nerve::pipeline {

using layers::stage_op;

namespace {

op op_of(stage_op o) { return o == stage_op::forward ? op::F : o == stage_op::backward ? op::B : op::W; }
const char* op_name(op o) { return o == op::F ? "F" : o == op::B ? "B" : "W"; }

std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown error";
  }
}

}  // namespace

stage_gate::stage_gate(config c)
    : actor(c.name.empty() ? "stage " + std::to_string(c.stage) : c.name), c_(std::move(c)),
      S_(c_.plan ? c_.plan->stages : 1), P_(c_.plan ? c_.plan->pieces() : 1),
      emergent_(c_.policy == admission::emergent) {
  if (!c_.plan && !free()) throw std::invalid_argument("stage_gate: a schedule's admission needs its plan");
  // Without admission the handlers let a failure go to the runtime (as any actor's), which
  // stops every actor: on_stop then fails the runs waiting.
  on<detail::run_msg>([this](detail::run_msg& r) {
    free_jobs_.push_back({std::move(r), defer_reply<detail::run_outcome>()});
    free_guarded([&] { free_start_more(); });
  });
  on<detail::step_msg>([this](detail::step_msg& m) {
    if (failed_)  // a layer failed between steps (a bad optimizer state, say): the stage is gone
      return defer_reply<detail::stage_report>().fail(std::make_exception_ptr(
          std::runtime_error("stage " + std::to_string(c_.stage) + " stopped after a failure of its layers")));
    guarded([&] { on_step(m); });
  });
  on<layers::layer_event>([this](layers::layer_event& e) { guarded([&] { on_event(e); }); });
  on<layers::forward_msg>([this](layers::forward_msg& m) {
    if (free()) return free_guarded([&] { free_output(m); });
    guarded([&] { on_output(m); });
  });
  on<layers::node_done>([this](layers::node_done& d) {
    if (free())
      return free_guarded([&] {
        ++free_running(d.step).nodes_done;
        free_finish();
      });
    guarded([&] {
      ++nodes_done_;
      finish_step();
    });
  });
  on<layers::backend_done>([this](layers::backend_done& d) {
    if (free()) return free_guarded([&] { layers::handle_backend_done(d); });
    guarded([&] { layers::handle_backend_done(d); });
  });
  // A layer of the stage failed (the gate is its supervisor), or a layer of another stage.
  on<actors::failure>([this](actors::failure& f) { fail(std::exchange(f.error, nullptr), false); });
  on<detail::abort_msg>([this](detail::abort_msg& m) {
    fail(std::make_exception_ptr(detail::stage_aborted("stage " + std::to_string(c_.stage) + " stopped: stage " +
                                                       std::to_string(m.from) + " failed: " + m.what)),
         true);
  });
}

void stage_gate::wire(std::vector<gate_piece> chunks, std::vector<actors::address> members) {
  chunks_ = std::move(chunks);
  members_ = std::move(members);
}

template <class F>
void stage_gate::guarded(F&& f) {
  if (failed_) return;
  if (c_.watch) c_.watch->bump();
  std::exception_ptr e;
  try {
    f();
  } catch (...) {
    e = std::current_exception();
  }
  if (e) fail(std::move(e), false);
}

void stage_gate::fail(std::exception_ptr e, bool aborted) {
  if (failed_) return;  // the stage already ended its step: later failures are its consequences
  failed_ = true;
  publish();
  if (!aborted && req_.stages) {  // every other stage (of every replica) ends its step too
    const std::string what = what_of(e);
    for (std::uint32_t s = 0; s < req_.stages->size(); ++s)
      if (s != req_.replica * S_ + c_.stage && (*req_.stages)[s])  // empty: a stage on another rank
        (void)try_send((*req_.stages)[s], detail::abort_msg{c_.stage, what}, actors::lane::urgent);
  }
  // The layers stop; this gate stays to hear of their failures until the pipeline stops it.
  for (auto& a : members_) system().stop(a);
  // Handed over last: this thread then holds no reference to the exception.
  if (reply_) reply_.fail(std::move(e));
}

std::int64_t stage_gate::now() { return system().trace().now(); }

void stage_gate::on_step(detail::step_msg& m) {
  reply_ = defer_reply<detail::stage_report>();
  req_ = std::move(m);
  if (!req_.train) return on_evaluate();
  const std::uint32_t M = c_.plan->micro_batches;
  rep_ = {.losses = std::vector<double>(M), .correct = std::vector<std::int64_t>(M), .begin_ns = now()};
  cursor_ = held_ = nodes_done_ = 0;
  next_f_ = in_flight_ = loss_reports_due_ = out_ = 0;
  waiting_ = running_ = stepping_ = false;
  active_ = true;
  advance();
}

void stage_gate::on_event(const layers::layer_event& e) {
  if (e.evaluated) {
    ++evaluated_;
    return finish_evaluation();
  }
  bytes_ = bytes_ + e.stash_bytes - layer_bytes_[e.node];
  layer_bytes_[e.node] = e.stash_bytes;
  rep_.peak_bytes = std::max(rep_.peak_bytes, bytes_);
  if (e.arrived) {  // may come before this stage's step began: counted until admitted
    auto& n = (e.op == stage_op::forward ? forwards_ : gradients_)[{e.micro_batch, e.piece}];
    ++n;
    ++arrivals_;
    if (e.op == stage_op::backward && n == chunks_[e.piece / S_].gradients_in)
      gradients_complete_[{e.micro_batch, e.piece}] = arrivals_;
    if (!running_) seen_ = arrivals_;  // an idle stage sees it at once
    advance();
    return;
  }
  if (!running_ || op_of(e.op) != cur_.op || e.micro_batch != std::int64_t(cur_.micro_batch) || e.piece != cur_piece_)
    throw std::logic_error("stage " + std::to_string(c_.stage) + ": a layer ran " + op_name(op_of(e.op)) +
                           std::to_string(e.micro_batch) + " of piece " + std::to_string(e.piece) +
                           " outside the action running");
  if (++done_ == chunks_[cur_.chunk].layers.size() && !loss_pending_) complete();
}

void stage_gate::finish_step() {
  if (!stepping_ || nodes_done_ < members_.size() || loss_reports_due_ > 0) return;
  const auto stepped = now() - step_start_;
  rep_.busy_ns += stepped;
  rep_.optimizer_ns += stepped;
  rep_.end_ns = now();
  req_.inputs.clear();
  active_ = stepping_ = false;
  if (reply_) reply_.deliver(std::move(rep_));
}

void stage_gate::on_evaluate() {
  const auto n = std::max(req_.inputs.size(), req_.targets.size());
  rep_ = {.losses = std::vector<double>(n), .correct = std::vector<std::int64_t>(n), .begin_ns = now()};
  rep_.outputs.resize(req_.want_output ? n : 0);
  evaluating_ = true;
  evaluations_due_ = members_.size() * req_.evaluations;
  outputs_due_ = std::uint32_t(req_.targets.size());  // the last stage's: one per micro-batch
  loss_reports_due_ = 0;
  // Every micro-batch at once: evaluation keeps no stash, so nothing bounds what is in flight.
  for (std::size_t k = 0; k < req_.inputs.size(); ++k)
    input_.emit(layers::forward_msg{std::int64_t(k), req_.step, 0, std::uint32_t(req_.inputs.size()), false, -1,
                                    std::move(req_.inputs[k])});
  for (auto& m : std::exchange(early_outputs_, {})) {
    if (m.step != req_.step)
      throw std::logic_error("stage " + std::to_string(c_.stage) + ": an evaluation output of step " +
                             std::to_string(m.step) + " came before the evaluation of step " +
                             std::to_string(req_.step));
    on_evaluated(m);
  }
  finish_evaluation();
}

void stage_gate::on_evaluated(layers::forward_msg& m) {
  if (!evaluating_ && !active_) {  // the evaluation's request is still on its way (another rank's stages ran ahead)
    early_outputs_.push_back(std::move(m));
    return;
  }
  const auto mb = std::size_t(m.micro_batch);
  if (!evaluating_ || mb >= req_.targets.size())
    throw std::logic_error("stage " + std::to_string(c_.stage) + ": an evaluation output of micro-batch " +
                           std::to_string(mb) + " that no evaluation asked for");
  --outputs_due_;
  const auto& t = req_.targets[mb];
  // On the last stage's backend, as in training: a device's figures come back with its
  // stream, the CPU's at once.
  std::int64_t first = 0;
  for (std::size_t k = 0; k < mb; ++k) first += req_.targets[k].size();
  ++loss_reports_due_;
  c_.loss_backend->loss(*this, *c_.criterion, std::move(m.x), t, first, req_.step, 1.0, false, req_.want_output,
                        [](layers::value) {},
                        [this, mb](layers::loss_figures& f) {
                          rep_.losses[mb] = f.loss;
                          rep_.correct[mb] = f.correct;
                          if (req_.want_output) rep_.outputs[mb] = std::move(f.output);
                          --loss_reports_due_;
                          finish_evaluation();
                        });
}

void stage_gate::finish_evaluation() {
  if (!evaluating_ || outputs_due_ > 0 || loss_reports_due_ > 0 || evaluated_ < evaluations_due_) return;
  evaluating_ = false;
  evaluated_ -= evaluations_due_;
  rep_.end_ns = now();
  req_.inputs.clear();
  req_.targets.clear();
  if (reply_) reply_.deliver(std::move(rep_));
}

void stage_gate::on_output(layers::forward_msg& m) {
  if (!m.train) return on_evaluated(m);
  // The loss of the last piece, part of its F; the gradient waits for that micro-batch's B.
  const auto mb = std::size_t(m.micro_batch);
  // On the last stage's backend: a device's figures come back with its stream, the CPU's
  // at once (its report's finish_step waits for the step's end).
  std::int64_t first = 0;  // the micro-batch's rows in the backend's staging
  for (std::size_t k = 0; k < mb; ++k) first += req_.targets[k].size();
  ++loss_reports_due_;
  c_.loss_backend->loss(
      *this, *c_.criterion, std::move(m.x), req_.targets.at(mb), first, req_.step, req_.shares.at(mb), true, false,
      [&](layers::value g) { loss_grads_[m.micro_batch] = std::move(g); },
      [this, mb](layers::loss_figures& f) {
        rep_.losses[mb] = f.loss;
        rep_.correct[mb] = f.correct;
        --loss_reports_due_;
        finish_step();
      });
  loss_pending_ = false;
  if (running_ && done_ == chunks_[cur_.chunk].layers.size()) complete();
}

bool stage_gate::ready(const action& a) const {
  const std::uint32_t p = c_.plan->piece(c_.stage, a.chunk);
  const auto& ch = chunks_[a.chunk];
  const auto all_in = [&](const std::map<key, std::uint32_t>& held, std::uint32_t count) {
    auto it = held.find({a.micro_batch, p});
    return it != held.end() && it->second == count;
  };
  if (a.op == op::F) return p == 0 ? a.micro_batch < req_.inputs.size() : all_in(forwards_, ch.forwards_in);
  if (a.op == op::B) return p + 1 == P_ ? loss_grads_.count(a.micro_batch) > 0 : all_in(gradients_, ch.gradients_in);
  return true;
}

/// The next action the emergent policy allows, if any: a B whose gradient is in (lowest
/// micro-batch first), else an F whose input is in while credits last. Gradients count
/// from arrival `seen` on only: those that came while the last action ran wait for the
/// next choice, as in a stage that handles one message at a time (this gives 1F1B's
/// order on the first and the last stage).
std::optional<action> stage_gate::emergent_next(bool& blocked_by_credits, std::uint64_t seen) const {
  blocked_by_credits = false;
  for (std::uint32_t mb = 0; mb < next_f_; ++mb) {
    const std::uint32_t p = c_.stage;
    auto it = gradients_complete_.find({mb, p});
    if (ready(action{op::B, mb, 0}) && (p + 1 == P_ || (it != gradients_complete_.end() && it->second <= seen)))
      return action{op::B, mb, 0};
  }
  if (next_f_ < c_.plan->micro_batches && ready(action{op::F, next_f_, 0})) {
    if (in_flight_ < c_.credits) return action{op::F, next_f_, 0};
    blocked_by_credits = true;
  }
  return std::nullopt;
}

void stage_gate::advance() {
  if (!active_ || running_ || stepping_ || failed_) return;
  const auto& list = c_.plan->actions[c_.stage];
  const std::size_t total = emergent_ ? std::size_t(c_.plan->micro_batches) * 2 : list.size();
  if (cursor_ < total) {
    action a;
    bool credit_block = false;
    if (emergent_) {
      auto n = emergent_next(credit_block, seen_);
      if (!n) n = emergent_next(credit_block, arrivals_);  // nothing else to do: everything counts
      if (!n) return block(credit_block);
      a = *n;
    } else {
      a = list[cursor_];
      if (!ready(a)) return block(false);
    }
    unblock();
    run(a);
    return;
  }
  // Every action ran: the optimizer steps of the stage's layers (after their all-reduce).
  stepping_ = true;
  step_start_ = now();
  publish();
  for (auto& a : members_) send(a, layers::admit{stage_op::step, 0});
}

void stage_gate::run(const action& a) {
  const std::uint32_t p = c_.plan->piece(c_.stage, a.chunk);
  const std::int64_t mb = a.micro_batch;
  const auto& ch = chunks_[a.chunk];
  running_ = true;
  seen_ = arrivals_;
  cur_ = a;
  cur_piece_ = p;
  done_ = 0;
  cur_start_ = now();
  publish();
  switch (a.op) {
    case op::F:
      loss_pending_ = p + 1 == P_;
      forwards_.erase({mb, p});
      for (auto& l : ch.entries) send(l, layers::admit{stage_op::forward, mb});
      if (p == 0)
        input_.emit(layers::forward_msg{mb, req_.step, 0, c_.plan->micro_batches, true, req_.lr,
                                        std::move(req_.inputs[a.micro_batch])});
      break;
    case op::B:
      gradients_.erase({mb, p});
      gradients_complete_.erase({mb, p});
      for (auto& l : ch.exits) send(l, layers::admit{stage_op::backward, mb});
      if (p + 1 == P_) {
        auto it = loss_grads_.find(mb);
        loss_grad_.emit(layers::backward_msg{mb, req_.step, 0, std::move(it->second)});
        loss_grads_.erase(it);
      }
      break;
    case op::W:
      for (auto& l : ch.layers) send(l, layers::admit{stage_op::weight, mb});
      break;
  }
}

void stage_gate::complete() {
  const auto end = now();
  running_ = false;
  const action a = cur_;
  if (a.op == op::F) rep_.peak_stashed = std::max(rep_.peak_stashed, ++held_);
  else if (a.op == op::W || !c_.plan->split_backward) --held_;
  if (emergent_) {
    if (a.op == op::F) ++next_f_, ++in_flight_;
    else --in_flight_;
  }
  if (cur_piece_ + 1 < P_ && a.op != op::W) a.op == op::F ? ++out_ : --out_;
  rep_.busy_ns += end - cur_start_;
  rep_.actions.push_back({a, double(cur_start_ - req_.t0_ns) * 1e-9, double(end - req_.t0_ns) * 1e-9});
  auto& rec = system().trace();
  if (rec.enabled())
    rec.span(stage_track(req_.replica * S_ + c_.stage), "action", op_name(a.op), cur_start_, end, a.micro_batch,
             nullptr, int(c_.stage), emergent_ ? -1 : int(cursor_), a.chunk);
  ++cursor_;
  advance();
}

void stage_gate::block(bool credits) {
  if (waiting_) return;
  waiting_ = true;
  wait_credits_ = credits;
  wait_since_ = now();
  publish();
}

void stage_gate::unblock() {
  if (!waiting_) return;
  waiting_ = false;
  const auto t = now();
  (wait_credits_ ? rep_.backpressure_ns : rep_.input_wait_ns) += t - wait_since_;
  auto& rec = system().trace();
  if (rec.enabled())
    rec.span(stage_track(req_.replica * S_ + c_.stage), "idle", "idle", wait_since_, t, -1,
             wait_credits_ ? "backpressure" : "input", int(c_.stage));
}

void stage_gate::publish() {
  if (!c_.watch) return;
  gate_state g;
  g.out = out_;
  g.credit_limit = emergent_ ? c_.credits : 0;
  g.actions_done = cursor_;
  g.actions = emergent_ ? std::size_t(c_.plan->micro_batches) * 2 : c_.plan->actions[c_.stage].size();
  if (failed_) {
    g.now = gate_state::phase::failed;
  } else if (stepping_) {
    g.now = gate_state::phase::stepping;
    g.done = std::uint32_t(nodes_done_);
    g.layers = std::uint32_t(members_.size());
  } else if (running_) {
    g.now = gate_state::phase::running;
    g.next = cur_;
    g.has_next = true;
    g.piece = cur_piece_;
    g.done = done_;
    g.layers = std::uint32_t(chunks_[cur_.chunk].layers.size());
  } else if (waiting_) {
    g.now = gate_state::phase::waiting;
    g.credits = wait_credits_;
    // The action it would run next: the list's; in emergent mode the next forward (a
    // gradient that frees a credit, or any due, comes first when it arrives).
    std::optional<action> a;
    if (!emergent_) a = c_.plan->actions[c_.stage][cursor_];
    else if (next_f_ < c_.plan->micro_batches) a = action{op::F, next_f_, 0};
    if (a) {
      g.next = *a;
      g.has_next = true;
      const auto p = c_.plan->piece(c_.stage, a->chunk);
      g.piece = p;
      const auto& ch = chunks_[a->chunk];
      const auto held = [&](const std::map<key, std::uint32_t>& m) {
        auto it = m.find({a->micro_batch, p});
        return it == m.end() ? 0u : it->second;
      };
      if (a->op == op::F && p > 0) {
        g.forward = true;
        g.from_stage = std::int32_t((p - 1) % S_);
        g.have = held(forwards_);
        g.need = ch.forwards_in;
      } else if (a->op == op::B && p + 1 < P_) {
        g.forward = false;
        g.from_stage = std::int32_t((p + 1) % S_);
        g.have = held(gradients_);
        g.need = ch.gradients_in;
      }
    }
    if (emergent_ && !a && c_.stage + 1 < P_) {  // every forward ran: the gradients are due
      g.forward = false;
      g.from_stage = std::int32_t((c_.stage + 1) % S_);
    }
    if (wait_credits_) {  // a gradient from the next stage gives a credit back
      g.forward = false;
      g.from_stage = std::int32_t((g.piece + 1) % S_);
      g.have = g.need = 0;
    }
  }
  c_.watch->publish(g);
}

// ---- Without admission (a network) ----

template <class F>
void stage_gate::free_guarded(F&& f) {
  try {
    f();
  } catch (...) {
    // The actor fails with it; its on_stop runs before the runtime records the failure,
    // so the runs waiting get this error.
    own_failure_ = std::current_exception();
    if (c_.failed) c_.failed->set(own_failure_);
    throw;
  }
}

void stage_gate::on_stop() {
  if (free_jobs_.empty()) return;
  auto err = system().error();
  if (!err) err = std::exchange(own_failure_, nullptr);
  if (!err) err = std::make_exception_ptr(std::runtime_error("network stopped before the step finished"));
  for (auto& j : free_jobs_) j.reply.fail(err);
  free_jobs_.clear();
  free_running_ = 0;
}

stage_gate::free_job& stage_gate::free_running(std::uint64_t step) {
  for (std::size_t k = 0; k < free_running_; ++k)
    if (free_jobs_[k].req.step == step) return free_jobs_[k];
  throw std::logic_error("network: a report of step " + std::to_string(step) + ", which is not running");
}

/// Starts the queued runs that may go beside the ones running: training steps of other
/// numbers, up to the steps in flight; anything else alone.
void stage_gate::free_start_more() {
  const auto depth = std::max<std::size_t>(1, c_.steps_in_flight);
  while (free_running_ < free_jobs_.size()) {
    const auto& r = free_jobs_[free_running_].req;
    if (free_running_ > 0) {
      if (free_running_ >= depth || !r.train) return;
      for (std::size_t k = 0; k < free_running_; ++k)
        if (!free_jobs_[k].req.train || free_jobs_[k].req.step == r.step) return;
    }
    if (free_start(free_jobs_[free_running_])) ++free_running_;
    else free_jobs_.erase(free_jobs_.begin() + std::ptrdiff_t(free_running_));
  }
}

bool stage_gate::free_start(free_job& j) {
  auto& r = j.req;
  const std::int64_t n = r.input.batch();
  try {
    j.split = layers::split_micro_batches(n, r.micro_batches);
  } catch (const std::invalid_argument& e) {
    j.reply.fail(std::make_exception_ptr(std::invalid_argument(std::string("network: ") + e.what())));
    return false;
  }
  const auto m = static_cast<std::uint32_t>(j.split.size());
  j.result.samples = n;
  j.start_ns = system().trace().enabled() ? now() : -1;
  for (std::uint32_t k = 0; k < m; ++k) {
    const auto [first, count] = j.split[k];
    input_.emit(layers::forward_msg{k, r.step, 0, m, r.train, r.lr, c_.loss_backend->feed(r.input, first, count, r.step)});
  }
  return true;
}

/// The output of a micro-batch: its loss on the backend, the gradient back at once (the
/// layers are not gated), the figures into the run's result.
void stage_gate::free_output(layers::forward_msg& m) {
  auto& j = free_running(m.step);
  const auto mb = m.micro_batch;
  const auto [first, count] = j.split.at(std::size_t(mb));
  const double share = double(count) / double(j.result.samples);  // the input may be gone to `feed`
  const auto& r = j.req;
  auto t = j.split.size() == 1 ? std::move(j.req.t) : r.t.slice(first, count);
  c_.loss_backend->loss(
      *this, *c_.criterion, std::move(m.x), t, first, r.step, share, r.train, r.want_output,
      [&](layers::value g) { loss_grad_.emit(layers::backward_msg{mb, r.step, 0, std::move(g)}); },
      [this, step = r.step, share](layers::loss_figures& f) {
        auto& job = free_running(step);
        job.result.loss += share * f.loss;
        job.result.correct += f.correct;
        job.output = std::move(f.output);  // empty unless asked for
        ++job.reports;
        free_finish();
      });
}

/// Answers the finished runs at the front, in order, and starts what may follow.
void stage_gate::free_finish() {
  const auto done = [&](const free_job& j) {
    return j.reports >= j.split.size() && (!j.req.train || j.nodes_done >= c_.layer_count);
  };
  while (free_running_ > 0 && done(free_jobs_.front())) {
    auto j = std::move(free_jobs_.front());
    free_jobs_.pop_front();
    --free_running_;
    if (j.req.train && j.start_ns >= 0) {  // the step's slice on track 0 (docs/trace-format.md)
      auto& rec = system().trace();
      rec.span(0, "step", "step", j.start_ns, rec.now(), -1, nullptr, -1, -1, static_cast<std::int64_t>(j.req.step));
    }
    j.reply.deliver(detail::run_outcome{j.result, std::move(j.output)});
  }
  free_start_more();
}

}  // namespace nerve::pipeline

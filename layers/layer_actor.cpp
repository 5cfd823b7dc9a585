#include "layers/layer_actor.hpp"

#include "actors/runtime.hpp"
#include "layers/detail/vector_state.hpp"

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace nerve::layers {

namespace {
/// The messages `held` keeps for micro-batch `mb`, taken out.
template <class Msg>
std::vector<Msg> take_held(std::map<std::int64_t, std::vector<Msg>>& held, std::int64_t mb) {
  auto node = held.extract(mb);
  return node ? std::move(node.mapped()) : std::vector<Msg>{};
}
}  // namespace

template <class Msg>
void layer_actor::emit_across(bus::signal<Msg>& sig, crossing c, Msg m, value Msg::*field,
                              std::function<void()> after) {
  if (c == crossing::none) {
    sig.emit(std::move(m));
    if (after) after();
    return;
  }
  auto v = std::move(m.*field);
  auto held = std::make_shared<Msg>(std::move(m));  // std::function wants a copyable handler
  kernels_->hand_over(*this, std::move(v), c == crossing::host,
                      [&sig, held, field, after = std::move(after)](value out) {
                        (*held).*field = std::move(out);
                        sig.emit(std::move(*held));
                        if (after) after();
                      });
}

layer_actor::layer_actor(graph::node_type& n, std::uint32_t index, const node_plan& plan,
                         std::unique_ptr<layer_kernels> kernels)
    : actor(n.name), node_(n), index_(index), plan_(plan), kernels_(std::move(kernels)) {
  if (!node_.layer) throw std::invalid_argument("layer_actor: node '" + node_.name + "' is a graph input, not a layer");
  on<forward_msg>([this](forward_msg& m) {
    bump(handled_);
    on_forward(m);
  });
  on<backward_msg>([this](backward_msg& m) {
    bump(handled_);
    on_backward(m);
  });
  // Checkpoints: names as the optimizer steps them (the layer's own: "weight").
  on<get_optimizer_state>([this](get_optimizer_state&) { return kernels_->save_state(); });
  on<set_optimizer_state>([this](set_optimizer_state& m) {
    kernels_->load_state(m.state);
    return true;
  });
  on<backend_done>([](backend_done& d) { handle_backend_done(d); });
  on<admit>([this](admit& a) {
    bump(handled_);
    on_admit(a);
  });
  on<bus::reduced>([this](bus::reduced& m) {
    reduced_sum_ = std::move(m.sum);
    maybe_step();
  });
  on<device_reduced>([this](device_reduced& m) {
    device_sum_ = std::move(m.sum);
    maybe_step();
  });
  on<allow_nonfinite_gradients>([this](allow_nonfinite_gradients& m) { allow_nonfinite_ = m.allow; });
  for (std::size_t k = 0; k < node_.inputs.size(); ++k)
    grad_.push_back(std::make_unique<bus::signal<backward_msg>>(*this, "grad" + std::to_string(k)));
  outstanding_.assign(plan_.edge_count(), 0);
}

void layer_actor::wire(actors::address coordinator, std::vector<std::int32_t> edge_ids) {
  coordinator_ = std::move(coordinator);
  wanted_ = 0;
  for (std::size_t k = 0; k < grad_.size(); ++k)
    if (grad_[k]->subscribers() > 0) wanted_ |= input_mask{1} << k;
  if (!edge_ids.empty() && edge_ids.size() != plan_.edge_count())
    throw std::invalid_argument("layer '" + node_.name + "': " + std::to_string(edge_ids.size()) + " edge ids for " +
                                std::to_string(plan_.edge_count()) + " edges");
  edge_ids_ = std::move(edge_ids);
  credits_name_ = edge_ids_.empty() ? nullptr : system().trace().intern("credits");
}

void layer_actor::gate(layer_gating g) {
  g.hold_backward.resize(plan_.edge_count(), false);
  gating_ = std::move(g);
}

void layer_actor::report(stage_op op, std::int64_t mb, bool arrived) {
  if (gating_.gate)
    send(gating_.gate, layer_event{op, arrived, mb, gating_.piece, index_, bytes_ + pending_bytes_});
}

void layer_actor::on_admit(const admit& a) {
  switch (a.op) {
    // Taken out first: running them may hold or admit more of the same micro-batch.
    case stage_op::forward:
      for (auto& m : take_held(held_forward_, a.micro_batch)) on_forward(m, true);
      break;
    case stage_op::backward:
      for (auto& m : take_held(held_backward_, a.micro_batch)) on_backward(m, true);
      break;
    case stage_op::weight:
      // A W admitted before an earlier one waits for it (the sum's order); it counts as run.
      weight_admitted_.insert(a.micro_batch);
      finish_weight_grads();
      report(stage_op::weight, a.micro_batch);
      break;
    case stage_op::step:
      step_admitted_ = true;
      maybe_step();
      break;
  }
}

void layer_actor::record_credits(std::size_t edge) {
  auto& rec = system().trace();
  if (credits_name_ && rec.enabled())
    rec.counter(id(), credits_name_, "available",
                std::int64_t(step_micro_batches_) - std::int64_t(outstanding_[edge]), edge_ids_[edge]);
}

void layer_actor::on_forward(forward_msg& m, bool admitted) {
  const auto n_in = node_.inputs.size();
  if (m.port >= n_in)
    throw std::invalid_argument("layer '" + node_.name + "': forward into port " + std::to_string(m.port) + " of " +
                                std::to_string(n_in));
  // The stage's gate says when a training forward runs; evaluation runs each as it comes.
  if (!admitted && m.train && (gating_.hold_forward & (input_mask{1} << m.port))) {
    held_forward_[m.micro_batch].push_back(std::move(m));
    report(stage_op::forward, m.micro_batch, true);
    return;
  }
  if (m.train && m.step != step_) {  // first micro-batch of a new step
    if (step_open_) {  // this layer has not issued step_'s update yet: the next step waits
      next_step_.push_back(std::move(m));
      return;
    }
    step_ = m.step;
  }
  if (m.train) {
    step_open_ = true;
    step_micro_batches_ = m.micro_batches;
    kernels_->set_lr(m.lr);
  }

  auto& st = mbs_[m.micro_batch];
  if (st.forwarded)
    throw std::logic_error("layer '" + node_.name + "': micro-batch " + std::to_string(m.micro_batch) +
                           " forwarded twice");
  if (st.inputs.empty()) st.inputs.resize(n_in);
  if (!st.inputs[m.port].empty() || st.inputs_got >= n_in)
    throw std::logic_error("layer '" + node_.name + "': input " + std::to_string(m.port) + " of micro-batch " +
                           std::to_string(m.micro_batch) + " arrived twice");
  kernels_->adopt(*this, m.x);
  st.inputs[m.port] = std::move(m.x);
  if (++st.inputs_got < n_in) return;  // fan-in: wait for the other inputs of this micro-batch

  value out = kernels_->forward(st.inputs, forward_context{static_cast<std::uint64_t>(m.micro_batch), m.step},
                                m.train, st.st);
  if (!node_.forward_hooks.empty())
    kernels_->with_host(*this, {&out}, [this, ctx = hook_context{node_.name, std::uint64_t(m.micro_batch), m.step,
                                                                 m.train}](std::vector<tensor>& h) {
      detail::enter_user_code();  // hooks are a user's code, built with any -march
      for (auto& hook : node_.forward_hooks) hook(ctx, h[0]);
    });
  st.inputs.clear();
  st.forwarded = true;
  if (m.train) {
    bytes_ += st.st.payload_bytes();
    st.grads.resize(plan_.edge_count());
    peak_stashed_ = std::max(peak_stashed_, mbs_.size());
    peak_bytes_ = std::max(peak_bytes_, bytes_);
  } else {
    mbs_.erase(m.micro_batch);  // evaluation keeps nothing
  }
  if (m.train)
    for (std::size_t e = 0; e < outstanding_.size(); ++e) {
      ++outstanding_[e];
      record_credits(e);
    }
  std::function<void()> evaluated;  // in a stage, evaluation: tell the gate once it left
  if (!m.train && gating_.gate)
    evaluated = [this, mb = m.micro_batch] {
      send(gating_.gate, layer_event{stage_op::forward, false, mb, gating_.piece, index_, bytes_ + pending_bytes_, true});
    };
  emit_across(out_, gating_.output, forward_msg{m.micro_batch, m.step, 0, m.micro_batches, m.train, m.lr, std::move(out)},
              &forward_msg::x, std::move(evaluated));
  if (m.train) report(stage_op::forward, m.micro_batch);
}

void layer_actor::on_backward(backward_msg& m, bool admitted) {
  if (!admitted && m.port < gating_.hold_backward.size() && gating_.hold_backward[m.port]) {
    held_backward_[m.micro_batch].push_back(std::move(m));
    report(stage_op::backward, m.micro_batch, true);
    return;
  }
  auto it = mbs_.find(m.micro_batch);
  if (it == mbs_.end() || !it->second.forwarded)
    throw std::logic_error("layer '" + node_.name + "': backward of micro-batch " + std::to_string(m.micro_batch) +
                           " without its forward");
  auto& st = it->second;
  if (m.port >= st.grads.size() || !st.grads[m.port].empty())
    throw std::logic_error("layer '" + node_.name + "': gradient on edge " + std::to_string(m.port) +
                           " of micro-batch " + std::to_string(m.micro_batch) + " unexpected or repeated");
  kernels_->adopt(*this, m.grad);
  st.grads[m.port] = std::move(m.grad);
  --outstanding_[m.port];
  record_credits(m.port);
  if (++st.grads_got < st.grads.size()) return;  // fan-out: wait for every consumer's gradient

  // Sum in the direct executor's order (consumers in reverse topological order), so the
  // result is the same bits.
  const auto& order = plan_.grad_order;
  value dy = std::move(st.grads[order[0]]);
  for (std::size_t k = 1; k < order.size(); ++k) kernels_->add(dy, st.grads[order[k]]);
  st.grads.clear();

  auto g = kernels_->backward_input(st.st, dy, wanted_);  // B
  if (!node_.backward_hooks.empty()) {  // a backward only ever comes in training
    std::vector<value*> vs{&dy};
    for (auto& v : g) vs.push_back(&v);
    kernels_->with_host(*this, std::move(vs), [this, ctx = hook_context{node_.name, std::uint64_t(m.micro_batch),
                                                                        m.step, true}](std::vector<tensor>& h) {
      std::vector<tensor> gh(std::make_move_iterator(h.begin() + 1), std::make_move_iterator(h.end()));
      detail::enter_user_code();
      for (auto& hook : node_.backward_hooks) hook(ctx, gh, h[0]);
      std::move(gh.begin(), gh.end(), h.begin() + 1);  // what the hooks changed goes on (on the CPU)
    });
  }
  for (std::size_t k = 0; k < grad_.size(); ++k) {
    if (!(wanted_ & (input_mask{1} << k)) || g[k].empty()) continue;
    emit_across(*grad_[k], k < gating_.gradients.size() ? gating_.gradients[k] : crossing::none,
                backward_msg{m.micro_batch, m.step, 0, std::move(g[k])}, &backward_msg::grad);
  }

  // W, in micro-batch order: accumulation order decides the bits of the gradient sum.
  bytes_ -= st.st.payload_bytes();
  pending_bytes_ += st.st.payload_bytes();
  pending_w_.emplace(m.micro_batch, pending_weight{std::move(st.st), std::move(dy)});
  mbs_.erase(it);
  finish_weight_grads();
  report(stage_op::backward, m.micro_batch);
}

void layer_actor::finish_weight_grads() {
  for (auto it = pending_w_.find(next_w_); it != pending_w_.end(); it = pending_w_.find(next_w_)) {
    if (gating_.defer_weight && weight_admitted_.erase(next_w_) == 0) break;  // its W is not admitted yet
    kernels_->backward_weight(it->second.st, it->second.grad);
    pending_bytes_ -= it->second.st.payload_bytes();
    pending_w_.erase(it);
    ++next_w_;
    ++backwards_done_;
  }
  maybe_step();
}

void layer_actor::maybe_step() {
  if (step_micro_batches_ == 0 || backwards_done_ < step_micro_batches_) return;
  const bool params = node_.layer->has_parameters();
  if (params && gating_.reducer) {  // replicas: sum the gradients over the group first
    if (!contributed_) {
      contributed_ = true;
      // On a device the gradients stay there: the group sums them on the device, in
      // stream order after this layer's last W.
      if (auto d = kernels_->device_gradients())
        send(gating_.reducer, device_contribution{step_, gating_.rank, std::move(d)});
      else
        send(gating_.reducer, bus::contribution{step_, gating_.rank, kernels_->gradients()});
    }
    if (!reduced_sum_ && !device_sum_) return;
  }
  if (gating_.defer_step && !step_admitted_) return;
  if (reduced_sum_) kernels_->set_gradients(*reduced_sum_);
  if (device_sum_) kernels_->take_device_sum(std::move(device_sum_));
  step_admitted_ = contributed_ = false;
  reduced_sum_.reset();
  device_sum_.reset();
  kernels_->update(step_, allow_nonfinite_);
  backwards_done_ = 0;
  next_w_ = 0;
  step_open_ = false;
  // On a device the update is enqueued: the coordinator hears of the step once it is done.
  kernels_->when_done(*this, [this, done = node_done{step_, index_}] {
    bump(steps_done_);
    send(coordinator_, done);
  });
  // The next step's forwards that waited for the update (in stream order after it).
  for (auto& m : std::exchange(next_step_, {})) on_forward(m, true);
}

}  // namespace nerve::layers

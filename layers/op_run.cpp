// One micro-batch of an op layer on any op set (`basic_op_run`: forward, then B and W from
// the tape or the layer's own backward), and op layers on the CPU through `basic_layer`.
#include <algorithm>
#include <memory>
#include <stdexcept>

#include "layers/detail/ops_require.hpp"
#include "layers/detail/vector_state.hpp"
#include "layers/ops.hpp"
#include "layers/detail/host_arrays.hpp"

namespace nerve::layers {
// ---- one micro-batch of an op layer ------------------------------------------------------

template <class S>
basic_op_run<S>::basic_op_run(basic_op_layer<S>& l, basic_op_set<S>& set, std::vector<array> inputs,
                              std::vector<array> params, std::size_t parameters, bool train,
                              const forward_context& context)
    : layer_(l), set_(set), inputs_(std::move(inputs)), params_(std::move(params)), parameters_(parameters) {
  detail::ops_require(parameters_ <= params_.size(), l.label() + ": " + std::to_string(parameters_) +
                                                         " parameters among " + std::to_string(params_.size()) +
                                                         " arrays");
  for (const auto& a : inputs_) in_dims_.push_back(a.dims);
  for (auto& a : inputs_) a.id = -1;
  for (auto& p : params_) p.id = -1;
  if (train && !l.custom_backward()) {  // the inputs and parameters are the tape's leaves; buffers are not
    tape_ = std::make_unique<basic_tape<S>>(set);
    for (auto& a : inputs_) a.id = tape_->leaf();
    for (std::size_t j = 0; j < parameters_; ++j) params_[j].id = tape_->leaf();
  }
  basic_ops<S> o(set, tape_.get(), train);
  detail::enter_user_code();  // `compute` is the layer's: a user's, built with any -march
  out_ = l.compute(o, inputs_, params_, keep_, context);
  out_id_ = out_.id;
  out_dims_ = out_.dims;
  // What backward reads stays: the tape's arrays, or what a hand-written backward kept.
  // The inputs go otherwise, so an output that is an input relabelled (Flatten) is
  // the only holder of its memory and moves on without a copy.
  if (!tape_) inputs_.clear();
  if (!train) {
    keep_.clear();
    return;
  }
  for (auto& k : keep_) kept_bytes_ += std::size_t(k.size()) * sizeof(S) * (k.data ? 1 : 0);
  for (auto& a : inputs_) kept_bytes_ += std::size_t(a.size()) * sizeof(S);
}

template <class S>
void basic_op_run<S>::run_tape(const array& dy) {
  if (ran_) return;
  ran_ = true;
  if (!tape_) throw std::logic_error(layer_.label() + ": backward of a forward run in evaluation");
  tape_->backward(out_id_, dy);
  in_grads_.assign(inputs_.size(), array{});
  param_grads_.assign(parameters_, array{});
  for (std::size_t i = 0; i < inputs_.size(); ++i) {
    auto& g = tape_->grad(inputs_[i].id);
    if (g.empty()) continue;
    if (!tape_->owned(inputs_[i].id)) {  // the output gradient passed through: the caller's
      auto c = set_.alloc(g.dims);
      set_.copy(c.size(), g.data, c.data);
      g = std::move(c);
    }
    g.dims = inputs_[i].dims;
    in_grads_[i] = std::move(g);
  }
  for (std::size_t j = 0; j < parameters_; ++j) param_grads_[j] = tape_->grad(params_[j].id);
}

template <class S>
auto basic_op_run<S>::backward_input(const array& dy, input_mask wanted) -> std::vector<array> {
  basic_array<S> shape_of_out{out_dims_, nullptr, nullptr, -1};
  detail::ops_require(dy.size() == shape_of_out.size(), layer_.label() + ": an output gradient of " + dy.shape_string() +
                                                   " for an output of " + shape_of_out.shape_string());
  std::vector<array> out(in_dims_.size());
  if (layer_.custom_backward()) {
    basic_ops<S> o(set_);
    detail::enter_user_code();
    auto g = layer_.grad_input(o, keep_, params_, dy, wanted);
    for (std::size_t i = 0; i < g.size() && i < out.size(); ++i)
      if (wanted & (input_mask{1} << i)) out[i] = std::move(g[i]);
  } else {
    run_tape(dy);  // B may be asked again (the gradient checker does): hand out shares
    for (std::size_t i = 0; i < inputs_.size(); ++i)
      if (wanted & (input_mask{1} << i)) out[i] = in_grads_[i];
  }
  for (std::size_t i = 0; i < in_dims_.size(); ++i) {
    if (!(wanted & (input_mask{1} << i)) || !out[i].empty()) continue;
    out[i] = set_.alloc(in_dims_[i]);  // nothing reached the input: its gradient is zero
    set_.fill(out[i].size(), S(0), out[i].data);
  }
  return out;
}

template <class S>
void basic_op_run<S>::backward_weight(const array& dy, std::span<const array> grads) {
  detail::ops_require(grads.size() == parameters_, layer_.label() + ": " + std::to_string(grads.size()) +
                                                   " gradients for " + std::to_string(parameters_) + " parameters");
  if (layer_.custom_backward()) {
    basic_ops<S> o(set_);
    detail::enter_user_code();
    return layer_.grad_weight(o, keep_, params_, dy, grads);
  }
  run_tape(dy);
  for (std::size_t j = 0; j < grads.size(); ++j) {
    const auto& g = param_grads_[j];
    if (g.empty()) continue;
    detail::ops_require(g.size() == grads[j].size(), layer_.label() + ": a gradient of " + g.shape_string() +
                                                " for a parameter of " + grads[j].shape_string());
    set_.axpy(g.size(), S(1), g.data, grads[j].data);
  }
}

// ---- op layers on the CPU (basic_layer's calls) ------------------------------------------

namespace {

template <class S>
basic_array<S> owning_array(basic_tensor<S> t) {
  auto mem = std::make_shared<basic_tensor<S>>(std::move(t));
  basic_array<S> a{mem->full_shape(), mem->data(), nullptr, -1};
  a.owner = std::move(mem);
  return a;
}

using detail::host_array;
using detail::to_tensor;

/// The layer's parameter values (then its buffers) or gradients, as arrays borrowing them.
template <class S>
std::vector<basic_array<S>> host_parameters(basic_layer<S>& l, bool grads) {
  std::vector<basic_array<S>> out;
  for (auto& p : l.parameters()) {
    auto a = host_array(grads ? *p.grad : *p.value);
    a.dims = p.torch_shape;
    out.push_back(std::move(a));
  }
  if (!grads)
    for (auto& b : l.buffers()) {
      auto a = host_array(*b.value);
      a.dims = b.torch_shape;
      out.push_back(std::move(a));
    }
  return out;
}

/// What an op layer's stash keeps on the CPU: the run (its tape or kept arrays).
template <class S>
struct cpu_run {
  std::unique_ptr<basic_op_run<S>> run;
};

template <class S>
basic_op_run<S>& run_of(const basic_stash<S>& saved, const std::string& label) {
  auto* r = static_cast<cpu_run<S>*>(saved.extra.get());
  if (!r || !r->run) throw std::logic_error(label + ": backward without its forward's stash");
  return *r->run;
}

}  // namespace

template <class S>
auto basic_op_layer<S>::do_forward(std::vector<tensor_type>& inputs, const forward_context& context)
    -> forward_result {
  std::vector<array> in;
  in.reserve(inputs.size());
  for (auto& t : inputs) in.push_back(owning_array(std::move(t)));
  auto run = std::make_unique<basic_op_run<S>>(*this, cpu_op_set<S>(), std::move(in), host_parameters(*this, false),
                                               this->parameters().size(), this->training(), context);
  forward_result r{to_tensor(std::move(run->output())), {}};
  if (this->training()) {
    auto keep = std::make_shared<cpu_run<S>>();
    keep->run = std::move(run);
    r.stash.extra_bytes = keep->run->kept_bytes();
    r.stash.extra = std::move(keep);
  }
  return r;
}

template <class S>
auto basic_op_layer<S>::do_backward_input(const stash_type& saved, const tensor_type& dy, input_mask wanted)
    -> std::vector<tensor_type> {
  auto& run = run_of(saved, this->label());
  auto g = run.backward_input(host_array(const_cast<tensor_type&>(dy)), wanted);
  std::vector<tensor_type> out(g.size());
  for (std::size_t i = 0; i < g.size(); ++i)
    if (!g[i].empty()) {
      out[i] = to_tensor(std::move(g[i]));
      out[i].reshape(saved.input_shapes[i]);
    }
  return out;
}

template <class S>
void basic_op_layer<S>::do_backward_weight(const stash_type& saved, const tensor_type& dy) {
  auto grads = host_parameters(*this, true);
  run_of(saved, this->label()).backward_weight(host_array(const_cast<tensor_type&>(dy)), grads);
}

template class basic_op_run<float>;
template class basic_op_run<double>;
template class basic_op_layer<float>;
template class basic_op_layer<double>;

}  // namespace nerve::layers

#include "layers/optimizer.hpp"

#include "layers/detail/host_arrays.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace nerve::layers {

template <class Scalar>
basic_sgd<Scalar>::basic_sgd(sgd_options o) : basic_optimizer<Scalar>(o.lr), o_(o) {
  if (o.lr < 0 || o.momentum < 0 || o.weight_decay < 0)
    throw std::invalid_argument("SGD: lr, momentum and weight_decay must be non-negative");
  if (o.nesterov && (o.momentum <= 0 || o.dampening != 0))
    throw std::invalid_argument("SGD: Nesterov momentum requires a momentum and zero dampening");
}

template <class Scalar>
void basic_sgd<Scalar>::update(basic_op_set<Scalar>& set, const typename basic_optimizer<Scalar>::parameter& p) {
  sgd_update_args a{this->lr(), o_.momentum, o_.dampening, o_.weight_decay, o_.nesterov, false};
  Scalar* buf = nullptr;
  if (o_.momentum != 0) {
    auto it = momentum_.find(p.name);
    if (it == momentum_.end()) {  // the first step clones d_p into the buffer
      it = momentum_.emplace(p.name, set.alloc(p.value.dims)).first;
      a.first = true;
    }
    buf = it->second.data;
  }
  set.sgd_update(a, p.value.data, p.grad.data, buf, p.value.size());
}

template <class Scalar>
basic_adam<Scalar>::basic_adam(adam_options o, bool decoupled)
    : basic_optimizer<Scalar>(o.lr), o_(o), decoupled_(decoupled) {
  if (o.lr < 0 || o.eps < 0 || o.beta1 < 0 || o.beta1 >= 1 || o.beta2 < 0 || o.beta2 >= 1 || o.weight_decay < 0)
    throw std::invalid_argument("Adam: need lr, eps, weight_decay ≥ 0 and betas in [0, 1)");
}

template <class Scalar>
void basic_adam<Scalar>::update(basic_op_set<Scalar>& set, const typename basic_optimizer<Scalar>::parameter& p) {
  auto it = state_.find(p.name);
  if (it == state_.end()) {
    const auto n = p.value.size();
    moments s{set.alloc(p.value.dims), set.alloc(p.value.dims), 0};
    set.fill(n, Scalar(0), s.m.data);
    set.fill(n, Scalar(0), s.v.data);
    it = state_.emplace(p.name, std::move(s)).first;
  }
  moments& s = it->second;
  ++s.t;
  const adam_update_args a{this->lr(), o_.beta1, o_.beta2, o_.eps, o_.weight_decay, decoupled_, s.t};
  set.adam_update(a, p.value.data, p.grad.data, s.m.data, s.v.data, p.value.size());
}

namespace {

/// Host parameters as op-set parameters (arrays borrowing their tensors).
template <class Scalar>
std::vector<typename basic_optimizer<Scalar>::parameter> on_host(
    std::span<const basic_parameter_ref<Scalar>> params) {
  std::vector<typename basic_optimizer<Scalar>::parameter> out;
  out.reserve(params.size());
  for (const auto& p : params) out.push_back({p.name, detail::host_array(*p.value), detail::host_array(*p.grad)});
  return out;
}

}  // namespace

template <class Scalar>
void basic_optimizer<Scalar>::step(std::span<const parameter_ref> params) {
  const auto ps = on_host(params);
  step(cpu_op_set<Scalar>(), ps);
}

template <class Scalar>
void basic_optimizer<Scalar>::load_state(const basic_optimizer_state<Scalar>& in,
                                         std::span<const parameter_ref> params) {
  const auto ps = on_host(params);
  load_state(in, cpu_op_set<Scalar>(), ps);
}

template <class Scalar>
void basic_optimizer<Scalar>::use(basic_op_set<Scalar>& set) {
  if (set_ && set_ != &set && has_state())
    throw std::logic_error(std::string(kind()) + ": its state is on the " + std::string(set_->name()) +
                           " op set, not the " + std::string(set.name()) + " one");
  set_ = &set;
}

template <class Scalar>
basic_array<Scalar> basic_optimizer<Scalar>::state_like(basic_op_set<Scalar>& set, const parameter& p,
                                                        const std::string& buffer, const std::vector<Scalar>& values) {
  const auto n = p.value.size();
  if (!values.empty() && values.size() != static_cast<std::size_t>(n))
    throw std::invalid_argument("optimizer state: '" + p.name + "." + buffer + "' has " +
                                std::to_string(values.size()) + " values, the parameter " + std::to_string(n));
  auto a = set.alloc(p.value.dims);
  if (values.empty())
    set.fill(n, Scalar(0), a.data);
  else
    set.write(values.data(), a.data, n);
  return a;
}

template <class Scalar>
std::vector<Scalar> basic_optimizer<Scalar>::host_values(const array& a) const {
  std::vector<Scalar> v(static_cast<std::size_t>(a.size()));
  set_->read(a.data, v.data(), a.size());
  return v;
}

namespace {

/// The parameter of `params` named `name`; throws naming the buffer when there is none.
template <class P>
const P& parameter_named(std::span<const P> params, const std::string& name, const std::string& buffer) {
  for (const auto& p : params)
    if (p.name == name) return p;
  throw std::invalid_argument("optimizer state: '" + name + "." + buffer + "' belongs to no parameter here");
}

}  // namespace

template <class Scalar>
void basic_sgd<Scalar>::save_state(basic_optimizer_state<Scalar>& out) const {
  basic_optimizer<Scalar>::save_state(out);
  for (const auto& [name, buf] : momentum_) out.buffers.push_back({name, "momentum_buffer", this->host_values(buf)});
}

template <class Scalar>
void basic_sgd<Scalar>::load_state(const basic_optimizer_state<Scalar>& in, basic_op_set<Scalar>& set,
                                   std::span<const typename basic_optimizer<Scalar>::parameter> params) {
  basic_optimizer<Scalar>::load_state(in, set, params);
  momentum_.clear();
  for (const auto& b : in.buffers) {
    if (b.name != "momentum_buffer")
      throw std::invalid_argument("optimizer state: SGD has no buffer '" + b.name + "' (of '" + b.parameter + "')");
    momentum_.insert_or_assign(b.parameter,
                               this->state_like(set, parameter_named(params, b.parameter, b.name), b.name, b.values));
  }
}

template <class Scalar>
void basic_adam<Scalar>::save_state(basic_optimizer_state<Scalar>& out) const {
  basic_optimizer<Scalar>::save_state(out);
  for (const auto& [name, s] : state_) {
    out.buffers.push_back({name, "exp_avg", this->host_values(s.m)});
    out.buffers.push_back({name, "exp_avg_sq", this->host_values(s.v)});
    out.counters[name + ".step"] = s.t;
  }
}

template <class Scalar>
void basic_adam<Scalar>::load_state(const basic_optimizer_state<Scalar>& in, basic_op_set<Scalar>& set,
                                    std::span<const typename basic_optimizer<Scalar>::parameter> params) {
  basic_optimizer<Scalar>::load_state(in, set, params);
  state_.clear();
  for (const auto& b : in.buffers) {
    if (b.name != "exp_avg" && b.name != "exp_avg_sq")
      throw std::invalid_argument("optimizer state: Adam has no buffer '" + b.name + "' (of '" + b.parameter + "')");
    auto& s = state_[b.parameter];
    (b.name == "exp_avg" ? s.m : s.v) =
        this->state_like(set, parameter_named(params, b.parameter, b.name), b.name, b.values);
    auto t = in.counters.find(b.parameter + ".step");
    s.t = t == in.counters.end() ? 0 : t->second;
  }
  for (auto& [name, s] : state_)
    if (s.m.empty() || s.v.empty())
      throw std::invalid_argument("optimizer state: Adam needs both exp_avg and exp_avg_sq of '" + name + "'");
}

template <class Scalar>
std::unique_ptr<basic_optimizer<Scalar>> make_optimizer(std::string_view name, double lr, double momentum,
                                                        double weight_decay, bool nesterov, double beta2) {
  if (name == "sgd") return std::make_unique<basic_sgd<Scalar>>(sgd_options{lr, momentum, 0.0, weight_decay, nesterov});
  if (name == "adam") return std::make_unique<basic_adam<Scalar>>(adam_options{lr, 0.9, beta2, 1e-8, weight_decay});
  if (name == "adamw") return std::make_unique<basic_adamw<Scalar>>(adam_options{lr, 0.9, beta2, 1e-8, weight_decay});
  throw std::invalid_argument("unknown optimizer '" + std::string(name) + "' (sgd, adam, adamw)");
}

template class basic_optimizer<float>;
template class basic_optimizer<double>;
template class basic_sgd<float>;
template class basic_sgd<double>;
template class basic_adam<float>;
template class basic_adam<double>;
template std::unique_ptr<basic_optimizer<float>> make_optimizer<float>(std::string_view, double, double, double, bool,
                                                                       double);
template std::unique_ptr<basic_optimizer<double>> make_optimizer<double>(std::string_view, double, double, double,
                                                                         bool, double);

}  // namespace nerve::layers

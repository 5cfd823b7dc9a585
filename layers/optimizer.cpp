#include "layers/optimizer.hpp"

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
void basic_sgd<Scalar>::update(const parameter_ref& p) {
  auto w = p.value->matrix().array();
  const auto g = p.grad->matrix().array();
  const Scalar lr = Scalar(-this->lr());
  if (o_.momentum == 0) {
    // No state: one pass, no temporary (the common case; PyTorch's arithmetic is the same).
    if (o_.weight_decay == 0)
      w += lr * g;
    else
      w += lr * (g + Scalar(o_.weight_decay) * w);
    return;
  }
  auto it = momentum_.find(p.name);
  if (it == momentum_.end()) {
    // First step: buf = d_p (a clone, as torch.clone(d_p)).
    basic_tensor<Scalar> buf(p.value->batch(), p.value->sample_shape());
    if (o_.weight_decay == 0)
      buf.matrix().array() = g;
    else
      buf.matrix().array() = g + Scalar(o_.weight_decay) * w;
    it = momentum_.emplace(p.name, std::move(buf)).first;
  } else {
    auto b = it->second.matrix().array();
    if (o_.weight_decay == 0)
      b = b * Scalar(o_.momentum) + Scalar(1 - o_.dampening) * g;
    else
      b = b * Scalar(o_.momentum) + Scalar(1 - o_.dampening) * (g + Scalar(o_.weight_decay) * w);
  }
  const auto b = it->second.matrix().array();
  if (o_.nesterov) {
    if (o_.weight_decay == 0)
      w += lr * (g + Scalar(o_.momentum) * b);
    else
      w += lr * ((g + Scalar(o_.weight_decay) * w) + Scalar(o_.momentum) * b);
  } else {
    w += lr * b;
  }
}

template <class Scalar>
basic_adam<Scalar>::basic_adam(adam_options o, bool decoupled)
    : basic_optimizer<Scalar>(o.lr), o_(o), decoupled_(decoupled) {
  if (o.lr < 0 || o.eps < 0 || o.beta1 < 0 || o.beta1 >= 1 || o.beta2 < 0 || o.beta2 >= 1 || o.weight_decay < 0)
    throw std::invalid_argument("Adam: need lr, eps, weight_decay ≥ 0 and betas in [0, 1)");
}

template <class Scalar>
void basic_adam<Scalar>::update(const parameter_ref& p) {
  auto it = state_.find(p.name);
  if (it == state_.end()) {
    moments s{basic_tensor<Scalar>::zeros(p.value->batch(), p.value->sample_shape()),
              basic_tensor<Scalar>::zeros(p.value->batch(), p.value->sample_shape()), 0};
    it = state_.emplace(p.name, std::move(s)).first;
  }
  moments& s = it->second;
  ++s.t;
  auto w = p.value->matrix().array();
  const double lr = this->lr();
  if (decoupled_) w *= Scalar(1 - lr * o_.weight_decay);
  auto m = s.m.matrix().array();
  auto v = s.v.matrix().array();
  const auto g = p.grad->matrix().array();
  const Scalar b1 = Scalar(o_.beta1), b2 = Scalar(o_.beta2);
  if (!decoupled_ && o_.weight_decay != 0) {
    const auto gd = (g + Scalar(o_.weight_decay) * w).eval();
    m = m * b1 + Scalar(1 - o_.beta1) * gd;
    v = v * b2 + Scalar(1 - o_.beta2) * gd * gd;
  } else {
    m = m * b1 + Scalar(1 - o_.beta1) * g;
    v = v * b2 + Scalar(1 - o_.beta2) * g * g;
  }
  const double bc1 = 1 - std::pow(o_.beta1, double(s.t));
  const double bc2 = 1 - std::pow(o_.beta2, double(s.t));
  const Scalar step_size = Scalar(lr / bc1);
  const Scalar bc2_sqrt = Scalar(std::sqrt(bc2));
  w += Scalar(-1) * step_size * (m / (v.sqrt() / bc2_sqrt + Scalar(o_.eps)));
}

namespace {

/// The parameter `name` of `params`, and its tensor shaped like it from `values`.
template <class Scalar>
basic_tensor<Scalar> shaped_like(std::span<const basic_parameter_ref<Scalar>> params, const std::string& name,
                                 const std::string& buffer, const std::vector<Scalar>& values) {
  for (const auto& p : params)
    if (p.name == name) {
      if (values.size() != static_cast<std::size_t>(p.value->size()))
        throw std::invalid_argument("optimizer state: '" + name + "." + buffer + "' has " +
                                    std::to_string(values.size()) + " values, the parameter " +
                                    std::to_string(p.value->size()));
      basic_tensor<Scalar> t(p.value->batch(), p.value->sample_shape());
      std::copy(values.begin(), values.end(), t.data());
      return t;
    }
  throw std::invalid_argument("optimizer state: '" + name + "." + buffer + "' belongs to no parameter here");
}

template <class Scalar>
std::vector<Scalar> flat(const basic_tensor<Scalar>& t) {
  return {t.data(), t.data() + t.size()};
}

}  // namespace

template <class Scalar>
void basic_sgd<Scalar>::save_state(basic_optimizer_state<Scalar>& out) const {
  basic_optimizer<Scalar>::save_state(out);
  for (const auto& [name, buf] : momentum_) out.buffers.push_back({name, "momentum_buffer", flat(buf)});
}

template <class Scalar>
void basic_sgd<Scalar>::load_state(const basic_optimizer_state<Scalar>& in,
                                   std::span<const typename basic_optimizer<Scalar>::parameter_ref> params) {
  basic_optimizer<Scalar>::load_state(in, params);
  momentum_.clear();
  for (const auto& b : in.buffers) {
    if (b.name != "momentum_buffer")
      throw std::invalid_argument("optimizer state: SGD has no buffer '" + b.name + "' (of '" + b.parameter + "')");
    momentum_.insert_or_assign(b.parameter, shaped_like(params, b.parameter, b.name, b.values));
  }
}

template <class Scalar>
void basic_adam<Scalar>::save_state(basic_optimizer_state<Scalar>& out) const {
  basic_optimizer<Scalar>::save_state(out);
  for (const auto& [name, s] : state_) {
    out.buffers.push_back({name, "exp_avg", flat(s.m)});
    out.buffers.push_back({name, "exp_avg_sq", flat(s.v)});
    out.counters[name + ".step"] = s.t;
  }
}

template <class Scalar>
void basic_adam<Scalar>::load_state(const basic_optimizer_state<Scalar>& in,
                                    std::span<const typename basic_optimizer<Scalar>::parameter_ref> params) {
  basic_optimizer<Scalar>::load_state(in, params);
  state_.clear();
  for (const auto& b : in.buffers) {
    if (b.name != "exp_avg" && b.name != "exp_avg_sq")
      throw std::invalid_argument("optimizer state: Adam has no buffer '" + b.name + "' (of '" + b.parameter + "')");
    auto& s = state_[b.parameter];
    (b.name == "exp_avg" ? s.m : s.v) = shaped_like(params, b.parameter, b.name, b.values);
    auto t = in.counters.find(b.parameter + ".step");
    s.t = t == in.counters.end() ? 0 : t->second;
  }
  for (auto& [name, s] : state_)
    if (s.m.empty() || s.v.empty())
      throw std::invalid_argument("optimizer state: Adam needs both exp_avg and exp_avg_sq of '" + name + "'");
}

template <class Scalar>
std::unique_ptr<basic_optimizer<Scalar>> make_optimizer(std::string_view name, double lr, double momentum,
                                                        double weight_decay, bool nesterov) {
  if (name == "sgd") return std::make_unique<basic_sgd<Scalar>>(sgd_options{lr, momentum, 0.0, weight_decay, nesterov});
  if (name == "adam") return std::make_unique<basic_adam<Scalar>>(adam_options{lr, 0.9, 0.999, 1e-8, weight_decay});
  if (name == "adamw") return std::make_unique<basic_adamw<Scalar>>(adam_options{lr, 0.9, 0.999, 1e-8, weight_decay});
  throw std::invalid_argument("unknown optimizer '" + std::string(name) + "' (sgd, adam, adamw)");
}

template class basic_sgd<float>;
template class basic_sgd<double>;
template class basic_adam<float>;
template class basic_adam<double>;
template std::unique_ptr<basic_optimizer<float>> make_optimizer<float>(std::string_view, double, double, double, bool);
template std::unique_ptr<basic_optimizer<double>> make_optimizer<double>(std::string_view, double, double, double,
                                                                         bool);

}  // namespace nerve::layers

#include "layers/norm.hpp"

#include <algorithm>
#include <stdexcept>

namespace nerve::layers {

// ---- LayerNorm ---------------------------------------------------------------

template <class Scalar>
basic_layer_norm<Scalar>::basic_layer_norm(shape normalized_shape, double eps, bool affine, bool bias)
    : shape_(std::move(normalized_shape)), eps_(eps), affine_(affine), bias_(affine && bias),
      weight_(tensor_type::constant(affine ? 1 : 0, shape_, Scalar(1))),
      weight_grad_(tensor_type::zeros(affine ? 1 : 0, shape_)), b_(tensor_type::zeros(bias_ ? 1 : 0, shape_)),
      b_grad_(tensor_type::zeros(bias_ ? 1 : 0, shape_)) {}

template <class Scalar>
auto basic_layer_norm<Scalar>::parameters() -> std::vector<parameter_ref> {
  std::vector<parameter_ref> p;
  if (affine_) p.push_back({"weight", &weight_, &weight_grad_, shape_.dims()});
  if (bias_) p.push_back({"bias", &b_, &b_grad_, shape_.dims()});
  return p;
}

template <class Scalar>
void basic_layer_norm<Scalar>::reset_parameters(std::mt19937_64&) {
  weight_.matrix().setOnes();
  b_.set_zero();
}

template <class Scalar>
shape basic_layer_norm<Scalar>::infer_shape(std::span<const shape> inputs) const {
  // PyTorch's rule: the sample's trailing dimensions are the normalized shape; any before
  // them (a sequence's tokens) are rows of their own.
  const auto& in = inputs[0].dims();
  const auto& want = shape_.dims();
  if (in.size() < want.size() || !std::equal(want.begin(), want.end(), in.end() - std::ptrdiff_t(want.size()))) {
    const auto text = shape_.to_string();
    throw this->mismatch(0, inputs[0], want.empty() ? text : "[…, " + text.substr(1));
  }
  return inputs[0];
}

template <class Scalar>
auto basic_layer_norm<Scalar>::compute(basic_ops<Scalar>& o, std::span<const array> in, std::span<const array> params,
                                       std::vector<array>& keep, const forward_context&) -> array {
  const array& x = in[0];
  const std::int64_t f = shape_.numel(), n = x.size() / f;  // rows: samples × leading positions
  auto& set = o.set();
  array xhat = o.empty(x.dims), rstd = o.empty({n}), mean = o.empty({n}), var = o.empty({n});
  set.normalize({1, n, f}, x.data, true, mean.data, var.data, eps_, xhat.data, rstd.data);
  array y;
  if (affine_) {
    y = o.empty(x.dims);
    set.channel_affine({n, f, 1}, xhat.data, params[0].data, bias_ ? params[1].data : nullptr, y.data);
  } else {  // x̂ is the output; kept as well, it leaves as a copy
    y = o.training() ? o.clone(xhat) : xhat;
  }
  if (o.training()) {
    keep.push_back(std::move(xhat));
    keep.push_back(std::move(rstd));
  }
  return y;
}

template <class Scalar>
auto basic_layer_norm<Scalar>::grad_input(basic_ops<Scalar>& o, std::span<const array> keep,
                                          std::span<const array> params, const array& dy, input_mask wanted)
    -> std::vector<array> {
  std::vector<array> g(1);
  if (!(wanted & 1)) return g;
  const array &xhat = keep[0], &rstd = keep[1];
  const std::int64_t f = shape_.numel(), n = xhat.size() / f;
  auto& set = o.set();
  const Scalar* dxhat = dy.data;  // dL/dx̂ = dy·weight
  array scaled;
  if (affine_) {
    scaled = o.empty(xhat.dims);
    set.channel_affine({n, f, 1}, dy.data, params[0].data, nullptr, scaled.data);
    dxhat = scaled.data;
  }
  g[0] = o.empty(xhat.dims);
  set.normalize_grad({1, n, f}, xhat.data, rstd.data, dxhat, g[0].data);
  return g;
}

template <class Scalar>
void basic_layer_norm<Scalar>::grad_weight(basic_ops<Scalar>& o, std::span<const array> keep, std::span<const array>,
                                           const array& dy, std::span<const array> grads) {
  if (!affine_) return;
  const std::int64_t f = shape_.numel();
  const norm_geometry per_feature{keep[0].size() / f, f, 1};
  o.set().channel_sums(per_feature, dy.data, keep[0].data, grads[0].data);  // Σ dy·x̂
  if (bias_) o.set().channel_sums(per_feature, dy.data, nullptr, grads[1].data);
}

// ---- BatchNorm ---------------------------------------------------------------

template <class Scalar>
basic_batch_norm<Scalar>::basic_batch_norm(std::int64_t num_features, double eps, double momentum, bool affine)
    : c_(num_features), eps_(eps), momentum_(momentum), affine_(affine),
      weight_(tensor_type::constant(affine ? 1 : 0, {num_features}, Scalar(1))),
      weight_grad_(tensor_type::zeros(affine ? 1 : 0, {num_features})),
      b_(tensor_type::zeros(affine ? 1 : 0, {num_features})),
      b_grad_(tensor_type::zeros(affine ? 1 : 0, {num_features})),
      running_mean_(tensor_type::zeros(1, {num_features})),
      running_var_(tensor_type::constant(1, {num_features}, Scalar(1))) {
  if (num_features <= 0) throw std::invalid_argument("BatchNorm: num_features must be positive");
}

template <class Scalar>
auto basic_batch_norm<Scalar>::parameters() -> std::vector<parameter_ref> {
  if (!affine_) return {};
  return {{"weight", &weight_, &weight_grad_, {c_}}, {"bias", &b_, &b_grad_, {c_}}};
}

template <class Scalar>
auto basic_batch_norm<Scalar>::buffers() -> std::vector<buffer_ref> {
  return {{"running_mean", &running_mean_, {c_}}, {"running_var", &running_var_, {c_}}};
}

template <class Scalar>
void basic_batch_norm<Scalar>::reset_parameters(std::mt19937_64&) {
  weight_.matrix().setOnes();
  b_.set_zero();
  running_mean_.set_zero();
  running_var_.matrix().setOnes();
  batches_tracked_ = 0;
}

template <class Scalar>
shape basic_batch_norm<Scalar>::infer_shape(std::span<const shape> inputs) const {
  const shape& in = inputs[0];
  if (in.rank() < 1 || in.rank() > 3 || in[0] != c_)
    throw this->mismatch(0, in, "[" + std::to_string(c_) + "] or [" + std::to_string(c_) + ", …]");
  return in;
}

template <class Scalar>
norm_geometry basic_batch_norm<Scalar>::channels_of(const std::vector<std::int64_t>& dims) const {
  const array a{dims, nullptr, nullptr, -1};
  return {a.rows(), c_, a.cols() / c_};
}

template <class Scalar>
auto basic_batch_norm<Scalar>::compute(basic_ops<Scalar>& o, std::span<const array> in, std::span<const array> params,
                                       std::vector<array>& keep, const forward_context&) -> array {
  const array& x = in[0];
  const norm_geometry g = channels_of(x.dims);
  const bool train = o.training();
  const array &running_mean = params[affine_ ? 2 : 0], &running_var = params[affine_ ? 3 : 1];
  auto& set = o.set();
  array xhat = o.empty(x.dims), rstd = o.empty({c_});
  if (train) {
    if (g.count() <= 1)
      throw std::invalid_argument(this->label() + ": expected more than 1 value per channel when training, got input " +
                                  x.shape_string());
    array mean = o.empty({c_}), var = o.empty({c_});
    set.normalize(g, x.data, true, mean.data, var.data, eps_, xhat.data, rstd.data);
    // running = (1 − momentum)·running + momentum·batch, the variance unbiased.
    const double unbiased = double(g.count()) / double(g.count() - 1);
    set.scale(c_, Scalar(1.0 - momentum_), running_mean.data);
    set.axpy(c_, Scalar(momentum_), mean.data, running_mean.data);
    set.scale(c_, Scalar(1.0 - momentum_), running_var.data);
    set.axpy(c_, Scalar(momentum_ * unbiased), var.data, running_var.data);
    ++batches_tracked_;
  } else {
    set.normalize(g, x.data, false, running_mean.data, running_var.data, eps_, xhat.data, rstd.data);
  }
  array y;
  if (affine_) {
    y = o.empty(x.dims);
    set.channel_affine(g, xhat.data, params[0].data, params[1].data, y.data);
  } else {  // x̂ is the output; kept as well, it leaves as a copy
    y = train ? o.clone(xhat) : xhat;
  }
  if (train) {
    keep.push_back(std::move(xhat));
    keep.push_back(std::move(rstd));
  }
  return y;
}

template <class Scalar>
auto basic_batch_norm<Scalar>::grad_input(basic_ops<Scalar>& o, std::span<const array> keep,
                                          std::span<const array> params, const array& dy, input_mask wanted)
    -> std::vector<array> {
  std::vector<array> g(1);
  if (!(wanted & 1)) return g;
  const array &xhat = keep[0], &rstd = keep[1];
  const norm_geometry geo = channels_of(xhat.dims);
  auto& set = o.set();
  const Scalar* dxhat = dy.data;  // dL/dx̂ = dy·weight[c]
  array scaled;
  if (affine_) {
    scaled = o.empty(xhat.dims);
    set.channel_affine(geo, dy.data, params[0].data, nullptr, scaled.data);
    dxhat = scaled.data;
  }
  g[0] = o.empty(xhat.dims);
  set.normalize_grad(geo, xhat.data, rstd.data, dxhat, g[0].data);
  return g;
}

template <class Scalar>
void basic_batch_norm<Scalar>::grad_weight(basic_ops<Scalar>& o, std::span<const array> keep, std::span<const array>,
                                           const array& dy, std::span<const array> grads) {
  if (!affine_) return;
  const norm_geometry geo = channels_of(keep[0].dims);
  o.set().channel_sums(geo, dy.data, keep[0].data, grads[0].data);  // Σ dy·x̂
  o.set().channel_sums(geo, dy.data, nullptr, grads[1].data);
}

template class basic_layer_norm<float>;
template class basic_layer_norm<double>;
template class basic_batch_norm<float>;
template class basic_batch_norm<double>;

}  // namespace nerve::layers

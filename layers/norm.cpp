#include "layers/norm.hpp"

#include <cmath>

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
  if (inputs[0] != shape_) throw this->mismatch(0, inputs[0], shape_.to_string());
  return shape_;
}

template <class Scalar>
auto basic_layer_norm<Scalar>::do_forward(std::vector<tensor_type>& inputs, const forward_context&)
    -> forward_result {
  const tensor_type& x = inputs[0];
  const std::int64_t n = x.batch(), f = x.features();
  tensor_type xhat(n, shape_), rstd(n, {1});
  for (std::int64_t s = 0; s < n; ++s) {
    auto row = x.matrix().row(s).array();
    const Scalar mean = row.sum() / Scalar(f);
    const Scalar var = (row - mean).square().sum() / Scalar(f);
    const Scalar r = Scalar(1) / std::sqrt(var + Scalar(eps_));
    xhat.matrix().row(s).array() = (row - mean) * r;
    rstd.data()[s] = r;
  }
  tensor_type y(n, shape_);
  if (affine_) {
    y.matrix().array() = xhat.matrix().array().rowwise() * weight_.matrix().row(0).array();
    if (bias_) y.matrix().array().rowwise() += b_.matrix().row(0).array();
  } else {
    y.matrix() = xhat.matrix();
  }
  return this->with_stash(std::move(y), std::move(xhat), std::move(rstd));
}

template <class Scalar>
auto basic_layer_norm<Scalar>::do_backward_input(const stash_type& saved, const tensor_type& dy, input_mask wanted)
    -> std::vector<tensor_type> {
  std::vector<tensor_type> g(1);
  if (!(wanted & 1)) return g;
  const tensor_type& xhat = saved.tensors[0];
  const tensor_type& rstd = saved.tensors[1];
  const std::int64_t n = dy.batch(), f = dy.features();
  g[0] = tensor_type(n, shape_);
  typename tensor_type::matrix_type gy =
      affine_ ? typename tensor_type::matrix_type(dy.matrix().array().rowwise() * weight_.matrix().row(0).array())
              : dy.matrix();
  for (std::int64_t s = 0; s < n; ++s) {
    auto gr = gy.row(s).array();
    auto xr = xhat.matrix().row(s).array();
    const Scalar mean_g = gr.sum() / Scalar(f);
    const Scalar mean_gx = (gr * xr).sum() / Scalar(f);
    g[0].matrix().row(s).array() = rstd.data()[s] * (gr - mean_g - xr * mean_gx);
  }
  return g;
}

template <class Scalar>
void basic_layer_norm<Scalar>::do_backward_weight(const stash_type& saved, const tensor_type& dy) {
  if (!affine_) return;
  weight_grad_.matrix().row(0) += (dy.matrix().array() * saved.tensors[0].matrix().array()).matrix().colwise().sum();
  if (bias_) b_grad_.matrix().row(0) += dy.matrix().colwise().sum();
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

// Channel c of sample s is the contiguous block [c·S, (c+1)·S) of row s, S = spatial size.
template <class Scalar>
auto basic_batch_norm<Scalar>::do_forward(std::vector<tensor_type>& inputs, const forward_context&)
    -> forward_result {
  const tensor_type& x = inputs[0];
  const std::int64_t n = x.batch(), sp = x.features() / c_, count = n * sp;
  tensor_type xhat(n, x.sample_shape()), rstd(1, {c_}), y(n, x.sample_shape());
  const bool train = this->training();
  if (train && count <= 1)
    throw std::invalid_argument(this->label() + ": expected more than 1 value per channel when training, got input " +
                                x.shape_string());
  for (std::int64_t c = 0; c < c_; ++c) {
    Scalar mean, r;
    if (train) {
      double sum = 0;
      for (std::int64_t s = 0; s < n; ++s)
        for (std::int64_t i = 0; i < sp; ++i) sum += x.row(s)[c * sp + i];
      mean = Scalar(sum / double(count));
      double sq = 0;
      for (std::int64_t s = 0; s < n; ++s)
        for (std::int64_t i = 0; i < sp; ++i) {
          const double d = double(x.row(s)[c * sp + i]) - double(mean);
          sq += d * d;
        }
      const double var = sq / double(count);
      r = Scalar(1.0 / std::sqrt(var + eps_));
      Scalar& rm = running_mean_.data()[c];
      Scalar& rv = running_var_.data()[c];
      rm = Scalar((1.0 - momentum_) * double(rm) + momentum_ * double(mean));
      rv = Scalar((1.0 - momentum_) * double(rv) + momentum_ * var * double(count) / double(count - 1));
    } else {
      mean = running_mean_.data()[c];
      r = Scalar(1.0 / std::sqrt(double(running_var_.data()[c]) + eps_));
    }
    rstd.data()[c] = r;
    const Scalar w = affine_ ? weight_.data()[c] : Scalar(1), b = affine_ ? b_.data()[c] : Scalar(0);
    for (std::int64_t s = 0; s < n; ++s)
      for (std::int64_t i = 0; i < sp; ++i) {
        const Scalar h = (x.row(s)[c * sp + i] - mean) * r;
        xhat.row(s)[c * sp + i] = h;
        y.row(s)[c * sp + i] = h * w + b;
      }
  }
  if (train) ++batches_tracked_;
  auto res = this->with_stash(std::move(y), std::move(xhat), std::move(rstd));
  res.stash.indices.push_back(train ? 1 : 0);
  return res;
}

template <class Scalar>
auto basic_batch_norm<Scalar>::do_backward_input(const stash_type& saved, const tensor_type& dy, input_mask wanted)
    -> std::vector<tensor_type> {
  std::vector<tensor_type> g(1);
  if (!(wanted & 1)) return g;
  const tensor_type& xhat = saved.tensors[0];
  const tensor_type& rstd = saved.tensors[1];
  const bool train = saved.indices[0] != 0;
  const std::int64_t n = dy.batch(), sp = dy.features() / c_, count = n * sp;
  g[0] = tensor_type(n, xhat.sample_shape());
  for (std::int64_t c = 0; c < c_; ++c) {
    const Scalar w = affine_ ? weight_.data()[c] : Scalar(1), r = rstd.data()[c];
    Scalar mean_g = 0, mean_gx = 0;
    if (train) {
      double sg = 0, sgx = 0;
      for (std::int64_t s = 0; s < n; ++s)
        for (std::int64_t i = 0; i < sp; ++i) {
          const double gy = double(dy.row(s)[c * sp + i]) * double(w);
          sg += gy;
          sgx += gy * double(xhat.row(s)[c * sp + i]);
        }
      mean_g = Scalar(sg / double(count));
      mean_gx = Scalar(sgx / double(count));
    }
    for (std::int64_t s = 0; s < n; ++s)
      for (std::int64_t i = 0; i < sp; ++i) {
        const Scalar gy = dy.row(s)[c * sp + i] * w;
        g[0].row(s)[c * sp + i] = r * (gy - mean_g - xhat.row(s)[c * sp + i] * mean_gx);
      }
  }
  return g;
}

template <class Scalar>
void basic_batch_norm<Scalar>::do_backward_weight(const stash_type& saved, const tensor_type& dy) {
  if (!affine_) return;
  const tensor_type& xhat = saved.tensors[0];
  const std::int64_t n = dy.batch(), sp = dy.features() / c_;
  for (std::int64_t c = 0; c < c_; ++c) {
    double sw = 0, sb = 0;
    for (std::int64_t s = 0; s < n; ++s)
      for (std::int64_t i = 0; i < sp; ++i) {
        sw += double(dy.row(s)[c * sp + i]) * double(xhat.row(s)[c * sp + i]);
        sb += double(dy.row(s)[c * sp + i]);
      }
    weight_grad_.data()[c] += Scalar(sw);
    b_grad_.data()[c] += Scalar(sb);
  }
}

template class basic_layer_norm<float>;
template class basic_layer_norm<double>;
template class basic_batch_norm<float>;
template class basic_batch_norm<double>;

}  // namespace nerve::layers

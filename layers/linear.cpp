#include "layers/linear.hpp"

#include "layers/init.hpp"

namespace nerve::layers {

template <class Scalar>
basic_linear<Scalar>::basic_linear(std::int64_t in, std::int64_t out, bool bias)
    : in_(in), out_(out), bias_(bias),
      weight_(tensor_type::zeros(out, {in})), weight_grad_(tensor_type::zeros(out, {in})),
      b_(tensor_type::zeros(bias ? 1 : 0, {out})), b_grad_(tensor_type::zeros(bias ? 1 : 0, {out})) {
  if (in <= 0 || out <= 0)
    throw std::invalid_argument("Linear: features must be positive, got in=" + std::to_string(in) +
                                " out=" + std::to_string(out));
}

template <class Scalar>
auto basic_linear<Scalar>::parameters() -> std::vector<parameter_ref> {
  std::vector<parameter_ref> p{{"weight", &weight_, &weight_grad_, {out_, in_}}};
  if (bias_) p.push_back({"bias", &b_, &b_grad_, {out_}});
  return p;
}

template <class Scalar>
void basic_linear<Scalar>::reset_parameters(std::mt19937_64& rng) {
  default_init(weight_, bias_ ? &b_ : nullptr, in_, rng);
}

template <class Scalar>
shape basic_linear<Scalar>::infer_shape(std::span<const shape> inputs) const {
  const shape& in = inputs[0];
  if (in.rank() < 1 || in[in.rank() - 1] != in_) {
    std::string want = "[…, " + std::to_string(in_) + "]";
    if (in.rank() > 1 && in.numel() == in_) want += " (put a Flatten in front to take " + in.to_string() + " as one vector)";
    throw this->mismatch(0, in, want);
  }
  auto dims = in.dims();
  dims.back() = out_;
  return shape(std::move(dims));
}

namespace {

/// `a` (its last dimension the features) as `[rows, features]`; itself when it is 2-D.
template <class Scalar>
basic_array<Scalar> rows_of(basic_ops<Scalar>& o, const basic_array<Scalar>& a, std::int64_t features) {
  if (a.dims.size() == 2) return a;
  return o.reshape(a, {a.size() / features, features});
}

/// `a`'s rows back under `like`'s leading dimensions, `features` last.
template <class Scalar>
basic_array<Scalar> shaped_as(basic_ops<Scalar>& o, basic_array<Scalar> a, std::vector<std::int64_t> like,
                              std::int64_t features) {
  if (like.size() == 2) return a;
  like.back() = features;
  return o.reshape(a, std::move(like));
}

}  // namespace

template <class Scalar>
auto basic_linear<Scalar>::compute(basic_ops<Scalar>& o, std::span<const array> in, std::span<const array> params,
                                   std::vector<array>& keep, const forward_context&) -> array {
  const auto x = rows_of(o, in[0], in_);
  keep.push_back(x);
  return shaped_as(o, o.linear(x, params[0], bias_ ? params[1] : array{}), in[0].dims, out_);
}

template <class Scalar>
auto basic_linear<Scalar>::grad_input(basic_ops<Scalar>& o, std::span<const array>, std::span<const array> params,
                                      const array& dy, input_mask wanted) -> std::vector<array> {
  std::vector<array> g(1);
  if (wanted & 1) g[0] = shaped_as(o, o.matmul(rows_of(o, dy, out_), params[0]), dy.dims, in_);
  return g;
}

template <class Scalar>
void basic_linear<Scalar>::grad_weight(basic_ops<Scalar>& o, std::span<const array> keep, std::span<const array>,
                                       const array& dy, std::span<const array> grads) {
  const array& x = keep[0];
  const std::int64_t n = x.rows();
  o.set().gemm(trans::yes, trans::no, out_, in_, n, Scalar(1), dy.data, out_, x.data, in_, Scalar(1), grads[0].data,
               in_);
  if (bias_) o.set().column_sums(dy.data, n, out_, grads[1].data, Scalar(1));
}

template class basic_linear<float>;
template class basic_linear<double>;

}  // namespace nerve::layers

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
  if (inputs[0] != shape{in_}) throw this->mismatch(0, inputs[0], shape{in_}.to_string());
  return shape{out_};
}

template <class Scalar>
auto basic_linear<Scalar>::compute(basic_ops<Scalar>& o, std::span<const array> in, std::span<const array> params,
                                   std::vector<array>& keep, const forward_context&) -> array {
  keep.push_back(in[0]);
  return o.linear(in[0], params[0], bias_ ? params[1] : array{});
}

template <class Scalar>
auto basic_linear<Scalar>::grad_input(basic_ops<Scalar>& o, std::span<const array>, std::span<const array> params,
                                      const array& dy, input_mask wanted) -> std::vector<array> {
  std::vector<array> g(1);
  if (wanted & 1) g[0] = o.matmul(dy, params[0]);
  return g;
}

template <class Scalar>
void basic_linear<Scalar>::grad_weight(basic_ops<Scalar>& o, std::span<const array> keep, std::span<const array>,
                                       const array& dy, std::span<const array> grads) {
  const array& x = keep[0];
  const std::int64_t n = dy.rows();
  o.set().gemm(trans::yes, trans::no, out_, in_, n, Scalar(1), dy.data, out_, x.data, in_, Scalar(1), grads[0].data,
               in_);
  if (bias_) o.set().column_sums(dy.data, n, out_, grads[1].data, Scalar(1));
}

template class basic_linear<float>;
template class basic_linear<double>;

}  // namespace nerve::layers

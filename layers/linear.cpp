#include "layers/linear.hpp"

#include "layers/gemm.hpp"
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
auto basic_linear<Scalar>::do_forward(std::vector<tensor_type>& inputs, const forward_context&) -> forward_result {
  tensor_type& x = inputs[0];
  const std::int64_t n = x.batch();
  tensor_type y(n, {out_});
  if (bias_) y.matrix().rowwise() = b_.matrix().row(0);
  gemm<Scalar>(trans::no, trans::yes, n, out_, in_, Scalar(1), x.data(), in_, weight_.data(), in_,
               bias_ ? Scalar(1) : Scalar(0), y.data(), out_);
  return this->with_stash(std::move(y), std::move(x));
}

template <class Scalar>
auto basic_linear<Scalar>::do_backward_input(const stash_type& saved, const tensor_type& dy, input_mask wanted)
    -> std::vector<tensor_type> {
  std::vector<tensor_type> g(1);
  if (!(wanted & 1)) return g;
  const std::int64_t n = dy.batch();
  g[0] = tensor_type(n, {in_});
  gemm<Scalar>(trans::no, trans::no, n, in_, out_, Scalar(1), dy.data(), out_, weight_.data(), in_, Scalar(0),
               g[0].data(), in_);
  return g;
}

template <class Scalar>
void basic_linear<Scalar>::do_backward_weight(const stash_type& saved, const tensor_type& dy) {
  const tensor_type& x = saved.tensors[0];
  const std::int64_t n = dy.batch();
  gemm<Scalar>(trans::yes, trans::no, out_, in_, n, Scalar(1), dy.data(), out_, x.data(), in_, Scalar(1),
               weight_grad_.data(), in_);
  if (bias_) b_grad_.matrix().row(0) += dy.matrix().colwise().sum();
}

template class basic_linear<float>;
template class basic_linear<double>;

}  // namespace nerve::layers

#include "layers/conv2d.hpp"

#include "layers/init.hpp"

namespace nerve::layers {
template <class Scalar>
basic_conv2d<Scalar>::basic_conv2d(const conv2d_options& o)
    : o_(o), ckk_(o.in_channels * o.kernel[0] * o.kernel[1]),
      weight_(tensor_type::zeros(o.out_channels, {o.in_channels, o.kernel[0], o.kernel[1]})),
      weight_grad_(tensor_type::zeros(o.out_channels, {o.in_channels, o.kernel[0], o.kernel[1]})),
      b_(tensor_type::zeros(o.bias ? 1 : 0, {o.out_channels})),
      b_grad_(tensor_type::zeros(o.bias ? 1 : 0, {o.out_channels})) {
  if (o.in_channels <= 0 || o.out_channels <= 0 || o.kernel[0] <= 0 || o.kernel[1] <= 0 || o.stride[0] <= 0 ||
      o.stride[1] <= 0 || o.padding[0] < 0 || o.padding[1] < 0)
    throw std::invalid_argument("Conv2d: channels, kernel and stride must be positive and padding non-negative");
}

template <class Scalar>
auto basic_conv2d<Scalar>::parameters() -> std::vector<parameter_ref> {
  std::vector<parameter_ref> p{
      {"weight", &weight_, &weight_grad_, {o_.out_channels, o_.in_channels, o_.kernel[0], o_.kernel[1]}}};
  if (o_.bias) p.push_back({"bias", &b_, &b_grad_, {o_.out_channels}});
  return p;
}

template <class Scalar>
void basic_conv2d<Scalar>::reset_parameters(std::mt19937_64& rng) {
  default_init(weight_, o_.bias ? &b_ : nullptr, ckk_, rng);
}

template <class Scalar>
shape basic_conv2d<Scalar>::infer_shape(std::span<const shape> inputs) const {
  const shape& in = inputs[0];
  const std::string want = "[" + std::to_string(o_.in_channels) + ", H, W]";
  if (in.rank() != 3 || in[0] != o_.in_channels) throw this->mismatch(0, in, want);
  if (in[1] + 2 * o_.padding[0] < o_.kernel[0] || in[2] + 2 * o_.padding[1] < o_.kernel[1])
    throw this->mismatch(0, in, want + " with H + 2·padding ≥ " + std::to_string(o_.kernel[0]) +
                                    " and W + 2·padding ≥ " + std::to_string(o_.kernel[1]));
  const std::int64_t dims[4] = {1, in[0], in[1], in[2]};
  const auto g = window(dims);
  return shape{o_.out_channels, g.out_h(), g.out_w()};
}

template <class Scalar>
auto basic_conv2d<Scalar>::compute(basic_ops<Scalar>& o, std::span<const array> in, std::span<const array> params,
                                   std::vector<array>& keep, const forward_context&) -> array {
  keep.push_back(in[0]);
  return o.conv2d(in[0], params[0], o_.bias ? params[1] : array{}, o_.stride, o_.padding);
}

template <class Scalar>
auto basic_conv2d<Scalar>::grad_input(basic_ops<Scalar>& o, std::span<const array> keep,
                                      std::span<const array> params, const array& dy, input_mask wanted)
    -> std::vector<array> {
  std::vector<array> g(1);
  if (!(wanted & 1)) return g;
  g[0] = o.empty(keep[0].dims);
  o.set().conv2d_grad_input(window(keep[0].dims), o_.out_channels, params[0].data, dy.data, g[0].data);
  return g;
}

template <class Scalar>
void basic_conv2d<Scalar>::grad_weight(basic_ops<Scalar>& o, std::span<const array> keep, std::span<const array>,
                                       const array& dy, std::span<const array> grads) {
  o.set().conv2d_grad_weight(window(keep[0].dims), o_.out_channels, keep[0].data, dy.data, grads[0].data,
                             o_.bias ? grads[1].data : nullptr);
}

template class basic_conv2d<float>;
template class basic_conv2d<double>;

}  // namespace nerve::layers

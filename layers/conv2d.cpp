#include "layers/conv2d.hpp"

#include "layers/detail/im2col.hpp"
#include "layers/gemm.hpp"
#include "layers/init.hpp"

namespace nerve::layers {
namespace {

detail::conv_geometry geometry(const conv2d_options& o, const shape& in) {
  detail::conv_geometry g{in[0], in[1], in[2], o.kernel[0], o.kernel[1], o.stride[0], o.stride[1],
                          o.padding[0], o.padding[1], 0, 0};
  g.oh = (g.h + 2 * g.ph - g.kh) / g.sh + 1;
  g.ow = (g.w + 2 * g.pw - g.kw) / g.sw + 1;
  return g;
}

}  // namespace

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
  const auto g = geometry(o_, in);
  if (in[1] + 2 * g.ph < g.kh || in[2] + 2 * g.pw < g.kw)
    throw this->mismatch(0, in, want + " with H + 2·padding ≥ " + std::to_string(g.kh) + " and W + 2·padding ≥ " +
                                    std::to_string(g.kw));
  return shape{o_.out_channels, g.oh, g.ow};
}

template <class Scalar>
auto basic_conv2d<Scalar>::do_forward(std::vector<tensor_type>& inputs, const forward_context&) -> forward_result {
  tensor_type& x = inputs[0];
  const auto g = geometry(o_, x.sample_shape());
  const std::int64_t n = x.batch(), ohw = g.oh * g.ow, oc = o_.out_channels;
  tensor_type y(n, {oc, g.oh, g.ow});
  typename tensor_type::matrix_type col(ckk_, ohw);
  for (std::int64_t s = 0; s < n; ++s) {
    detail::im2col(g, x.row(s), col.data());
    Scalar* ys = y.row(s);
    if (o_.bias)
      for (std::int64_t c = 0; c < oc; ++c) std::fill(ys + c * ohw, ys + (c + 1) * ohw, b_.data()[c]);
    gemm<Scalar>(trans::no, trans::no, oc, ohw, ckk_, Scalar(1), weight_.data(), ckk_, col.data(), ohw,
                 o_.bias ? Scalar(1) : Scalar(0), ys, ohw);
  }
  return this->with_stash(std::move(y), std::move(x));
}

template <class Scalar>
auto basic_conv2d<Scalar>::do_backward_input(const stash_type& saved, const tensor_type& dy, input_mask wanted)
    -> std::vector<tensor_type> {
  std::vector<tensor_type> grads(1);
  if (!(wanted & 1)) return grads;
  const tensor_type& x = saved.tensors[0];
  const auto g = geometry(o_, x.sample_shape());
  const std::int64_t n = x.batch(), ohw = g.oh * g.ow, oc = o_.out_channels;
  grads[0] = tensor_type::zeros(n, x.sample_shape());
  typename tensor_type::matrix_type col(ckk_, ohw);
  for (std::int64_t s = 0; s < n; ++s) {
    gemm<Scalar>(trans::yes, trans::no, ckk_, ohw, oc, Scalar(1), weight_.data(), ckk_, dy.row(s), ohw, Scalar(0),
                 col.data(), ohw);
    detail::col2im(g, col.data(), grads[0].row(s));
  }
  return grads;
}

template <class Scalar>
void basic_conv2d<Scalar>::do_backward_weight(const stash_type& saved, const tensor_type& dy) {
  const tensor_type& x = saved.tensors[0];
  const auto g = geometry(o_, x.sample_shape());
  const std::int64_t n = x.batch(), ohw = g.oh * g.ow, oc = o_.out_channels;
  typename tensor_type::matrix_type col(ckk_, ohw);
  for (std::int64_t s = 0; s < n; ++s) {
    detail::im2col(g, x.row(s), col.data());
    gemm<Scalar>(trans::no, trans::yes, oc, ckk_, ohw, Scalar(1), dy.row(s), ohw, col.data(), ohw, Scalar(1),
                 weight_grad_.data(), ckk_);
    if (o_.bias)
      for (std::int64_t c = 0; c < oc; ++c) {
        const Scalar* d = dy.row(s) + c * ohw;
        Scalar acc = 0;
        for (std::int64_t i = 0; i < ohw; ++i) acc += d[i];
        b_grad_.data()[c] += acc;
      }
  }
}

template class basic_conv2d<float>;
template class basic_conv2d<double>;

}  // namespace nerve::layers

#pragma once
/// \file
/// Elementwise activations: ReLU, LeakyReLU, Sigmoid, Tanh, GELU (PyTorch semantics).
/// The built-in ones are written with ops (one `unary` each), so every backend runs
/// them; an activation of a user's own op (`f`, `df`) runs its host code.

#include <algorithm>
#include <cmath>
#include <concepts>

#include "layers/layer.hpp"
#include "layers/ops.hpp"

namespace nerve::layers {

/// Pointwise maths of the activations: `f(x)` and its derivative `df(x)`. Each op
/// has a `kind` (PyTorch's class name).
namespace activation_ops {
struct relu {
  static constexpr unary_fn fn = unary_fn::relu;  ///< the op every backend runs
  static constexpr std::string_view kind = "ReLU";
  template <class S> S f(S x) const { return x > S(0) ? x : S(0); }
  template <class S> S df(S x) const { return x > S(0) ? S(1) : S(0); }
};
struct leaky_relu {
  static constexpr unary_fn fn = unary_fn::leaky_relu;  ///< the op every backend runs
  static constexpr std::string_view kind = "LeakyReLU";
  double negative_slope = 0.01;
  template <class S> S f(S x) const { return x > S(0) ? x : S(negative_slope) * x; }
  template <class S> S df(S x) const { return x > S(0) ? S(1) : S(negative_slope); }
};
struct sigmoid {
  static constexpr unary_fn fn = unary_fn::sigmoid;  ///< the op every backend runs
  static constexpr std::string_view kind = "Sigmoid";
  template <class S> S f(S x) const { return S(1) / (S(1) + std::exp(-x)); }
  template <class S> S df(S x) const { S s = f(x); return s * (S(1) - s); }
};
struct tanh {
  static constexpr unary_fn fn = unary_fn::tanh;  ///< the op every backend runs
  static constexpr std::string_view kind = "Tanh";
  template <class S> S f(S x) const { return std::tanh(x); }
  template <class S> S df(S x) const { S t = std::tanh(x); return S(1) - t * t; }
};
/// The exact GELU, x·Φ(x) (PyTorch's default, approximate='none'). Φ(x) is computed as
/// ½·erfc(−x/√2), not ½·(1 + erf(x/√2)): for x ≪ 0 the sum cancels (erf rounds to −1 and
/// GELU(−6) came out 0 instead of −6e−9), while erfc keeps its relative accuracy; the float
/// form is within 3.5 ulps of the value on the same rounded argument (measured, glibc).
struct gelu {
  static constexpr unary_fn fn = unary_fn::gelu;  ///< the op every backend runs
  static constexpr std::string_view kind = "GELU";
  template <class S> S f(S x) const { return S(0.5) * x * std::erfc(-x * S(0.70710678118654752440)); }
  template <class S> S df(S x) const {
    const S cdf = S(0.5) * std::erfc(-x * S(0.70710678118654752440));
    const S pdf = std::exp(S(-0.5) * x * x) * S(0.39894228040143267794);
    return cdf + x * pdf;
  }
};
}  // namespace activation_ops

/// An op with a `fn` is one of the ops every backend has (`unary_fn`).
template <class Op>
concept backend_unary = requires {
  { Op::fn } -> std::convertible_to<unary_fn>;
};

namespace detail {

/// A user's op: its `f` and `df` on the host (a device runs the layer on the host).
template <class Scalar, class Op, bool = backend_unary<Op>>
class activation_body : public basic_layer<Scalar> {
 public:
  using typename basic_layer<Scalar>::tensor_type;
  using typename basic_layer<Scalar>::stash_type;
  using typename basic_layer<Scalar>::forward_result;

  explicit activation_body(Op op) : op_(op) {}
  std::string_view kind() const noexcept override { return Op::kind; }
  const Op& op() const noexcept { return op_; }

 protected:
  shape infer_shape(std::span<const shape> inputs) const override { return inputs[0]; }
  forward_result do_forward(std::vector<tensor_type>& inputs, const forward_context&) override {
    tensor_type& x = inputs[0];
    tensor_type y(x.batch(), x.sample_shape());
    std::transform(x.data(), x.data() + x.size(), y.data(), [this](Scalar v) { return op_.f(v); });
    return this->with_stash(std::move(y), std::move(x));
  }
  std::vector<tensor_type> do_backward_input(const stash_type& saved, const tensor_type& dy,
                                             input_mask wanted) override {
    std::vector<tensor_type> g(1);
    if (!(wanted & 1)) return g;
    const tensor_type& x = saved.tensors[0];
    g[0] = tensor_type(x.batch(), x.sample_shape());
    const Scalar* px = x.data();
    const Scalar* pdy = dy.data();
    Scalar* pdx = g[0].data();
    const std::int64_t n = x.size();
    for (std::int64_t i = 0; i < n; ++i) pdx[i] = pdy[i] * op_.df(px[i]);
    return g;
  }

 private:
  Op op_;
};

/// A built-in op: one `unary` of the ops, its derivative from the tape.
template <class Scalar, class Op>
class activation_body<Scalar, Op, true> : public basic_op_layer<Scalar> {
 public:
  using typename basic_op_layer<Scalar>::array;

  explicit activation_body(Op op) : op_(op) {}
  std::string_view kind() const noexcept override { return Op::kind; }
  const Op& op() const noexcept { return op_; }
  array compute(basic_ops<Scalar>& o, std::span<const array> in, std::span<const array>, std::vector<array>&,
                const forward_context&) override {
    if constexpr (requires { op_.negative_slope; }) return o.unary(Op::fn, in[0], Scalar(op_.negative_slope));
    else return o.unary(Op::fn, in[0]);
  }

 protected:
  shape infer_shape(std::span<const shape> inputs) const override { return inputs[0]; }

 private:
  Op op_;
};

}  // namespace detail

/// A stateless elementwise layer: y = f(x), dx = dy ⊙ f'(x). Any shape; what backward
/// needs (the input, or the output of Sigmoid and Tanh) is kept per micro-batch.
template <class Scalar, class Op>
class basic_activation final : public detail::activation_body<Scalar, Op> {
 public:
  explicit basic_activation(Op op = {}) : detail::activation_body<Scalar, Op>(op) {}
};

template <class S> using basic_relu = basic_activation<S, activation_ops::relu>;
template <class S> using basic_sigmoid = basic_activation<S, activation_ops::sigmoid>;
template <class S> using basic_tanh = basic_activation<S, activation_ops::tanh>;
template <class S> using basic_gelu = basic_activation<S, activation_ops::gelu>;
/// LeakyReLU: `leaky_relu(activation_ops::leaky_relu{0.2})` for slope 0.2 (default 0.01).
template <class S> using basic_leaky_relu = basic_activation<S, activation_ops::leaky_relu>;

using relu = basic_relu<float>;
using leaky_relu = basic_leaky_relu<float>;
using sigmoid = basic_sigmoid<float>;
using tanh_layer = basic_tanh<float>;  ///< `tanh` would hide std::tanh inside the namespace
using gelu = basic_gelu<float>;

}  // namespace nerve::layers

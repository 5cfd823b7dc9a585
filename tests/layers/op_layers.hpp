#pragma once
// Layers written with ops only, as a user's project would (layers/ops.hpp): the tests
// run them on the CPU, on the stand-in and inside pipelines.

#include <random>

#include "layers/init.hpp"
#include "layers/ops.hpp"

namespace nerve::layers::testing {

/// Swish-β, x·σ(β·x) with a learnable β (one scalar). `hand_written`: the backward is
/// written by hand with the same arithmetic the tape derives; otherwise the tape's.
template <class S>
class basic_swish final : public basic_op_layer<S> {
  using base = basic_op_layer<S>;

 public:
  using typename base::array;
  using typename base::tensor_type;
  using typename base::parameter_ref;

  basic_swish(double beta, bool hand_written)
      : beta_(tensor_type::constant(1, {1}, S(beta))), grad_(tensor_type::zeros(1, {1})), hand_(hand_written) {}
  std::string_view kind() const noexcept override { return "Swish"; }
  std::vector<parameter_ref> parameters() override { return {{"beta", &beta_, &grad_, {1}}}; }
  bool custom_backward() const noexcept override { return hand_; }
  S beta_grad() const { return grad_.data()[0]; }

 private:
  /// dt = σ'(t)·(dy·x), the gradient at the gate's input.
  static array gate_gradient(basic_op_set<S>& set, const array& x, const array& t, const array& s, const array& dy) {
    const auto n = x.size();
    auto ds = set.alloc(x.dims);
    set.binary(binary_fn::mul, dy.data, x.data, ds.data, n);
    auto dt = set.alloc(x.dims);
    set.unary_grad(unary_fn::sigmoid, t.data, s.data, ds.data, dt.data, n, S(0.01));
    return dt;
  }

 public:

  array compute(basic_ops<S>& o, std::span<const array> in, std::span<const array> p, std::vector<array>& keep,
                const forward_context&) override {
    const array& x = in[0];
    auto t = o.mul_row(x, p[0]);  // β·x
    auto s = o.sigmoid(t);
    auto y = o.mul(x, s);
    if (hand_) keep = {x, t, s};
    return y;
  }
  // B and W each from the kept x, t = β·x and s = σ(t); the arithmetic the tape does.
  std::vector<array> grad_input(basic_ops<S>& o, std::span<const array> keep, std::span<const array> p,
                                const array& dy, input_mask) override {
    auto& set = o.set();
    const array &x = keep[0], &t = keep[1], &s = keep[2];
    const auto n = x.size();
    auto gx = set.alloc(x.dims);  // y = x·s: dx = dy·s, ds = dy·x
    set.binary(binary_fn::mul, dy.data, s.data, gx.data, n);
    auto dt = gate_gradient(set, x, t, s, dy);
    auto g2 = set.alloc(x.dims);  // t = β·x: dx += dt·β
    set.broadcast(binary_fn::mul, dt.data, p[0].data, g2.data, n, 1);
    set.axpy(n, S(1), g2.data, gx.data);
    std::vector<array> g;
    g.push_back(std::move(gx));
    return g;
  }
  void grad_weight(basic_ops<S>& o, std::span<const array> keep, std::span<const array>, const array& dy,
                   std::span<const array> grads) override {
    auto& set = o.set();
    const array &x = keep[0], &t = keep[1], &s = keep[2];
    const auto n = x.size();
    auto dt = gate_gradient(set, x, t, s, dy);
    auto prod = set.alloc(x.dims);  // dβ = Σ dt·x
    set.binary(binary_fn::mul, dt.data, x.data, prod.data, n);
    auto gb = set.alloc({1});
    set.column_sums(prod.data, n, 1, gb.data, S(0));
    set.axpy(1, S(1), gb.data, grads[0].data);
  }

 protected:
  shape infer_shape(std::span<const shape> inputs) const override { return inputs[0]; }

 private:
  tensor_type beta_, grad_;
  bool hand_;
};
using swish = basic_swish<float>;

/// PyTorch's Linear from ops: x·Wᵀ + b.
template <class S>
class basic_op_linear final : public basic_op_layer<S> {
  using base = basic_op_layer<S>;

 public:
  using typename base::array;
  using typename base::tensor_type;
  using typename base::parameter_ref;

  basic_op_linear(std::int64_t in, std::int64_t out)
      : in_(in), out_(out), w_(tensor_type::zeros(out, {in})), gw_(tensor_type::zeros(out, {in})),
        b_(tensor_type::zeros(1, {out})), gb_(tensor_type::zeros(1, {out})) {}
  std::string_view kind() const noexcept override { return "OpLinear"; }
  std::vector<parameter_ref> parameters() override {
    return {{"weight", &w_, &gw_, {out_, in_}}, {"bias", &b_, &gb_, {out_}}};
  }
  void reset_parameters(std::mt19937_64& rng) override { default_init(w_, &b_, in_, rng); }
  tensor_type& weight() { return w_; }
  tensor_type& bias() { return b_; }

  array compute(basic_ops<S>& o, std::span<const array> in, std::span<const array> p, std::vector<array>&,
                const forward_context&) override {
    return o.linear(in[0], p[0], p[1]);
  }

 protected:
  shape infer_shape(std::span<const shape> inputs) const override {
    if (inputs[0] != shape{in_}) throw this->mismatch(0, inputs[0], shape{in_}.to_string());
    return shape{out_};
  }

 private:
  std::int64_t in_, out_;
  tensor_type w_, gw_, b_, gb_;
};
using op_linear = basic_op_linear<float>;

}  // namespace nerve::layers::testing

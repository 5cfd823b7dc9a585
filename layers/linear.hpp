#pragma once
/// \file
/// `basic_linear`: y = x·Wᵀ + b, PyTorch's `nn.Linear`.

#include "layers/ops.hpp"

namespace nerve::layers {

/// A fully connected layer. Weight `[out, in]` (PyTorch layout, row-major), bias
/// `[out]`. Input `[…, in]` per sample, as PyTorch's: the last dimension is the
/// features, any before it are rows of their own (a sequence's tokens: `[T, in]` gives
/// `[T, out]`). An image `[C, H, W]` is not taken as one vector: put a Flatten in front.
///
/// Written once with ops, for every backend: forward is one product with the bias fused
/// (`ops::linear`) over the `[rows, in]` view. B: dx = dy·W. W: dW += dyᵀ·x, db += Σ dy,
/// straight into the gradients. It keeps the input (moved in, never copied).
template <class Scalar>
class basic_linear final : public basic_op_layer<Scalar> {
 public:
  using typename basic_layer<Scalar>::tensor_type;
  using typename basic_layer<Scalar>::parameter_ref;
  using typename basic_op_layer<Scalar>::array;

  /// `in` → `out` features, with or without a bias. Parameters start at zero;
  /// `reset_parameters` (called by the graph builder) draws PyTorch's default.
  basic_linear(std::int64_t in, std::int64_t out, bool bias = true);

  std::string_view kind() const noexcept override { return "Linear"; }
  std::vector<parameter_ref> parameters() override;
  void reset_parameters(std::mt19937_64& rng) override;

  std::int64_t in_features() const noexcept { return in_; }
  std::int64_t out_features() const noexcept { return out_; }
  bool has_bias() const noexcept { return bias_; }
  tensor_type& weight() noexcept { return weight_; }
  tensor_type& bias() noexcept { return b_; }
  tensor_type& weight_grad() noexcept { return weight_grad_; }
  tensor_type& bias_grad() noexcept { return b_grad_; }

  array compute(basic_ops<Scalar>& o, std::span<const array> in, std::span<const array> params,
                std::vector<array>& keep, const forward_context& context) override;
  bool custom_backward() const noexcept override { return true; }
  std::vector<array> grad_input(basic_ops<Scalar>& o, std::span<const array> keep, std::span<const array> params,
                                const array& dy, input_mask wanted) override;
  void grad_weight(basic_ops<Scalar>& o, std::span<const array> keep, std::span<const array> params,
                   const array& dy, std::span<const array> grads) override;

 protected:
  shape infer_shape(std::span<const shape> inputs) const override;

 private:
  std::int64_t in_, out_;
  bool bias_;
  tensor_type weight_, weight_grad_, b_, b_grad_;
};

using linear = basic_linear<float>;

}  // namespace nerve::layers

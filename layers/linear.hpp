#pragma once
/// \file
/// `basic_linear`: y = x·Wᵀ + b, PyTorch's `nn.Linear`.

#include "layers/layer.hpp"

namespace nerve::layers {

/// A fully connected layer. Weight `[out, in]` (PyTorch layout, row-major), bias
/// `[out]`. Input `[in]` per sample (anything with `in` scalars per sample is
/// rejected unless its shape is exactly `[in]`: put a Flatten in front of images).
///
/// Forward fuses the bias into the product (the output starts as the broadcast
/// bias and the GEMM accumulates onto it). B: dx = dy·W. W: dW += dyᵀ·x, db += Σ dy.
/// The stash holds the input (moved in, never copied).
template <class Scalar>
class basic_linear final : public basic_layer<Scalar> {
 public:
  using typename basic_layer<Scalar>::tensor_type;
  using typename basic_layer<Scalar>::stash_type;
  using typename basic_layer<Scalar>::forward_result;
  using typename basic_layer<Scalar>::parameter_ref;

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

 protected:
  shape infer_shape(std::span<const shape> inputs) const override;
  forward_result do_forward(std::vector<tensor_type>& inputs, const forward_context& context) override;
  std::vector<tensor_type> do_backward_input(const stash_type& saved, const tensor_type& grad_output,
                                             input_mask wanted) override;
  void do_backward_weight(const stash_type& saved, const tensor_type& grad_output) override;

 private:
  std::int64_t in_, out_;
  bool bias_;
  tensor_type weight_, weight_grad_, b_, b_grad_;
};

using linear = basic_linear<float>;

}  // namespace nerve::layers

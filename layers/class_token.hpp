#pragma once
/// \file
/// A ViT's class token: `basic_class_token` prepends it, `basic_select_token` takes one
/// token out for the classifier.

#include "layers/ops.hpp"

namespace nerve::layers {

/// Prepends a learned token to each sample: `[T, dim]` → `[T + 1, dim]`, the token first
/// (a ViT's `cls`, `[1, 1, dim]`; PyTorch: `torch.cat([cls.expand(B, -1, -1), x], dim=1)`).
/// It starts at zeros, as torchvision's `VisionTransformer` class token.
///
/// Written once with ops: the token broadcast over the batch (`add_row`) and `concat_cols`;
/// the tape sums its gradient over the batch.
template <class Scalar>
class basic_class_token final : public basic_op_layer<Scalar> {
 public:
  using typename basic_layer<Scalar>::tensor_type;
  using typename basic_layer<Scalar>::parameter_ref;
  using typename basic_op_layer<Scalar>::array;

  /// Throws `std::invalid_argument` unless `dim` is positive.
  explicit basic_class_token(std::int64_t dim);

  std::string_view kind() const noexcept override { return "ClassToken"; }
  std::vector<parameter_ref> parameters() override;
  void reset_parameters(std::mt19937_64& rng) override;
  tensor_type& weight() noexcept { return weight_; }
  tensor_type& weight_grad() noexcept { return weight_grad_; }

  array compute(basic_ops<Scalar>& o, std::span<const array> in, std::span<const array> params,
                std::vector<array>& keep, const forward_context& context) override;

 protected:
  shape infer_shape(std::span<const shape> inputs) const override;

 private:
  std::int64_t dim_;
  tensor_type weight_, weight_grad_;
};

/// Takes token `index` of `[T, C]` samples: `[C]` (PyTorch: `x[:, index]`), the class
/// token (0) for a ViT's head. Backward puts the gradient in that token's row, zeros in
/// the others. An index not below T is a shape error at wiring.
///
/// Written once with ops: `slice_cols` of the `[B, T·C]` view.
template <class Scalar>
class basic_select_token final : public basic_op_layer<Scalar> {
 public:
  using typename basic_op_layer<Scalar>::array;

  /// Throws `std::invalid_argument` for a negative index.
  explicit basic_select_token(std::int64_t index = 0);

  std::string_view kind() const noexcept override { return "SelectToken"; }
  std::int64_t index() const noexcept { return index_; }

  array compute(basic_ops<Scalar>& o, std::span<const array> in, std::span<const array> params,
                std::vector<array>& keep, const forward_context& context) override;

 protected:
  shape infer_shape(std::span<const shape> inputs) const override;

 private:
  std::int64_t index_;
};

using class_token = basic_class_token<float>;
using select_token = basic_select_token<float>;

}  // namespace nerve::layers

#pragma once
/// \file
/// Fan-in layers: `basic_add` (residual join) and `basic_concat`.

#include "layers/layer.hpp"
#include "layers/ops.hpp"

namespace nerve::layers {

/// Sums its n ≥ 2 inputs, which must all have the same shape (a residual join).
/// Each input's gradient is the output gradient. Empty stash.
template <class Scalar>
class basic_add final : public basic_op_layer<Scalar> {
 public:
  using typename basic_op_layer<Scalar>::array;

  std::string_view kind() const noexcept override { return "Add"; }
  std::size_t min_inputs() const noexcept override { return 2; }
  std::size_t max_inputs() const noexcept override { return 64; }
  /// x₀ + x₁ + …, added in input order; every input's gradient is the output's.
  array compute(basic_ops<Scalar>& o, std::span<const array> in, std::span<const array>, std::vector<array>&,
                const forward_context&) override;

 protected:
  shape infer_shape(std::span<const shape> inputs) const override;
};

/// Concatenates n ≥ 2 inputs along the first sample dimension (features of
/// `[F]` samples, channels of `[C, H, W]` samples, as `torch.cat(dim=1)`); the
/// other dimensions must agree. Per sample that is a concatenation of rows: one
/// strided copy per input (`ops::concat_cols`) each way. It keeps only the shapes.
template <class Scalar>
class basic_concat final : public basic_op_layer<Scalar> {
 public:
  using typename basic_op_layer<Scalar>::array;

  std::string_view kind() const noexcept override { return "Concat"; }
  std::size_t min_inputs() const noexcept override { return 2; }
  std::size_t max_inputs() const noexcept override { return 64; }
  array compute(basic_ops<Scalar>& o, std::span<const array> in, std::span<const array>, std::vector<array>& keep,
                const forward_context&) override;
  bool custom_backward() const noexcept override { return true; }
  std::vector<array> grad_input(basic_ops<Scalar>& o, std::span<const array> keep, std::span<const array>,
                                const array& dy, input_mask wanted) override;

 protected:
  shape infer_shape(std::span<const shape> inputs) const override;
};

using add = basic_add<float>;
using concat = basic_concat<float>;

}  // namespace nerve::layers

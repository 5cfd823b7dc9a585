#pragma once
/// \file
/// `basic_patch_embedding`: images to a sequence of patch vectors, a ViT's first layer.

#include "layers/ops.hpp"

namespace nerve::layers {

/// Cuts `[C, H, W]` images into `patch × patch` squares and maps each to `dim` features:
/// `[(H/patch)·(W/patch), dim]`, the patches in row-major order. Weight `[dim,
/// C·patch²]` (a patch's values by channel, then row-major), bias `[dim]`: a ViT's
/// `patch.weight` and `patch.bias`. PyTorch's equivalent is `nn.Conv2d(C, dim, patch,
/// stride=patch)` followed by `.flatten(2).transpose(1, 2)`, whose weight reshaped to
/// `[dim, C·patch²]` is this one; it starts as that Conv2d does (Kaiming-uniform, fan-in
/// C·patch²). H or W not a multiple of `patch`, or another channel count, is a shape
/// error at wiring.
///
/// Written once with ops: `patchify` (a permutation), then the per-token Linear product
/// with the bias fused; the tape gives the gradients (the input's through the inverse
/// permutation).
template <class Scalar>
class basic_patch_embedding final : public basic_op_layer<Scalar> {
 public:
  using typename basic_layer<Scalar>::tensor_type;
  using typename basic_layer<Scalar>::parameter_ref;
  using typename basic_op_layer<Scalar>::array;

  /// Throws `std::invalid_argument` unless all are positive.
  basic_patch_embedding(std::int64_t patch, std::int64_t dim, std::int64_t channels = 1);

  std::string_view kind() const noexcept override { return "PatchEmbedding"; }
  std::vector<parameter_ref> parameters() override;
  void reset_parameters(std::mt19937_64& rng) override;
  std::int64_t patch() const noexcept { return patch_; }
  tensor_type& weight() noexcept { return weight_; }
  tensor_type& bias() noexcept { return b_; }
  tensor_type& weight_grad() noexcept { return weight_grad_; }
  tensor_type& bias_grad() noexcept { return b_grad_; }

  array compute(basic_ops<Scalar>& o, std::span<const array> in, std::span<const array> params,
                std::vector<array>& keep, const forward_context& context) override;

 protected:
  shape infer_shape(std::span<const shape> inputs) const override;

 private:
  std::int64_t patch_, dim_, channels_;
  tensor_type weight_, weight_grad_, b_, b_grad_;
};

using patch_embedding = basic_patch_embedding<float>;

}  // namespace nerve::layers

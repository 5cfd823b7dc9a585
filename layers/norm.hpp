#pragma once
/// \file
/// LayerNorm and BatchNorm (PyTorch semantics).

#include "layers/ops.hpp"

namespace nerve::layers {

/// Normalises over the sample's trailing dimensions that are `normalized_shape`
/// (PyTorch's `nn.LayerNorm`: `[…, F]` with `normalized_shape` `[F]` normalises each of a
/// sequence's tokens on its own), biased variance, then an elementwise affine map. Weight
/// (ones) and bias (zeros) have the normalized shape.
///
/// Written once with ops, for every backend: the statistics with `normalize` over
/// `[1, rows, features]` (a channel per row: a sample, or a token of one), the affine map
/// with `channel_affine` over `[rows, features, 1]`. It keeps x̂ and 1/σ per row.
template <class Scalar>
class basic_layer_norm final : public basic_op_layer<Scalar> {
 public:
  using typename basic_layer<Scalar>::tensor_type;
  using typename basic_layer<Scalar>::parameter_ref;
  using typename basic_op_layer<Scalar>::array;

  explicit basic_layer_norm(shape normalized_shape, double eps = 1e-5, bool affine = true, bool bias = true);
  std::string_view kind() const noexcept override { return "LayerNorm"; }
  std::vector<parameter_ref> parameters() override;
  void reset_parameters(std::mt19937_64& rng) override;
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
  shape shape_;
  double eps_;
  bool affine_, bias_;
  tensor_type weight_, weight_grad_, b_, b_grad_;
};

/// Batch normalisation over the batch and the spatial positions of each channel:
/// `[C]` samples (BatchNorm1d) or `[C, H, W]` / `[C, L]` (BatchNorm2d / 1d).
///
/// Training normalises with the batch statistics (biased variance) and updates
/// the running statistics as PyTorch: `running = (1 − momentum)·running +
/// momentum·batch`, with the *unbiased* variance for `running_var`; evaluation
/// uses the running statistics. Each micro-batch is normalised with its own
/// statistics, exactly as PyTorch does when it is fed micro-batches, so
/// accumulation over micro-batches is not the same as one large batch here.
/// Buffers: `running_mean`, `running_var` (PyTorch also keeps
/// `num_batches_tracked`, available from `batches_tracked()`).
///
/// Written once with ops, for every backend: `normalize` and `channel_affine` over
/// `[N, C, H·W]`; the running statistics are buffers, so a device keeps and updates
/// them where it runs the layer (and hands them back with the parameters). It keeps x̂
/// and 1/σ per channel.
template <class Scalar>
class basic_batch_norm final : public basic_op_layer<Scalar> {
 public:
  using typename basic_layer<Scalar>::tensor_type;
  using typename basic_layer<Scalar>::parameter_ref;
  using typename basic_layer<Scalar>::buffer_ref;
  using typename basic_op_layer<Scalar>::array;

  explicit basic_batch_norm(std::int64_t num_features, double eps = 1e-5, double momentum = 0.1,
                            bool affine = true);
  std::string_view kind() const noexcept override { return "BatchNorm"; }
  std::vector<parameter_ref> parameters() override;
  std::vector<buffer_ref> buffers() override;
  void reset_parameters(std::mt19937_64& rng) override;
  tensor_type& weight() noexcept { return weight_; }
  tensor_type& bias() noexcept { return b_; }
  tensor_type& weight_grad() noexcept { return weight_grad_; }
  tensor_type& bias_grad() noexcept { return b_grad_; }
  tensor_type& running_mean() noexcept { return running_mean_; }
  tensor_type& running_var() noexcept { return running_var_; }
  std::int64_t batches_tracked() const noexcept { return batches_tracked_; }

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
  /// `dims` (`[N, C, …]`) as `[N, C, H·W]`.
  norm_geometry channels_of(const std::vector<std::int64_t>& dims) const;
  std::int64_t c_;
  double eps_, momentum_;
  bool affine_;
  tensor_type weight_, weight_grad_, b_, b_grad_, running_mean_, running_var_;
  std::int64_t batches_tracked_ = 0;
};

using layer_norm = basic_layer_norm<float>;
using batch_norm = basic_batch_norm<float>;

}  // namespace nerve::layers

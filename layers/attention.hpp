#pragma once
/// \file
/// `basic_multihead_attention`: multi-head self-attention over a sequence's tokens, the
/// layout of a GPT's or a ViT's block (one fused qkv projection, then the output one).

#include "layers/ops.hpp"

namespace nerve::layers {

/// Self-attention of `[T, C]` samples (a batch is `[B, T, C]`) with `heads` heads of
/// `D = C / heads` features each, as this PyTorch module computes it:
///
/// ```
///   q, k, v = self.qkv(x).split(C, dim=-1)                        # qkv: Linear(C, 3C)
///   q, k, v = (t.view(B, T, heads, D).transpose(1, 2) for t in (q, k, v))
///   att = (q @ k.transpose(-2, -1)) * (1 / sqrt(D))                # causal: masked_fill of j > i with −inf
///   y = (att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)
///   return self.proj(y)                                            # proj: Linear(C, C)
/// ```
///
/// Parameters `qkv.weight` (`[3C, C]`: q's rows, then k's, then v's, each's heads
/// contiguous), `qkv.bias` (`[3C]`), `proj.weight` (`[C, C]`), `proj.bias` (`[C]`).
/// With `causal`, token i attends to tokens 0…i only. The softmax subtracts each row's
/// maximum, so no finite input overflows, and a row with nothing to attend to is zeros.
///
/// Written once with ops, for every backend: the two projections are `linear`s over the
/// `[B·T, ·]` rows, the heads are split and merged by permutation, the scores and the
/// weighted values are batched products over the `B·heads` matrices. Backward comes from
/// the tape (each op's derivative), which keeps the projections' inputs, the split heads
/// and the attention weights (`[B, heads, T, T]`).
template <class Scalar>
class basic_multihead_attention final : public basic_op_layer<Scalar> {
 public:
  using typename basic_layer<Scalar>::tensor_type;
  using typename basic_layer<Scalar>::parameter_ref;
  using typename basic_op_layer<Scalar>::array;

  /// `dim` features (C) in `heads` heads; throws `std::invalid_argument` when either is
  /// not positive or C is not a multiple of `heads`. Parameters start at zero;
  /// `reset_parameters` draws PyTorch's `Linear` default for both projections.
  basic_multihead_attention(std::int64_t dim, std::int64_t heads, bool causal = false);

  std::string_view kind() const noexcept override { return "MultiheadAttention"; }
  std::vector<parameter_ref> parameters() override;
  void reset_parameters(std::mt19937_64& rng) override;

  std::int64_t dim() const noexcept { return dim_; }
  std::int64_t heads() const noexcept { return heads_; }
  std::int64_t head_dim() const noexcept { return dim_ / heads_; }
  bool causal() const noexcept { return causal_; }
  tensor_type& qkv_weight() noexcept { return qkv_w_; }
  tensor_type& qkv_bias() noexcept { return qkv_b_; }
  tensor_type& proj_weight() noexcept { return proj_w_; }
  tensor_type& proj_bias() noexcept { return proj_b_; }

  array compute(basic_ops<Scalar>& o, std::span<const array> in, std::span<const array> params,
                std::vector<array>& keep, const forward_context& context) override;

 protected:
  shape infer_shape(std::span<const shape> inputs) const override;

 private:
  std::int64_t dim_, heads_;
  bool causal_;
  tensor_type qkv_w_, qkv_w_grad_, qkv_b_, qkv_b_grad_, proj_w_, proj_w_grad_, proj_b_, proj_b_grad_;
};

using multihead_attention = basic_multihead_attention<float>;

}  // namespace nerve::layers

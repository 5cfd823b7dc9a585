#pragma once
/// \file
/// Token and position embeddings: `basic_embedding` (PyTorch's `nn.Embedding`) and
/// `basic_positional_embedding` (a learned `[1, T, D]` added to every sample).

#include "layers/ops.hpp"

namespace nerve::layers {

/// Token ids to vectors, PyTorch's `nn.Embedding(vocab, dim)`: weight `[vocab, dim]`,
/// drawn from N(0, 1) as PyTorch's. Samples of ids of any shape (`[T]` for a sequence)
/// give that shape followed by `dim` (`[T, dim]`).
///
/// The ids travel as the network's floats: every integer below 2²⁴ is exact, so a
/// vocabulary must stay under 16,777,216 rows. An id that is not an integer in
/// [0, vocab) is refused in forward, naming the layer, the id and its sample and
/// position (on the CPU and the stand-in; CUDA does not read the ids back, and its gather
/// writes a zero row for such an id instead of reading outside the table).
///
/// Written once with ops: forward is `gather_rows`; the tape gives the weight's gradient
/// as the rows' scatter-add (each row's tokens added in order: the same bits on every
/// backend). The ids get no gradient (zeros where one is asked for).
template <class Scalar>
class basic_embedding final : public basic_op_layer<Scalar> {
 public:
  using typename basic_layer<Scalar>::tensor_type;
  using typename basic_layer<Scalar>::parameter_ref;
  using typename basic_op_layer<Scalar>::array;

  /// Rows start as draws of N(0, `init_std`²): PyTorch's `nn.Embedding` draws N(0, 1); a
  /// GPT whose head shares the table takes 0.02 (GPT-2's), so its first logits are small.
  /// Throws `std::invalid_argument` unless both are positive and `vocab` is below 2²⁴.
  basic_embedding(std::int64_t vocab, std::int64_t dim, double init_std = 1.0);

  std::string_view kind() const noexcept override { return "Embedding"; }
  std::vector<parameter_ref> parameters() override;
  void reset_parameters(std::mt19937_64& rng) override;
  std::int64_t vocab() const noexcept { return vocab_; }
  std::int64_t dim() const noexcept { return dim_; }
  tensor_type& weight() noexcept { return weight_; }
  tensor_type& weight_grad() noexcept { return weight_grad_; }

  array compute(basic_ops<Scalar>& o, std::span<const array> in, std::span<const array> params,
                std::vector<array>& keep, const forward_context& context) override;

 protected:
  shape infer_shape(std::span<const shape> inputs) const override;

 private:
  std::int64_t vocab_, dim_;
  double init_std_;
  tensor_type weight_, weight_grad_;
};

/// A learned position embedding: `[tokens, dim]` samples plus a parameter `[1, tokens,
/// dim]` (a ViT's `pos`; PyTorch: `x + nn.Parameter(torch.empty(1, tokens, dim))`). It
/// starts at N(0, 0.02²), as torchvision's `VisionTransformer` and GPT-2's position
/// table. A sample of any other shape is a shape error at wiring.
///
/// Written once with ops: `add_row` over the batch; the tape sums the gradient over it.
template <class Scalar>
class basic_positional_embedding final : public basic_op_layer<Scalar> {
 public:
  using typename basic_layer<Scalar>::tensor_type;
  using typename basic_layer<Scalar>::parameter_ref;
  using typename basic_op_layer<Scalar>::array;

  /// Throws `std::invalid_argument` unless both are positive.
  basic_positional_embedding(std::int64_t tokens, std::int64_t dim);

  std::string_view kind() const noexcept override { return "PositionalEmbedding"; }
  std::vector<parameter_ref> parameters() override;
  void reset_parameters(std::mt19937_64& rng) override;
  tensor_type& weight() noexcept { return weight_; }
  tensor_type& weight_grad() noexcept { return weight_grad_; }

  array compute(basic_ops<Scalar>& o, std::span<const array> in, std::span<const array> params,
                std::vector<array>& keep, const forward_context& context) override;

 protected:
  shape infer_shape(std::span<const shape> inputs) const override;

 private:
  std::int64_t tokens_, dim_;
  tensor_type weight_, weight_grad_;
};

using embedding = basic_embedding<float>;
using positional_embedding = basic_positional_embedding<float>;

}  // namespace nerve::layers

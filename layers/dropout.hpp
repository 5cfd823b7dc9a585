#pragma once
/// \file
/// `basic_dropout`: inverted dropout with a mask that is a pure function of (seed, step, micro-batch).

#include "layers/layer.hpp"

namespace nerve::layers {

/// Zeroes each element with probability `p` in training and scales the rest by
/// 1/(1−p); the identity in evaluation (PyTorch's `nn.Dropout`).
///
/// The mask is drawn from `std::mt19937_64` seeded with a SplitMix64 mix of
/// (`seed`, `context.step`, `context.micro_batch`): the same micro-batch of the
/// same step gets the same mask whatever order micro-batches run in, on any
/// thread. Element i is kept when `uniform01 ≥ p` (see init.hpp for uniform01).
template <class Scalar>
class basic_dropout final : public basic_layer<Scalar> {
 public:
  using typename basic_layer<Scalar>::tensor_type;
  using typename basic_layer<Scalar>::stash_type;
  using typename basic_layer<Scalar>::forward_result;

  explicit basic_dropout(double p = 0.5, std::uint64_t seed = 0);
  std::string_view kind() const noexcept override { return "Dropout"; }
  double p() const noexcept { return p_; }
  /// The graph builder sets a per-layer seed derived from the graph's seed.
  std::uint64_t seed() const noexcept { return seed_; }
  void reset_parameters(std::mt19937_64& rng) override { seed_ = rng(); }

 protected:
  shape infer_shape(std::span<const shape> inputs) const override { return inputs[0]; }
  forward_result do_forward(std::vector<tensor_type>& inputs, const forward_context& context) override;
  std::vector<tensor_type> do_backward_input(const stash_type& saved, const tensor_type& grad_output,
                                             input_mask wanted) override;

 private:
  double p_;
  std::uint64_t seed_;
};

using dropout = basic_dropout<float>;

}  // namespace nerve::layers

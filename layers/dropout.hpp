#pragma once
/// \file
/// `basic_dropout`: inverted dropout with a mask that is a pure function of (seed, step, micro-batch).

#include "layers/ops.hpp"

namespace nerve::layers {

/// Zeroes each element with probability `p` in training and scales the rest by
/// 1/(1−p); the identity in evaluation (PyTorch's `nn.Dropout`).
///
/// Element i is kept when `counter_uniform(key, i) ≥ p` (layers/ops.hpp), `key` a
/// SplitMix64 mix of (`seed`, `context.step`, `context.micro_batch`): the same
/// micro-batch of the same step gets the same mask whatever order micro-batches run
/// in, on any thread and on any backend (the op set's `dropout_mask`). It keeps the
/// mask for backward.
template <class Scalar>
class basic_dropout final : public basic_op_layer<Scalar> {
 public:
  using typename basic_op_layer<Scalar>::array;

  explicit basic_dropout(double p = 0.5, std::uint64_t seed = 0);
  std::string_view kind() const noexcept override { return "Dropout"; }
  double p() const noexcept { return p_; }
  /// The graph builder sets a per-layer seed derived from the graph's seed.
  std::uint64_t seed() const noexcept { return seed_; }
  void reset_parameters(std::mt19937_64& rng) override { seed_ = rng(); }

  array compute(basic_ops<Scalar>& o, std::span<const array> in, std::span<const array> params,
                std::vector<array>& keep, const forward_context& context) override;
  bool custom_backward() const noexcept override { return true; }
  std::vector<array> grad_input(basic_ops<Scalar>& o, std::span<const array> keep, std::span<const array> params,
                                const array& dy, input_mask wanted) override;

 protected:
  shape infer_shape(std::span<const shape> inputs) const override { return inputs[0]; }

 private:
  double p_;
  std::uint64_t seed_;
};

using dropout = basic_dropout<float>;

}  // namespace nerve::layers

#pragma once
/// \file
/// `basic_flatten`: `[C, H, W]` → `[C·H·W]` without moving data.

#include "layers/ops.hpp"

namespace nerve::layers {

/// Flattens each sample to one dimension (PyTorch's `nn.Flatten()` with
/// start_dim = 1). Forward re-labels the input (no data moves where the input is its
/// own); backward copies the gradient once into the input's shape. Written with ops.
template <class Scalar>
class basic_flatten final : public basic_op_layer<Scalar> {
 public:
  using typename basic_op_layer<Scalar>::array;

  std::string_view kind() const noexcept override { return "Flatten"; }
  bool custom_backward() const noexcept override { return true; }
  array compute(basic_ops<Scalar>&, std::span<const array> in, std::span<const array>, std::vector<array>& keep,
                const forward_context&) override {
    keep.push_back({in[0].dims, nullptr, nullptr, -1});  // the input's shape only
    array y = in[0];
    y.dims = {in[0].rows(), in[0].cols()};
    y.id = -1;
    return y;
  }
  std::vector<array> grad_input(basic_ops<Scalar>& o, std::span<const array> keep, std::span<const array>,
                                const array& dy, input_mask) override {
    auto g = o.clone(dy);
    g.dims = keep[0].dims;
    std::vector<array> out;
    out.push_back(std::move(g));
    return out;
  }

 protected:
  shape infer_shape(std::span<const shape> inputs) const override { return shape{inputs[0].numel()}; }
};

using flatten = basic_flatten<float>;

}  // namespace nerve::layers

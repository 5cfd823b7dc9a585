#pragma once
/// \file
/// `basic_flatten`: `[C, H, W]` → `[C·H·W]` without moving data.

#include "layers/layer.hpp"

namespace nerve::layers {

/// Flattens each sample to one dimension (PyTorch's `nn.Flatten()` with
/// start_dim = 1). Forward re-labels the moved-in input; backward copies the
/// gradient once into the input's shape.
template <class Scalar>
class basic_flatten final : public basic_layer<Scalar> {
 public:
  using typename basic_layer<Scalar>::tensor_type;
  using typename basic_layer<Scalar>::stash_type;
  using typename basic_layer<Scalar>::forward_result;

  std::string_view kind() const noexcept override { return "Flatten"; }

 protected:
  shape infer_shape(std::span<const shape> inputs) const override { return shape{inputs[0].numel()}; }
  forward_result do_forward(std::vector<tensor_type>& inputs, const forward_context&) override {
    tensor_type& x = inputs[0];
    x.reshape(shape{x.features()});
    return {std::move(x), {}};
  }
  std::vector<tensor_type> do_backward_input(const stash_type& saved, const tensor_type& dy,
                                             input_mask wanted) override {
    std::vector<tensor_type> g(1);
    if (!(wanted & 1)) return g;
    g[0] = dy.clone();
    g[0].reshape(saved.input_shapes[0]);
    return g;
  }
};

using flatten = basic_flatten<float>;

}  // namespace nerve::layers

#pragma once
/// \file
/// `basic_conv2d`: 2-D convolution (cross-correlation), PyTorch's `nn.Conv2d` with groups = 1.

#include <array>

#include "layers/ops.hpp"

namespace nerve::layers {

/// Options of a convolution; kernel, stride and padding as (height, width).
struct conv2d_options {
  std::int64_t in_channels = 1;
  std::int64_t out_channels = 1;
  std::array<std::int64_t, 2> kernel{3, 3};
  std::array<std::int64_t, 2> stride{1, 1};
  std::array<std::int64_t, 2> padding{0, 0};
  bool bias = true;
};

/// Conv2d on `[C, H, W]` samples. Weight `[out, in, kh, kw]` stored as a tensor of
/// batch `out` and shape `[in, kh, kw]` (PyTorch's layout); bias `[out]`.
///
/// Written once with ops (`ops::conv2d` and the op set's two gradients): each backend
/// convolves its own way (the CPU image by image, im2col and one product; a device
/// im2col and one batched product). It keeps the input: the weight's gradient
/// recomputes the patches, which are kh·kw times larger.
template <class Scalar>
class basic_conv2d final : public basic_op_layer<Scalar> {
 public:
  using typename basic_layer<Scalar>::tensor_type;
  using typename basic_layer<Scalar>::parameter_ref;
  using typename basic_op_layer<Scalar>::array;

  explicit basic_conv2d(const conv2d_options& options);
  /// Square kernel, stride and padding.
  basic_conv2d(std::int64_t in_channels, std::int64_t out_channels, std::int64_t kernel, std::int64_t stride = 1,
               std::int64_t padding = 0, bool bias = true)
      : basic_conv2d(conv2d_options{in_channels, out_channels, {kernel, kernel}, {stride, stride},
                                    {padding, padding}, bias}) {}

  std::string_view kind() const noexcept override { return "Conv2d"; }
  std::vector<parameter_ref> parameters() override;
  void reset_parameters(std::mt19937_64& rng) override;
  const conv2d_options& options() const noexcept { return o_; }
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
  window_geometry window(std::span<const std::int64_t> input_dims) const {
    return window_over(input_dims, o_.kernel, o_.stride, o_.padding);
  }
  conv2d_options o_;
  std::int64_t ckk_;
  tensor_type weight_, weight_grad_, b_, b_grad_;
};

using conv2d = basic_conv2d<float>;

}  // namespace nerve::layers

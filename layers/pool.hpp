#pragma once
/// \file
/// MaxPool2d and AvgPool2d on `[C, H, W]` samples (PyTorch semantics, ceil_mode = false).

#include "layers/layer.hpp"

namespace nerve::layers {

/// Window, stride (0 = the window, PyTorch's default) and zero padding, square.
struct pool2d_options {
  std::int64_t kernel = 2;
  std::int64_t stride = 0;
  std::int64_t padding = 0;
};

/// Max pooling. Padding counts as −∞; ties go to the first maximum in scan
/// order, as PyTorch. The stash keeps the arg-max index of every output.
template <class Scalar>
class basic_max_pool2d final : public basic_layer<Scalar> {
 public:
  using typename basic_layer<Scalar>::tensor_type;
  using typename basic_layer<Scalar>::stash_type;
  using typename basic_layer<Scalar>::forward_result;

  explicit basic_max_pool2d(std::int64_t kernel, std::int64_t stride = 0, std::int64_t padding = 0);
  std::string_view kind() const noexcept override { return "MaxPool2d"; }
  /// Window, stride (0 replaced by the window) and padding.
  const pool2d_options& options() const noexcept { return o_; }

 protected:
  shape infer_shape(std::span<const shape> inputs) const override;
  forward_result do_forward(std::vector<tensor_type>& inputs, const forward_context& context) override;
  std::vector<tensor_type> do_backward_input(const stash_type& saved, const tensor_type& grad_output,
                                             input_mask wanted) override;

 private:
  pool2d_options o_;
};

/// Average pooling with `count_include_pad = true` (PyTorch's default): a window
/// overlapping the padding divides by its size clipped to the padded image.
template <class Scalar>
class basic_avg_pool2d final : public basic_layer<Scalar> {
 public:
  using typename basic_layer<Scalar>::tensor_type;
  using typename basic_layer<Scalar>::stash_type;
  using typename basic_layer<Scalar>::forward_result;

  explicit basic_avg_pool2d(std::int64_t kernel, std::int64_t stride = 0, std::int64_t padding = 0);
  std::string_view kind() const noexcept override { return "AvgPool2d"; }
  /// Window, stride (0 replaced by the window) and padding.
  const pool2d_options& options() const noexcept { return o_; }

 protected:
  shape infer_shape(std::span<const shape> inputs) const override;
  forward_result do_forward(std::vector<tensor_type>& inputs, const forward_context& context) override;
  std::vector<tensor_type> do_backward_input(const stash_type& saved, const tensor_type& grad_output,
                                             input_mask wanted) override;

 private:
  pool2d_options o_;
};

using max_pool2d = basic_max_pool2d<float>;
using avg_pool2d = basic_avg_pool2d<float>;

}  // namespace nerve::layers

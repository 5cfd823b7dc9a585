#pragma once
/// \file
/// MaxPool2d and AvgPool2d on `[C, H, W]` samples (PyTorch semantics, ceil_mode = false).

#include "layers/ops.hpp"

namespace nerve::layers {

/// Window, stride (0 = the window, PyTorch's default) and zero padding, square.
struct pool2d_options {
  std::int64_t kernel = 2;
  std::int64_t stride = 0;
  std::int64_t padding = 0;
};

/// What a pooling window computes (the `Op` of `basic_pool2d`); `kind` is PyTorch's class name.
namespace pool_ops {
/// Max pooling. Padding counts as −∞; ties go to the first maximum in scan order, as
/// PyTorch. It keeps the input: backward finds each window's maximum again.
struct maximum {
  static constexpr std::string_view kind = "MaxPool2d";
  static constexpr pool_fn fn = pool_fn::max;
};
/// Average pooling with `count_include_pad = true` (PyTorch's default): a window
/// overlapping the padding divides by its size clipped to the padded image.
struct average {
  static constexpr std::string_view kind = "AvgPool2d";
  static constexpr pool_fn fn = pool_fn::average;
};
}  // namespace pool_ops

/// 2-D pooling of each channel with a square window (`Op`: `pool_ops::maximum` or
/// `average`), written once with ops (`ops::pool2d`).
template <class Scalar, class Op>
class basic_pool2d final : public basic_op_layer<Scalar> {
 public:
  using typename basic_op_layer<Scalar>::array;

  explicit basic_pool2d(std::int64_t kernel, std::int64_t stride = 0, std::int64_t padding = 0);
  std::string_view kind() const noexcept override { return Op::kind; }
  /// Window, stride (0 replaced by the window) and padding.
  const pool2d_options& options() const noexcept { return o_; }

  array compute(basic_ops<Scalar>& o, std::span<const array> in, std::span<const array> params,
                std::vector<array>& keep, const forward_context& context) override;
  bool custom_backward() const noexcept override { return true; }
  std::vector<array> grad_input(basic_ops<Scalar>& o, std::span<const array> keep, std::span<const array> params,
                                const array& dy, input_mask wanted) override;

 protected:
  shape infer_shape(std::span<const shape> inputs) const override;

 private:
  pool2d_options o_;
};

template <class S> using basic_max_pool2d = basic_pool2d<S, pool_ops::maximum>;
template <class S> using basic_avg_pool2d = basic_pool2d<S, pool_ops::average>;
using max_pool2d = basic_max_pool2d<float>;
using avg_pool2d = basic_avg_pool2d<float>;

}  // namespace nerve::layers

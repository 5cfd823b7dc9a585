#include "layers/pool.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

namespace nerve::layers {
namespace {

struct pool_geometry {
  std::int64_t c, h, w, oh, ow;
};

pool_geometry geometry(const pool2d_options& o, const shape& in) {
  return {in[0], in[1], in[2], (in[1] + 2 * o.padding - o.kernel) / o.stride + 1,
          (in[2] + 2 * o.padding - o.kernel) / o.stride + 1};
}

// PyTorch's average window: [start, end) clipped to the padded image for the divisor,
// then to the image for the sum.
struct window {
  std::int64_t y0, y1, x0, x1, divisor;
};
window avg_window(const pool2d_options& o, std::int64_t h, std::int64_t w, std::int64_t oy, std::int64_t ox) {
  std::int64_t y0 = oy * o.stride - o.padding, x0 = ox * o.stride - o.padding;
  std::int64_t y1 = std::min(y0 + o.kernel, h + o.padding), x1 = std::min(x0 + o.kernel, w + o.padding);
  const std::int64_t divisor = (y1 - y0) * (x1 - x0);
  return {std::max<std::int64_t>(y0, 0), std::min(y1, h), std::max<std::int64_t>(x0, 0), std::min(x1, w), divisor};
}

template <class Op>
constexpr bool is_max = std::is_same_v<Op, pool_ops::maximum>;

}  // namespace

template <class Scalar, class Op>
basic_pool2d<Scalar, Op>::basic_pool2d(std::int64_t kernel, std::int64_t stride, std::int64_t padding)
    : o_{kernel, stride == 0 ? kernel : stride, padding} {
  if (kernel <= 0 || stride < 0 || padding < 0 || 2 * padding > kernel)
    throw std::invalid_argument(std::string(Op::kind) + ": kernel must be positive, stride non-negative and padding at "
                                "most half the kernel");
}

template <class Scalar, class Op>
shape basic_pool2d<Scalar, Op>::infer_shape(std::span<const shape> inputs) const {
  const shape& in = inputs[0];
  const std::string want = "[C, H, W] with H, W ≥ " + std::to_string(o_.kernel - 2 * o_.padding);
  if (in.rank() != 3 || in[1] + 2 * o_.padding < o_.kernel || in[2] + 2 * o_.padding < o_.kernel)
    throw this->mismatch(0, in, want);
  const auto g = geometry(o_, in);
  return {g.c, g.oh, g.ow};
}

template <class Scalar, class Op>
auto basic_pool2d<Scalar, Op>::do_forward(std::vector<tensor_type>& inputs, const forward_context&)
    -> forward_result {
  const tensor_type& x = inputs[0];
  const auto g = geometry(o_, x.sample_shape());
  const std::int64_t n = x.batch();
  forward_result r{tensor_type(n, {g.c, g.oh, g.ow}), {}};
  if constexpr (is_max<Op>) r.stash.indices.resize(static_cast<std::size_t>(n * g.c * g.oh * g.ow));
  std::int32_t* arg = r.stash.indices.data();
  for (std::int64_t s = 0; s < n; ++s) {
    const Scalar* xs = x.row(s);
    Scalar* ys = r.output.row(s);
    for (std::int64_t c = 0; c < g.c; ++c)
      for (std::int64_t oy = 0; oy < g.oh; ++oy)
        for (std::int64_t ox = 0; ox < g.ow; ++ox) {
          if constexpr (is_max<Op>) {
            const std::int64_t y0 = oy * o_.stride - o_.padding, x0 = ox * o_.stride - o_.padding;
            Scalar best = -std::numeric_limits<Scalar>::infinity();
            std::int64_t best_i = -1;
            for (std::int64_t i = std::max<std::int64_t>(y0, 0); i < std::min(y0 + o_.kernel, g.h); ++i)
              for (std::int64_t j = std::max<std::int64_t>(x0, 0); j < std::min(x0 + o_.kernel, g.w); ++j) {
                const std::int64_t idx = (c * g.h + i) * g.w + j;
                const Scalar v = xs[idx];
                if (best_i < 0 || v > best || std::isnan(v)) {  // PyTorch's rule, NaN wins
                  best = v;
                  best_i = idx;
                }
              }
            *ys++ = best;
            *arg++ = static_cast<std::int32_t>(best_i);
          } else {
            const auto win = avg_window(o_, g.h, g.w, oy, ox);
            Scalar acc = 0;
            for (std::int64_t i = win.y0; i < win.y1; ++i)
              for (std::int64_t j = win.x0; j < win.x1; ++j) acc += xs[(c * g.h + i) * g.w + j];
            *ys++ = acc / Scalar(win.divisor);
          }
        }
  }
  return r;
}

template <class Scalar, class Op>
auto basic_pool2d<Scalar, Op>::do_backward_input(const stash_type& saved, const tensor_type& dy, input_mask wanted)
    -> std::vector<tensor_type> {
  std::vector<tensor_type> grads(1);
  if (!(wanted & 1)) return grads;
  const auto g = geometry(o_, saved.input_shapes[0]);
  grads[0] = tensor_type::zeros(saved.batch, saved.input_shapes[0]);
  const std::int64_t per = dy.features();
  const std::int32_t* arg = saved.indices.data();
  for (std::int64_t s = 0; s < dy.batch(); ++s) {
    const Scalar* d = dy.row(s);
    Scalar* dx = grads[0].row(s);
    if constexpr (is_max<Op>) {
      for (std::int64_t i = 0; i < per; ++i) dx[arg[s * per + i]] += d[i];
    } else {
      for (std::int64_t c = 0; c < g.c; ++c)
        for (std::int64_t oy = 0; oy < g.oh; ++oy)
          for (std::int64_t ox = 0; ox < g.ow; ++ox) {
            const auto win = avg_window(o_, g.h, g.w, oy, ox);
            const Scalar v = *d++ / Scalar(win.divisor);
            for (std::int64_t i = win.y0; i < win.y1; ++i)
              for (std::int64_t j = win.x0; j < win.x1; ++j) dx[(c * g.h + i) * g.w + j] += v;
          }
    }
  }
  return grads;
}

template class basic_pool2d<float, pool_ops::maximum>;
template class basic_pool2d<double, pool_ops::maximum>;
template class basic_pool2d<float, pool_ops::average>;
template class basic_pool2d<double, pool_ops::average>;

}  // namespace nerve::layers

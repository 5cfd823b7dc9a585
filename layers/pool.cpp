#include "layers/pool.hpp"

namespace nerve::layers {
namespace {

struct pool_geometry {
  std::int64_t c, h, w, oh, ow;
};

pool_geometry geometry(const pool2d_options& o, const shape& in) {
  return {in[0], in[1], in[2], (in[1] + 2 * o.padding - o.kernel) / o.stride + 1,
          (in[2] + 2 * o.padding - o.kernel) / o.stride + 1};
}

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
auto basic_pool2d<Scalar, Op>::compute(basic_ops<Scalar>& o, std::span<const array> in, std::span<const array>,
                                       std::vector<array>& keep, const forward_context&) -> array {
  // Max finds each window's maximum again in backward: it keeps the input; average only
  // its shape.
  keep.push_back(Op::fn == pool_fn::max ? in[0] : array{in[0].dims, nullptr, nullptr, -1});
  return o.pool2d(Op::fn, in[0], o_.kernel, o_.stride, o_.padding);
}

template <class Scalar, class Op>
auto basic_pool2d<Scalar, Op>::grad_input(basic_ops<Scalar>& o, std::span<const array> keep, std::span<const array>,
                                          const array& dy, input_mask wanted) -> std::vector<array> {
  std::vector<array> g(1);
  if (!(wanted & 1)) return g;
  const auto w = window_over(keep[0].dims, {o_.kernel, o_.kernel}, {o_.stride, o_.stride}, {o_.padding, o_.padding});
  g[0] = o.empty(keep[0].dims);
  o.set().pool2d_grad(Op::fn, w, keep[0].data, dy.data, g[0].data);
  return g;
}

template class basic_pool2d<float, pool_ops::maximum>;
template class basic_pool2d<double, pool_ops::maximum>;
template class basic_pool2d<float, pool_ops::average>;
template class basic_pool2d<double, pool_ops::average>;

}  // namespace nerve::layers

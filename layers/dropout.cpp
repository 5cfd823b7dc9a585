#include "layers/dropout.hpp"

#include "layers/data/batcher.hpp"

namespace nerve::layers {

using data::splitmix64;

template <class Scalar>
basic_dropout<Scalar>::basic_dropout(double p, std::uint64_t seed) : p_(p), seed_(seed) {
  if (!(p >= 0.0 && p < 1.0)) throw std::invalid_argument("Dropout: p must be in [0, 1), got " + std::to_string(p));
}

template <class Scalar>
auto basic_dropout<Scalar>::compute(basic_ops<Scalar>& o, std::span<const array> in, std::span<const array>,
                                    std::vector<array>& keep, const forward_context& context) -> array {
  if (!o.training() || p_ == 0.0) {  // the identity: the input moves on as the output
    array y = in[0];
    y.id = -1;
    return y;
  }
  auto mask = o.empty(in[0].dims);
  const std::uint64_t key = splitmix64(splitmix64(splitmix64(seed_) ^ context.step) ^ context.micro_batch);
  o.set().dropout_mask(key, p_, Scalar(1.0 / (1.0 - p_)), mask.data, mask.size());
  keep.push_back(mask);
  return o.mul(in[0], mask);
}

template <class Scalar>
auto basic_dropout<Scalar>::grad_input(basic_ops<Scalar>& o, std::span<const array> keep, std::span<const array>,
                                       const array& dy, input_mask wanted) -> std::vector<array> {
  std::vector<array> g(1);
  if (wanted & 1) g[0] = keep.empty() ? o.clone(dy) : o.mul(dy, keep[0]);
  return g;
}

template class basic_dropout<float>;
template class basic_dropout<double>;

}  // namespace nerve::layers

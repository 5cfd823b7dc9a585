#include "layers/dropout.hpp"

#include "layers/data/batcher.hpp"
#include "layers/init.hpp"

namespace nerve::layers {

using data::splitmix64;

template <class Scalar>
basic_dropout<Scalar>::basic_dropout(double p, std::uint64_t seed) : p_(p), seed_(seed) {
  if (!(p >= 0.0 && p < 1.0)) throw std::invalid_argument("Dropout: p must be in [0, 1), got " + std::to_string(p));
}

template <class Scalar>
auto basic_dropout<Scalar>::do_forward(std::vector<tensor_type>& inputs, const forward_context& context)
    -> forward_result {
  tensor_type& x = inputs[0];
  if (!this->training() || p_ == 0.0) return {std::move(x), {}};
  std::mt19937_64 rng(splitmix64(splitmix64(splitmix64(seed_) ^ context.step) ^ context.micro_batch));
  tensor_type mask(x.batch(), x.sample_shape());
  const Scalar scale = Scalar(1.0 / (1.0 - p_));
  Scalar* m = mask.data();
  Scalar* px = x.data();
  for (std::int64_t i = 0; i < x.size(); ++i) {
    m[i] = uniform01(rng) >= p_ ? scale : Scalar(0);
    px[i] *= m[i];
  }
  return this->with_stash(std::move(x), std::move(mask));
}

template <class Scalar>
auto basic_dropout<Scalar>::do_backward_input(const stash_type& saved, const tensor_type& dy, input_mask wanted)
    -> std::vector<tensor_type> {
  std::vector<tensor_type> g(1);
  if (!(wanted & 1)) return g;
  g[0] = dy.clone();
  if (!saved.tensors.empty()) g[0].matrix().array() *= saved.tensors[0].matrix().array();
  return g;
}

template class basic_dropout<float>;
template class basic_dropout<double>;

}  // namespace nerve::layers

#include "layers/loss.hpp"

#include <cmath>

namespace nerve::layers {

template <class Scalar>
auto basic_cross_entropy<Scalar>::forward(const tensor_type& logits, const targets_type& target) const -> result {
  const std::int64_t n = logits.batch(), k = logits.features();
  if (logits.sample_shape().rank() != 1)
    throw std::invalid_argument("CrossEntropyLoss: prediction must be [K] per sample, got " + logits.shape_string());
  if (static_cast<std::int64_t>(target.labels.size()) != n)
    throw std::invalid_argument("CrossEntropyLoss: " + std::to_string(target.labels.size()) + " labels for a batch of " +
                                std::to_string(n));
  result r;
  tensor_type probs(n, logits.sample_shape());
  double total = 0;
  for (std::int64_t s = 0; s < n; ++s) {
    const std::int32_t label = target.labels[static_cast<std::size_t>(s)];
    if (label < 0 || label >= k)
      throw std::invalid_argument("CrossEntropyLoss: label " + std::to_string(label) + " of sample " +
                                  std::to_string(s) + " is outside [0, " + std::to_string(k) + ")");
    const Scalar* z = logits.row(s);
    Scalar* p = probs.row(s);
    Scalar zmax = z[0];
    std::int64_t argmax = 0;
    for (std::int64_t j = 1; j < k; ++j)
      if (z[j] > zmax) zmax = z[j], argmax = j;
    Scalar sum = 0;
    for (std::int64_t j = 0; j < k; ++j) sum += (p[j] = std::exp(z[j] - zmax));
    const Scalar inv = Scalar(1) / sum;
    for (std::int64_t j = 0; j < k; ++j) p[j] *= inv;
    total += double(std::log(sum)) + double(zmax) - double(z[label]);
    r.correct += argmax == label;
  }
  r.loss = n ? total / double(n) : 0.0;
  r.stash.tensors.push_back(std::move(probs));
  r.stash.indices = target.labels;
  r.stash.batch = n;
  return r;
}

template <class Scalar>
auto basic_cross_entropy<Scalar>::backward(const stash_type& saved, Scalar scale) const -> tensor_type {
  tensor_type g = saved.tensors[0].clone();
  const std::int64_t n = g.batch();
  const Scalar f = n ? scale / Scalar(n) : Scalar(0);
  for (std::int64_t s = 0; s < n; ++s) g.row(s)[saved.indices[static_cast<std::size_t>(s)]] -= Scalar(1);
  g.matrix() *= f;
  return g;
}

template <class Scalar>
auto basic_mse<Scalar>::forward(const tensor_type& prediction, const targets_type& target) const -> result {
  const tensor_type& t = target.values;
  if (t.batch() != prediction.batch() || t.sample_shape() != prediction.sample_shape())
    throw std::invalid_argument("MSELoss: prediction " + prediction.shape_string() + " and target " + t.shape_string() +
                                " differ");
  result r;
  tensor_type diff(prediction.batch(), prediction.sample_shape());
  diff.matrix() = prediction.matrix() - t.matrix();
  double sq = 0;
  for (std::int64_t i = 0; i < diff.size(); ++i) sq += double(diff.data()[i]) * double(diff.data()[i]);
  r.loss = diff.size() ? sq / double(diff.size()) : 0.0;
  r.stash.batch = prediction.batch();
  r.stash.tensors.push_back(std::move(diff));
  return r;
}

template <class Scalar>
auto basic_mse<Scalar>::backward(const stash_type& saved, Scalar scale) const -> tensor_type {
  tensor_type g = saved.tensors[0].clone();
  const Scalar f = g.size() ? Scalar(2) * scale / Scalar(g.size()) : Scalar(0);
  g.matrix() *= f;
  return g;
}

template class basic_cross_entropy<float>;
template class basic_cross_entropy<double>;
template class basic_mse<float>;
template class basic_mse<double>;

}  // namespace nerve::layers

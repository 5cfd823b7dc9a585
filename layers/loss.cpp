#include "layers/loss.hpp"

#include <stdexcept>
#include <string>

#include "layers/detail/host_arrays.hpp"

namespace nerve::layers {

// ---- on host tensors: the CPU's op set -----------------------------------------------

template <class Scalar>
auto basic_op_loss<Scalar>::forward(const tensor_type& prediction, const targets_type& target) const -> result {
  auto& set = cpu_op_set<Scalar>();
  // The arrays only read the tensors they borrow.
  const auto pred = detail::host_array(const_cast<tensor_type&>(prediction));
  basic_op_targets<Scalar> t{target.labels.data(), target.labels, {}};
  if (!target.values.empty()) t.values = detail::host_array(const_cast<tensor_type&>(target.values));
  auto run = compute(set, pred, t);
  result r;
  double sum = 0;
  for (std::int64_t i = 0; i < run.terms.size(); ++i) sum += double(run.terms.data[i]);
  r.loss = run.divisor > 0 ? sum / run.divisor : 0.0;
  r.correct = run.correct.empty() ? 0 : static_cast<std::int64_t>(run.correct.data[0]);
  for (auto& a : run.stash) r.stash.tensors.push_back(detail::to_tensor(std::move(a)));
  r.stash.indices = target.labels;
  r.stash.batch = prediction.batch();
  return r;
}

template <class Scalar>
auto basic_op_loss<Scalar>::backward(const stash_type& saved, Scalar scale) const -> tensor_type {
  run_type run;
  for (const auto& t : saved.tensors) run.stash.push_back(detail::host_array(const_cast<tensor_type&>(t)));
  const basic_op_targets<Scalar> t{saved.indices.data(), saved.indices, {}};
  return detail::to_tensor(gradient(cpu_op_set<Scalar>(), run, t, scale));
}

// ---- the losses, written once ----------------------------------------------------------

template <class Scalar>
auto basic_cross_entropy<Scalar>::compute(basic_op_set<Scalar>& set, const array& logits,
                                          const basic_op_targets<Scalar>& target) const -> run_type {
  if (logits.dims.size() != 2 && logits.dims.size() != 3)
    throw std::invalid_argument("CrossEntropyLoss: prediction must be [K] or [T, K] per sample, got " +
                                logits.shape_string());
  // Every row is scored: a sample's, or each token's of a [T, K] sample.
  const std::int64_t k = logits.dims.back(), n = k ? logits.size() / k : 0;
  const std::int64_t tokens = logits.dims.size() == 3 ? logits.dims[1] : 1;
  if (static_cast<std::int64_t>(target.host_labels.size()) != n)
    throw std::invalid_argument("CrossEntropyLoss: " + std::to_string(target.host_labels.size()) +
                                " labels for a batch of " + std::to_string(logits.rows()) +
                                (tokens == 1 ? std::string()
                                             : " samples of " + std::to_string(tokens) + " tokens (one per token: " +
                                                   std::to_string(n) + ")"));
  for (std::int64_t s = 0; s < n; ++s) {
    const std::int32_t label = target.host_labels[static_cast<std::size_t>(s)];
    if (label < 0 || label >= k)
      throw std::invalid_argument("CrossEntropyLoss: label " + std::to_string(label) + " of sample " +
                                  std::to_string(s / tokens) +
                                  (tokens == 1 ? std::string() : ", token " + std::to_string(s % tokens)) +
                                  " is outside [0, " + std::to_string(k) + ")");
  }
  run_type r;
  r.terms = set.alloc({n});
  r.correct = set.alloc({1});
  r.divisor = double(n);
  auto probs = set.alloc(logits.dims);
  set.softmax_xent(logits.data, target.labels, n, k, probs.data, r.terms.data, r.correct.data);
  r.stash.push_back(std::move(probs));
  return r;
}

template <class Scalar>
auto basic_cross_entropy<Scalar>::gradient(basic_op_set<Scalar>& set, const run_type& run,
                                           const basic_op_targets<Scalar>& target, Scalar scale) const -> array {
  const auto& probs = run.stash.at(0);
  const std::int64_t k = probs.dims.back(), n = k ? probs.size() / k : 0;
  auto g = set.alloc(probs.dims);
  // scale/n: the micro-batch's share of the mean over the mini-batch, over its rows
  // (samples, or every sample's tokens).
  set.softmax_xent_grad(probs.data, target.labels, n, k, n ? scale / Scalar(n) : Scalar(0), g.data);
  return g;
}

template <class Scalar>
auto basic_mse<Scalar>::compute(basic_op_set<Scalar>& set, const array& prediction,
                                const basic_op_targets<Scalar>& target) const -> run_type {
  const auto& t = target.values;
  if (t.dims != prediction.dims)
    throw std::invalid_argument("MSELoss: prediction " + prediction.shape_string() + " and target " +
                                (t.empty() ? std::string("(no values)") : t.shape_string()) + " differ");
  const std::int64_t n = prediction.size();
  run_type r;
  auto diff = set.alloc(prediction.dims);
  set.binary(binary_fn::sub, prediction.data, t.data, diff.data, n);
  // Σ (y − t)², the squares summed in double in element order, as one term.
  r.terms = set.alloc({1});
  set.fill(1, Scalar(0), r.terms.data);
  set.channel_sums(norm_geometry{1, 1, n}, diff.data, diff.data, r.terms.data);
  r.divisor = double(n);
  r.stash.push_back(std::move(diff));
  return r;
}

template <class Scalar>
auto basic_mse<Scalar>::gradient(basic_op_set<Scalar>& set, const run_type& run, const basic_op_targets<Scalar>&,
                                 Scalar scale) const -> array {
  const auto& diff = run.stash.at(0);
  const std::int64_t n = diff.size();
  auto g = set.alloc(diff.dims);
  set.copy(n, diff.data, g.data);
  set.scale(n, n ? Scalar(2) * scale / Scalar(n) : Scalar(0), g.data);
  return g;
}

template class basic_op_loss<float>;
template class basic_op_loss<double>;
template class basic_cross_entropy<float>;
template class basic_cross_entropy<double>;
template class basic_mse<float>;
template class basic_mse<double>;

}  // namespace nerve::layers

#pragma once
/// \file
/// How nerve-generate picks the next token from a position's logits: divided by the
/// temperature, cut to the `top_k` largest, a softmax in double, one draw.
///
/// The draw is `u = (x >> 11) · 2⁻⁵³` from one output `x` of `std::mt19937_64`
/// (`layers::uniform01`, as the initialisers draw), and the token is the first, in
/// increasing id, whose cumulative probability passes `u`: the standard fixes the
/// generator's stream and nothing here depends on the library's distributions, so a seed
/// gives the same text on any machine whose network gives the same logits. Header-only;
/// any thread, one sampler per thread.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include "layers/init.hpp"

namespace nerve::apps {

/// Draws tokens from logits with a temperature and a top-k cut, seeded. Not thread-safe.
class token_sampler {
 public:
  /// `temperature` finite and above 0; `top_k` 0 keeps every token. The caller checks both.
  token_sampler(std::uint64_t seed, double temperature, std::size_t top_k)
      : rng_(seed), temperature_(temperature), top_k_(top_k) {}

  /// The token drawn from `logits` (one per token of the vocabulary, not empty).
  std::size_t operator()(std::span<const float> logits) {
    const std::size_t n = logits.size();
    scaled_.resize(n);
    for (std::size_t i = 0; i < n; ++i) scaled_[i] = double(logits[i]) / temperature_;
    // Which tokens stay: the k largest, ties to the lower id so the cut is the same
    // whatever order a sort visits them in.
    keep_.assign(n, true);
    if (top_k_ > 0 && top_k_ < n) {
      order_.resize(n);
      std::iota(order_.begin(), order_.end(), std::size_t{0});
      std::nth_element(order_.begin(), order_.begin() + std::ptrdiff_t(top_k_), order_.end(),
                       [&](std::size_t a, std::size_t b) {
                         return scaled_[a] > scaled_[b] || (scaled_[a] == scaled_[b] && a < b);
                       });
      std::fill(keep_.begin(), keep_.end(), false);
      for (std::size_t j = 0; j < top_k_; ++j) keep_[order_[j]] = true;
    }
    // The softmax of the kept logits, shifted by their largest so no exp overflows.
    double top = -INFINITY;
    for (std::size_t i = 0; i < n; ++i)
      if (keep_[i]) top = std::max(top, scaled_[i]);
    double sum = 0;
    for (std::size_t i = 0; i < n; ++i) sum += (scaled_[i] = keep_[i] ? std::exp(scaled_[i] - top) : 0.0);
    const double target = layers::uniform01(rng_) * sum;
    double cumulative = 0;
    std::size_t last = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (!keep_[i]) continue;
      cumulative += scaled_[i];
      last = i;
      if (target < cumulative) return i;
    }
    return last;  // rounding left the sum a hair above the cumulative: the last kept token
  }

 private:
  std::mt19937_64 rng_;
  double temperature_;
  std::size_t top_k_;
  std::vector<double> scaled_;
  std::vector<bool> keep_;
  std::vector<std::size_t> order_;
};

}  // namespace nerve::apps

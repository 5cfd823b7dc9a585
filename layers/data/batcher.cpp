#include "layers/data/batcher.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>

namespace nerve::data {

std::uint64_t splitmix64(std::uint64_t x) noexcept {
  std::uint64_t z = x + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::uint64_t epoch_seed(std::uint64_t seed, std::uint64_t epoch) noexcept {
  return splitmix64(seed ^ splitmix64(epoch));
}

std::uint64_t uniform_below(std::mt19937_64& rng, std::uint64_t k) {
  // 2^64 mod k computed in 64 bits as (2^64 - k) mod k.
  const std::uint64_t rem = (0 - k) % k;
  const std::uint64_t limit = 0 - rem;  // 2^64 - rem; 0 means "accept all" (rem == 0)
  for (;;) {
    std::uint64_t r = rng();
    if (rem == 0 || r < limit) return r % k;
  }
}

void shuffle(std::span<std::uint32_t> values, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (std::size_t i = values.size(); i > 1; --i) {
    std::size_t j = static_cast<std::size_t>(uniform_below(rng, i));
    std::swap(values[i - 1], values[j]);
  }
}

batcher::batcher(std::size_t samples, batcher_options options) : options_(options) {
  if (options_.batch_size == 0) throw std::invalid_argument("batcher: batch_size must be at least 1");
  if (samples > std::numeric_limits<std::uint32_t>::max())
    throw std::invalid_argument("batcher: at most 2^32 - 1 samples");
  order_.resize(samples);
  set_epoch(0);
}

std::size_t batcher::batches_per_epoch() const noexcept {
  const std::size_t n = order_.size(), b = options_.batch_size;
  return options_.drop_last ? n / b : (n + b - 1) / b;
}

void batcher::set_epoch(std::uint64_t epoch) {
  epoch_ = epoch;
  std::iota(order_.begin(), order_.end(), std::uint32_t{0});
  if (options_.shuffle) shuffle(order_, epoch_seed(options_.seed, epoch));
}

std::span<const std::uint32_t> batcher::indices(std::size_t b) const {
  if (b >= batches_per_epoch()) {
    throw std::out_of_range("batcher: batch " + std::to_string(b) + " of an epoch of " +
                            std::to_string(batches_per_epoch()) + " batches");
  }
  const std::size_t begin = b * options_.batch_size;
  const std::size_t end = std::min(begin + options_.batch_size, order_.size());
  return std::span<const std::uint32_t>(order_).subspan(begin, end - begin);
}

void batcher::gather(const dataset& data, std::size_t b, std::span<float> images,
                     std::span<std::int32_t> labels) const {
  if (data.size() != order_.size()) {
    throw std::invalid_argument("batcher: built for " + std::to_string(order_.size()) +
                                " samples, the dataset has " + std::to_string(data.size()));
  }
  const auto idx = indices(b);
  const std::size_t f = data.features(), per = data.labels_per_sample;
  if (images.size() != idx.size() * f || labels.size() != idx.size() * per) {
    throw std::invalid_argument("batcher: batch " + std::to_string(b) + " needs " + std::to_string(idx.size()) +
                                " x " + std::to_string(f) + " floats and " + std::to_string(idx.size() * per) +
                                " labels, got " + std::to_string(images.size()) + " and " +
                                std::to_string(labels.size()));
  }
  for (std::size_t r = 0; r < idx.size(); ++r) {
    data.copy_row(idx[r], images.subspan(r * f, f));
    const auto first = data.labels.begin() + std::ptrdiff_t(std::size_t{idx[r]} * per);
    std::copy(first, first + std::ptrdiff_t(per), labels.begin() + std::ptrdiff_t(r * per));
  }
}

}  // namespace nerve::data

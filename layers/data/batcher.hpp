#pragma once
/// \file
/// Seeded shuffling and batching of a dataset (micro-batches: `layers::split_micro_batches`).
///
/// The order of an epoch is a pure function of (seed, epoch, sample count), so
/// any epoch can be replayed or resumed without replaying the ones before it:
///
/// 1. `s = epoch_seed(seed, epoch)` = `splitmix64(seed ^ splitmix64(epoch))`,
///    where `splitmix64(x)` is the finaliser of Steele et al.'s SplitMix64
///    (`z = x + 0x9e3779b97f4a7c15; z = (z ^ z>>30) * 0xbf58476d1ce4e5b9;
///    z = (z ^ z>>27) * 0x94d049bb133111eb; return z ^ z>>31`).
/// 2. `rng = std::mt19937_64(s)` (the standard fixes its output sequence).
/// 3. Start from the identity `order[i] = i`; Fisher–Yates from the back: for
///    `i = n-1` down to `1`, `j = uniform(rng, i+1)`, swap `order[i]` and `order[j]`.
/// 4. `uniform(rng, k)` draws `r = rng()` until `r < 2^64 - (2^64 mod k)` and
///    returns `r mod k` (rejection sampling: unbiased, and unlike
///    `std::uniform_int_distribution` the same on every standard library).
///
/// Batch `b` is `order[b*B, min((b+1)*B, n))`; the last partial batch is kept
/// unless `drop_last`. Without shuffling the order is the file order.

#include "layers/data/dataset.hpp"

#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace nerve::data {

/// SplitMix64's output function (see the file comment).
std::uint64_t splitmix64(std::uint64_t x) noexcept;
/// The seed of the shuffle of `epoch` under `seed` (see the file comment).
std::uint64_t epoch_seed(std::uint64_t seed, std::uint64_t epoch) noexcept;
/// An unbiased draw in [0, k) from `rng` by rejection (k > 0).
std::uint64_t uniform_below(std::mt19937_64& rng, std::uint64_t k);
/// Fisher–Yates shuffle of `values` in place with a generator seeded by `seed`.
void shuffle(std::span<std::uint32_t> values, std::uint64_t seed);

/// How a `batcher` orders and cuts an epoch.
struct batcher_options {
  std::size_t batch_size = 256;
  /// Off: batches follow the file order.
  bool shuffle = true;
  std::uint64_t seed = 0;
  /// Drop the last batch if it has fewer than `batch_size` rows.
  bool drop_last = false;
};

/// Cuts the samples of a dataset into batches, in a seeded order per epoch.
///
/// Not thread-safe: one thread (the loader) owns it. Cheap: `set_epoch` is one
/// O(n) shuffle; `indices` is a view; `gather` copies only the rows asked.
class batcher {
 public:
  /// Throws `std::invalid_argument` if `batch_size` is 0 or `samples` exceeds 2^32 - 1.
  batcher(std::size_t samples, batcher_options options);

  std::size_t samples() const noexcept { return order_.size(); }
  const batcher_options& options() const noexcept { return options_; }
  /// Batches in an epoch: ceil(n / B), or floor(n / B) with `drop_last`.
  std::size_t batches_per_epoch() const noexcept;

  /// Makes `epoch`'s order current (epoch 0 is current after construction).
  void set_epoch(std::uint64_t epoch);
  std::uint64_t epoch() const noexcept { return epoch_; }
  /// The sample order of the current epoch (a permutation of [0, n)).
  std::span<const std::uint32_t> order() const noexcept { return order_; }

  /// The sample indices of batch `b` of the current epoch; throws `std::out_of_range`.
  std::span<const std::uint32_t> indices(std::size_t b) const;
  /// Copies the rows and labels of batch `b` into `images` (rows × features) and `labels`
  /// (rows × `labels_per_sample`); both must have exactly that size. Throws `std::invalid_argument` otherwise.
  void gather(const dataset& data, std::size_t b, std::span<float> images,
              std::span<std::int32_t> labels) const;

 private:
  batcher_options options_;
  std::vector<std::uint32_t> order_;
  std::uint64_t epoch_ = 0;
};

}  // namespace nerve::data

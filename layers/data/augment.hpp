#pragma once
/// \file
/// Image augmentation as a loader stage: a random crop after zero padding and a random
/// horizontal flip (torchvision's `RandomCrop(size, padding=N)` and
/// `RandomHorizontalFlip()`), applied to training batches only.
///
/// What a sample becomes is a pure function of (seed, epoch, sample index), so a resumed
/// run augments every batch bitwise as the uninterrupted run did, and the loader needs
/// no state of its own:
///
/// 1. `u = splitmix64(epoch_seed(seed, epoch) ^ splitmix64(~index))` (layers/data/batcher.hpp
///    has `splitmix64` and `epoch_seed`; the shuffle draws from the same epoch seed with
///    another generator, `std::mt19937_64`, so the two do not repeat each other).
/// 2. Crop by N: the sample, C×H×W, is padded by N on every side with the value a zero
///    input becomes (`dataset::zero_value`); the H×W window at row `dy` and column `dx`
///    of the padded image is kept, `dy = (u >> 32 & 0x7fffffff) mod (2N + 1)`,
///    `dx = (u & 0xffffffff) mod (2N + 1)`. An offset of N keeps the sample as it is.
/// 3. Flip: when bit 63 of `u` is set, each row is reversed (after the crop).

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace nerve::data {

/// What `augment` does to a training sample. All off: nothing.
struct augment_options {
  /// Random crop after zero padding by this many pixels on each side (0: no crop).
  std::size_t crop = 0;
  /// Random horizontal flip, half the samples.
  bool flip = false;

  /// Whether anything is done.
  bool any() const noexcept { return crop > 0 || flip; }
  friend bool operator==(const augment_options&, const augment_options&) = default;
};

/// The largest padding `parse_augment` takes.
inline constexpr std::size_t max_augment_crop = 64;

/// Reads `--augment`'s text, a comma-separated list of `crop=N` (N from 1 to
/// `max_augment_crop`) and `flip`, e.g. `crop=4,flip`. Throws `std::invalid_argument`
/// naming `--augment` for an unknown key, a missing or out-of-range N, or a key given twice.
augment_options parse_augment(std::string_view text);

/// `crop=4,flip`: the text `parse_augment` reads back to `options` (empty for none).
std::string augment_text(const augment_options& options);

/// Throws `std::invalid_argument` naming `--augment` when `options` cannot apply to
/// samples of `sample_shape`: they must be images, C×H×W, and the padding at most the
/// smaller of H and W. Nothing to check when `options` does nothing.
void check_augment(const augment_options& options, std::span<const std::size_t> sample_shape);

/// The draw of sample `index` in `epoch` under `seed` (step 1 of the file comment).
std::uint64_t augment_draw(std::uint64_t seed, std::uint64_t epoch, std::uint64_t index) noexcept;

/// Crops and flips one sample in place as `draw` says (steps 2 and 3 of the file
/// comment): `sample` holds C×H×W floats (`sample_shape`), `pad` is the padding's value.
/// Throws `std::invalid_argument` when the sizes disagree. Any thread; no shared state.
void augment_sample(const augment_options& options, std::uint64_t draw, std::span<const std::size_t> sample_shape,
                    float pad, std::span<float> sample);

/// Augments a batch in place: row `r` of `rows` (each `product(sample_shape)` floats) is
/// sample `indices[r]` of the dataset, drawn under (`seed`, `epoch`, `indices[r]`).
void augment_batch(const augment_options& options, std::uint64_t seed, std::uint64_t epoch,
                   std::span<const std::uint32_t> indices, std::span<const std::size_t> sample_shape, float pad,
                   std::span<float> rows);

}  // namespace nerve::data

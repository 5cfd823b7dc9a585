#pragma once
/// \file
/// An in-memory labelled dataset: the one a training run reads, whether it came from
/// Fashion-MNIST, an IDX pair of any shape, a NumPy `.npy` pair or tensors of your own.

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace nerve::data {

/// Per-pixel normalisation applied after scaling to [0, 1]: `(x - mean) / std`,
/// as torchvision's `Normalize` computes it.
struct normalization {
  float mean = 0.0f;
  float std = 1.0f;
};

/// Options for loading a dataset.
struct load_options {
  /// Off by default: inputs are pixels scaled to [0, 1] and nothing else.
  std::optional<normalization> normalize;
};

/// Samples as rows of 8-bit pixels (or of floats) plus an integer label per sample; rows
/// come out as floats through the pixel transform (`x / 255`, then normalisation), or for
/// float samples as they are (then normalisation).
///
/// The pixels stay 8-bit in memory (a quarter of the floats' size, and no
/// 188 MB float array to fault in for Fashion-MNIST); every u8 value maps to a
/// float through a 256-entry table, bitwise what the per-element formula gives,
/// so converting a batch costs about as much as copying it.
/// Row layout is that of the source (for IDX images, C×H×W with C = 1).
/// A value type; read-only use from several threads is safe.
struct dataset {
  /// `size() * features()` pixels, one row per sample (empty when `values` holds the rows).
  std::vector<std::uint8_t> pixels;
  /// `size() * features()` floats, one row per sample, for float data (`.npy` `<f4`, IDX
  /// f32, `make_dataset`); empty for 8-bit pixels.
  std::vector<float> values;
  /// `size() * labels_per_sample` labels, a sample's one after the other.
  std::vector<std::int32_t> labels;
  /// Labels per sample: 1 (a class per image), or T for a sequence whose every token has
  /// its own (the `gpt` preset's windows: the byte that follows each, `text_dataset`).
  std::size_t labels_per_sample = 1;
  /// Shape of one sample, e.g. `{1, 28, 28}`.
  std::vector<std::size_t> sample_shape;
  /// Number of classes (labels are in [0, classes)).
  std::size_t classes = 0;
  /// The float each pixel value becomes: `(v / 255.0f - mean) / std`, or `v / 255.0f`.
  std::array<float, 256> pixel_value{};
  /// The normalisation float `values` go through (`(x - mean) / std`); none: as they are.
  std::optional<normalization> value_normalization;

  /// Number of samples.
  std::size_t size() const noexcept { return labels_per_sample ? labels.size() / labels_per_sample : 0; }
  /// Values per sample (product of `sample_shape`).
  std::size_t features() const noexcept;
  /// Sets `pixel_value` and `value_normalization` for `norm` (or plain [0, 1] scaling of
  /// pixels, and float values as they are, when empty).
  void set_normalization(std::optional<normalization> norm) noexcept;
  /// The float a zero input becomes (pixel 0, or the float 0, after normalisation): what
  /// padding around a sample holds (`augment`), as torchvision pads before `Normalize`.
  float zero_value() const noexcept;
  /// Writes sample `i` as floats into `out` (exactly `features()` long).
  void copy_row(std::size_t i, std::span<float> out) const;
  /// Samples `[first, first + count)` as floats, e.g. a slice of the test set.
  std::vector<float> rows(std::size_t first, std::size_t count) const;
};

/// Loads an IDX sample file (u8 or f32, N then any sample shape; N×H×W is read as
/// N×1×H×W) and its IDX label file (u8 or i32, N).
///
/// Pixels become `x / 255` (then normalised if asked); f32 values stay as they are (then
/// normalised if asked). Throws `format_error` for malformed files and if the counts
/// differ or a label is out of range (naming both files). `classes` is the largest
/// label + 1 unless given.
dataset load_idx_pair(const std::filesystem::path& images, const std::filesystem::path& labels,
                      const load_options& options = {}, std::size_t classes = 0);

/// Loads a NumPy `.npy` input file and its `.npy` label file, as `np.save` writes them.
///
/// Inputs: `<f4` (taken as they are) or `|u1` (scaled as IDX pixels are, `x / 255`), then
/// normalised if asked; shape N then the sample's (`[N, F]`, `[N, C, H, W]`; `[N, H, W]` is
/// read as `[N, 1, H, W]`). Labels: any integer type, shape `[N]`, each in [0, `classes`)
/// (`classes`: the largest label + 1 unless given). Throws `format_error` naming the file
/// and the header field (`descr`, `shape`) or the sample for what it refuses, and naming
/// both files when the counts differ (layers/data/npy.hpp has the format's own refusals).
dataset load_npy_pair(const std::filesystem::path& inputs, const std::filesystem::path& labels,
                      const load_options& options = {}, std::size_t classes = 0);

/// A `.npy` input file and its label file (`load_npy_pair`); both empty: none.
struct npy_files {
  std::filesystem::path inputs, labels;
  bool empty() const noexcept { return inputs.empty() && labels.empty(); }
  friend bool operator==(const npy_files&, const npy_files&) = default;
};

/// A dataset of your own tensors: `values` holds `labels.size()` rows of
/// `product(sample_shape)` floats. Throws `std::invalid_argument` when the sizes disagree
/// or a label is outside [0, `classes`) (`classes` 0: the largest label + 1).
dataset make_dataset(std::vector<float> values, std::vector<std::int32_t> labels,
                     std::vector<std::size_t> sample_shape, std::size_t classes = 0,
                     const load_options& options = {});

/// The two splits of Fashion-MNIST.
enum class split { train, test };

/// Where Debian's `dataset-fashion-mnist` installs the files.
inline constexpr std::string_view fashion_mnist_default_dir = "/usr/share/datasets/fashion-mnist";

/// The image and label files `load_fashion_mnist` reads for a split from `dir`: each the
/// `.gz` one where it exists, else the plain one where that exists, else the `.gz` name
/// (which reading then reports missing).
std::array<std::filesystem::path, 2> fashion_mnist_files(const std::filesystem::path& dir, split which);

/// Loads a split of Fashion-MNIST from `dir` (files `{train,t10k}-{images-idx3,labels-idx1}-ubyte`
/// with or without `.gz`). Checks the shape (N×28×28) and the 10 classes.
dataset load_fashion_mnist(const std::filesystem::path& dir, split which, const load_options& options = {});

/// The ten Fashion-MNIST class names, by label.
std::string_view fashion_mnist_class_name(std::int32_t label);

}  // namespace nerve::data

#include "layers/data/dataset.hpp"

#include "layers/data/format_error.hpp"
#include "layers/data/idx.hpp"

#include <algorithm>
#include <array>
#include <stdexcept>
#include <string>

namespace nerve::data {

std::size_t dataset::features() const noexcept {
  std::size_t n = 1;
  for (std::size_t d : sample_shape) n *= d;
  return sample_shape.empty() ? 0 : n;
}

void dataset::set_normalization(std::optional<normalization> norm) noexcept {
  // Division, not multiplication by 1/255: bitwise what torchvision's ToTensor gives,
  // and Normalize's (x - mean) / std in the same order.
  for (int v = 0; v < 256; ++v) {
    float x = static_cast<float>(v) / 255.0f;
    if (norm) x = (x - norm->mean) / norm->std;
    pixel_value[static_cast<std::size_t>(v)] = x;
  }
}

void dataset::copy_row(std::size_t i, std::span<float> out) const {
  const std::size_t f = features();
  if (i >= size()) throw std::out_of_range("dataset: sample " + std::to_string(i) + " of " + std::to_string(size()));
  if (out.size() != f) {
    throw std::invalid_argument("dataset: a row has " + std::to_string(f) + " values, the output " +
                                std::to_string(out.size()));
  }
  const std::uint8_t* src = pixels.data() + i * f;
  for (std::size_t k = 0; k < f; ++k) out[k] = pixel_value[src[k]];
}

std::vector<float> dataset::rows(std::size_t first, std::size_t count) const {
  if (first > size() || count > size() - first) {
    throw std::out_of_range("dataset: rows [" + std::to_string(first) + ", " + std::to_string(first + count) +
                            ") of " + std::to_string(size()));
  }
  const std::size_t f = features();
  std::vector<float> out(count * f);
  for (std::size_t r = 0; r < count; ++r) copy_row(first + r, std::span<float>(out).subspan(r * f, f));
  return out;
}

dataset load_idx_pair(const std::filesystem::path& images_path, const std::filesystem::path& labels_path,
                      const load_options& options, std::size_t classes) {
  idx_array images = read_idx(images_path);
  const idx_array labels = read_idx(labels_path);
  const std::string ipath = images_path.string(), lpath = labels_path.string();
  if (images.type() != idx_type::u8)
    throw format_error(ipath, 2, "images must be u8, the file holds " + std::string(idx_type_name(images.type())));
  if (labels.type() != idx_type::u8)
    throw format_error(lpath, 2, "labels must be u8, the file holds " + std::string(idx_type_name(labels.type())));
  if (images.shape().size() < 2 || images.shape().size() > 4) {
    throw format_error(ipath, 3,
                       "images must have 2 to 4 dimensions (N, then the sample shape), the file has " +
                           std::to_string(images.shape().size()));
  }
  if (labels.shape().size() != 1)
    throw format_error(lpath, 3, "labels must have 1 dimension, the file has " + std::to_string(labels.shape().size()));
  if (images.shape()[0] != labels.shape()[0]) {
    throw format_error(ipath, 4,
                       std::to_string(images.shape()[0]) + " images but " + lpath + " holds " +
                           std::to_string(labels.shape()[0]) + " labels");
  }

  dataset ds;
  ds.sample_shape.assign(images.shape().begin() + 1, images.shape().end());
  if (ds.sample_shape.size() == 2) ds.sample_shape.insert(ds.sample_shape.begin(), 1);  // N×H×W -> N×1×H×W

  const auto lv = labels.values<std::uint8_t>();
  const std::size_t max_label = *std::max_element(lv.begin(), lv.end());  // N > 0: IDX has no zero dimension
  if (classes == 0) classes = max_label + 1;
  if (max_label >= classes) {
    auto at = static_cast<std::size_t>(std::find_if(lv.begin(), lv.end(), [&](auto l) { return l >= classes; }) -
                                       lv.begin());
    throw format_error(lpath, 8 + at,
                       "label " + std::to_string(lv[at]) + " of sample " + std::to_string(at) +
                           " is out of range for " + std::to_string(classes) + " classes");
  }
  ds.classes = classes;
  ds.labels.assign(lv.begin(), lv.end());
  // Keep the decoded buffer as it is: no copy, and no 4x larger float array to fault in.
  ds.pixels = std::move(images).release_values<std::uint8_t>();
  ds.set_normalization(options.normalize);
  return ds;
}

namespace {
std::filesystem::path pick(const std::filesystem::path& dir, const std::string& stem) {
  auto gz = dir / (stem + ".gz");
  if (std::filesystem::exists(gz)) return gz;
  auto raw = dir / stem;
  if (std::filesystem::exists(raw)) return raw;
  return gz;  // read_idx reports that it is missing, naming the file
}
}  // namespace

std::array<std::filesystem::path, 2> fashion_mnist_files(const std::filesystem::path& dir, split which) {
  const std::string prefix = which == split::train ? "train" : "t10k";
  return {pick(dir, prefix + "-images-idx3-ubyte"), pick(dir, prefix + "-labels-idx1-ubyte")};
}

dataset load_fashion_mnist(const std::filesystem::path& dir, split which, const load_options& options) {
  const auto [images, labels] = fashion_mnist_files(dir, which);
  dataset ds = load_idx_pair(images, labels, options, 10);
  if (ds.sample_shape != std::vector<std::size_t>{1, 28, 28}) throw format_error(images.string(), 8, "Fashion-MNIST images are 28x28");
  return ds;
}

std::string_view fashion_mnist_class_name(std::int32_t label) {
  static constexpr std::array<std::string_view, 10> names = {
      "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"};
  if (label < 0 || label >= 10) return "?";
  return names[static_cast<std::size_t>(label)];
}

}  // namespace nerve::data

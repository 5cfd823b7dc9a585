#include "layers/data/dataset.hpp"

#include "layers/data/format_error.hpp"
#include "layers/data/idx.hpp"
#include "layers/data/npy.hpp"

#include <algorithm>
#include <array>
#include <limits>
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
  value_normalization = norm;
}

float dataset::zero_value() const noexcept {
  if (values.empty()) return pixel_value[0];
  return value_normalization ? (0.0f - value_normalization->mean) / value_normalization->std : 0.0f;
}

void dataset::copy_row(std::size_t i, std::span<float> out) const {
  const std::size_t f = features();
  if (i >= size()) throw std::out_of_range("dataset: sample " + std::to_string(i) + " of " + std::to_string(size()));
  if (out.size() != f) {
    throw std::invalid_argument("dataset: a row has " + std::to_string(f) + " values, the output " +
                                std::to_string(out.size()));
  }
  if (!values.empty()) {
    const float* src = values.data() + i * f;
    if (!value_normalization) {
      std::copy(src, src + f, out.begin());
      return;
    }
    const float mean = value_normalization->mean, std = value_normalization->std;
    for (std::size_t k = 0; k < f; ++k) out[k] = (src[k] - mean) / std;
    return;
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
  if (images.type() != idx_type::u8 && images.type() != idx_type::f32)
    throw format_error(ipath, 2,
                       "samples must be u8 or f32, the file holds " + std::string(idx_type_name(images.type())));
  if (labels.type() != idx_type::u8 && labels.type() != idx_type::i32)
    throw format_error(lpath, 2,
                       "labels must be u8 or i32, the file holds " + std::string(idx_type_name(labels.type())));
  if (images.shape().size() < 2) {
    throw format_error(ipath, 3,
                       "samples must have 2 or more dimensions (N, then the sample shape), the file has " +
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

  std::vector<std::int32_t> lv;
  if (labels.type() == idx_type::u8) {
    const auto u = labels.values<std::uint8_t>();
    lv.assign(u.begin(), u.end());
  } else {
    const auto i = labels.values<std::int32_t>();
    lv.assign(i.begin(), i.end());
  }
  const std::size_t item = labels.type() == idx_type::u8 ? 1 : 4;
  const std::uint64_t label_data_at = 4 + 4 * labels.shape().size();
  auto bad = std::find_if(lv.begin(), lv.end(), [](auto l) { return l < 0; });
  if (bad != lv.end()) {
    const auto at = static_cast<std::size_t>(bad - lv.begin());
    throw format_error(lpath, label_data_at + item * at,
                       "label " + std::to_string(lv[at]) + " of sample " + std::to_string(at) + " is negative");
  }
  const std::size_t max_label = static_cast<std::size_t>(*std::max_element(lv.begin(), lv.end()));  // N > 0: IDX has no zero dimension
  if (classes == 0) classes = max_label + 1;
  if (max_label >= classes) {
    auto at = static_cast<std::size_t>(
        std::find_if(lv.begin(), lv.end(), [&](auto l) { return std::size_t(l) >= classes; }) - lv.begin());
    throw format_error(lpath, label_data_at + item * at,
                       "label " + std::to_string(lv[at]) + " of sample " + std::to_string(at) +
                           " is out of range for " + std::to_string(classes) + " classes");
  }
  ds.classes = classes;
  ds.labels = std::move(lv);
  // Keep the decoded buffer as it is: no copy, and no 4x larger float array to fault in.
  if (images.type() == idx_type::u8) ds.pixels = std::move(images).release_values<std::uint8_t>();
  else ds.values = std::move(images).release_values<float>();
  ds.set_normalization(options.normalize);
  return ds;
}

dataset load_npy_pair(const std::filesystem::path& inputs_path, const std::filesystem::path& labels_path,
                      const load_options& options, std::size_t classes) {
  const npy_array inputs = read_npy(inputs_path);
  const npy_array labels = read_npy(labels_path);
  const std::string ipath = inputs_path.string(), lpath = labels_path.string();
  const std::string idescr(npy_descr(inputs.type)), ldescr(npy_descr(labels.type));
  if (inputs.type != npy_type::f32 && inputs.type != npy_type::u8)
    throw format_error(ipath, format_error::no_offset,
                       "descr '" + idescr + "': inputs must be float32 ('<f4') or uint8 ('|u1') (save x.astype(np.float32))");
  if (inputs.shape.size() < 2)
    throw format_error(ipath, format_error::no_offset,
                       "shape " + npy_shape_text(inputs.shape) +
                           ": inputs need 2 or more dimensions (N, then the shape of a sample)");
  if (inputs.shape[0] == 0) throw format_error(ipath, format_error::no_offset, "shape " + npy_shape_text(inputs.shape) + ": no samples");
  for (std::size_t d = 1; d < inputs.shape.size(); ++d)
    if (inputs.shape[d] == 0)
      throw format_error(ipath, format_error::no_offset,
                         "shape " + npy_shape_text(inputs.shape) + ": a sample has no values");
  if (!labels.is_integer())
    throw format_error(lpath, format_error::no_offset,
                       "descr '" + ldescr + "': labels must be integers (|u1, |i1, <u2, <i2, <u4, <i4, <u8, <i8; save "
                       "y.astype(np.int64))");
  if (labels.shape.size() != 1)
    throw format_error(lpath, format_error::no_offset,
                       "shape " + npy_shape_text(labels.shape) + ": labels must have 1 dimension, [N]");
  if (inputs.shape[0] != labels.shape[0])
    throw format_error(ipath, format_error::no_offset,
                       std::to_string(inputs.shape[0]) + " samples but " + lpath + " holds " +
                           std::to_string(labels.shape[0]) + " labels");

  dataset ds;
  ds.sample_shape.assign(inputs.shape.begin() + 1, inputs.shape.end());
  if (ds.sample_shape.size() == 2) ds.sample_shape.insert(ds.sample_shape.begin(), 1);  // N×H×W -> N×1×H×W
  const std::size_t n = labels.shape[0];
  const std::size_t item = labels.data.size() / n;
  auto label_error = [&](std::size_t i, std::int64_t v, const std::string& why) {
    return format_error(lpath, labels.data_offset + item * i,
                        "label " + std::to_string(v) + " of sample " + std::to_string(i) + " " + why);
  };
  std::int64_t max_label = 0;
  ds.labels.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t v = labels.integer(i);
    if (v < 0) throw label_error(i, v, labels.type == npy_type::u64 ? "is out of range" : "is negative");
    if (v > std::numeric_limits<std::int32_t>::max() - 1) throw label_error(i, v, "is out of range");
    max_label = std::max(max_label, v);
    ds.labels[i] = static_cast<std::int32_t>(v);
  }
  if (classes == 0) classes = static_cast<std::size_t>(max_label) + 1;
  for (std::size_t i = 0; i < n; ++i)
    if (static_cast<std::size_t>(ds.labels[i]) >= classes)
      throw label_error(i, ds.labels[i], "is out of range for " + std::to_string(classes) + " classes");
  ds.classes = classes;
  if (inputs.type == npy_type::u8) ds.pixels = inputs.bytes();
  else ds.values = inputs.floats();
  ds.set_normalization(options.normalize);
  return ds;
}

dataset make_dataset(std::vector<float> values, std::vector<std::int32_t> labels, std::vector<std::size_t> sample_shape,
                     std::size_t classes, const load_options& options) {
  dataset ds;
  ds.sample_shape = std::move(sample_shape);
  const std::size_t f = ds.features();
  if (f == 0) throw std::invalid_argument("make_dataset: the sample shape has no values");
  if (values.size() != labels.size() * f)
    throw std::invalid_argument("make_dataset: " + std::to_string(labels.size()) + " labels of samples of " +
                                std::to_string(f) + " values need " + std::to_string(labels.size() * f) +
                                " values, got " + std::to_string(values.size()));
  std::int64_t max_label = -1;
  for (std::size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] < 0)
      throw std::invalid_argument("make_dataset: label " + std::to_string(labels[i]) + " of sample " +
                                  std::to_string(i) + " is negative");
    max_label = std::max<std::int64_t>(max_label, labels[i]);
  }
  if (classes == 0) classes = static_cast<std::size_t>(max_label + 1);
  for (std::size_t i = 0; i < labels.size(); ++i)
    if (static_cast<std::size_t>(labels[i]) >= classes)
      throw std::invalid_argument("make_dataset: label " + std::to_string(labels[i]) + " of sample " +
                                  std::to_string(i) + " is out of range for " + std::to_string(classes) + " classes");
  ds.classes = classes;
  ds.values = std::move(values);
  ds.labels = std::move(labels);
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

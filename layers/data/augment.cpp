#include "layers/data/augment.hpp"

#include "layers/data/batcher.hpp"

#include <algorithm>
#include <stdexcept>
#include <vector>

namespace nerve::data {

namespace {

/// `[1, 28, 28]`, as the trainer's messages write shapes.
std::string augment_shape_text(std::span<const std::size_t> shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

augment_options parse_augment(std::string_view text) {
  augment_options o;
  bool crop_seen = false;
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = text.find(',', start);
    const std::string_view item = text.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    const std::string shown(item);
    if (item == "flip") {
      if (o.flip) throw std::invalid_argument("--augment '" + std::string(text) + "': flip is given twice");
      o.flip = true;
    } else if (item.starts_with("crop=")) {
      if (crop_seen) throw std::invalid_argument("--augment '" + std::string(text) + "': crop is given twice");
      crop_seen = true;
      const std::string_view digits = item.substr(5);
      std::size_t n = 0;
      bool ok = !digits.empty() && digits.size() <= 4;
      for (char c : digits) {
        if (c < '0' || c > '9') ok = false;
        else n = n * 10 + std::size_t(c - '0');
      }
      if (!ok || n < 1 || n > max_augment_crop)
        throw std::invalid_argument("--augment '" + std::string(text) + "': " + shown + ": the padding must be a whole number from 1 to " +
                                    std::to_string(max_augment_crop));
      o.crop = n;
    } else {
      throw std::invalid_argument("--augment '" + std::string(text) + "': unknown '" + shown +
                                  "' (crop=N: a random crop after zero padding by N; flip: a random horizontal flip)");
    }
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return o;
}

std::string augment_text(const augment_options& o) {
  std::string s;
  if (o.crop > 0) s = "crop=" + std::to_string(o.crop);
  if (o.flip) s += s.empty() ? "flip" : ",flip";
  return s;
}

void check_augment(const augment_options& o, std::span<const std::size_t> shape) {
  if (!o.any()) return;
  if (shape.size() != 3)
    throw std::invalid_argument("--augment " + augment_text(o) + " crops and flips images, samples of C×H×W; the data's are " +
                                augment_shape_text(shape));
  const std::size_t side = std::min(shape[1], shape[2]);
  if (o.crop > side)
    throw std::invalid_argument("--augment " + augment_text(o) + ": the padding must be at most " + std::to_string(side) +
                                ", the smaller side of the data's samples of " + augment_shape_text(shape));
}

std::uint64_t augment_draw(std::uint64_t seed, std::uint64_t epoch, std::uint64_t index) noexcept {
  return splitmix64(epoch_seed(seed, epoch) ^ splitmix64(~index));
}

void augment_sample(const augment_options& o, std::uint64_t u, std::span<const std::size_t> shape, float pad,
                    std::span<float> sample) {
  if (!o.any()) return;
  if (shape.size() != 3 || shape[0] * shape[1] * shape[2] != sample.size())
    throw std::invalid_argument("augment: a sample of " + augment_shape_text(shape) + " in " +
                                std::to_string(sample.size()) + " floats");
  const std::size_t c = shape[0], h = shape[1], w = shape[2];
  const bool flip = o.flip && (u >> 63) != 0;
  std::ptrdiff_t dy = 0, dx = 0;  // the window's shift against the sample: dy - N, dx - N
  if (o.crop > 0) {
    const std::uint64_t span = 2 * o.crop + 1;
    dy = std::ptrdiff_t(((u >> 32) & 0x7fffffffULL) % span) - std::ptrdiff_t(o.crop);
    dx = std::ptrdiff_t((u & 0xffffffffULL) % span) - std::ptrdiff_t(o.crop);
  }
  if (dy == 0 && dx == 0 && !flip) return;
  std::vector<float> in(sample.begin(), sample.end());
  const auto hh = std::ptrdiff_t(h), ww = std::ptrdiff_t(w);
  for (std::size_t ch = 0; ch < c; ++ch) {
    const float* plane = in.data() + ch * h * w;
    float* out = sample.data() + ch * h * w;
    for (std::ptrdiff_t y = 0; y < hh; ++y) {
      const std::ptrdiff_t sy = y + dy;
      for (std::ptrdiff_t x = 0; x < ww; ++x) {
        const std::ptrdiff_t cx = flip ? ww - 1 - x : x;  // the flip reads the cropped row backwards
        const std::ptrdiff_t sx = cx + dx;
        out[y * ww + x] = sy >= 0 && sy < hh && sx >= 0 && sx < ww ? plane[sy * ww + sx] : pad;
      }
    }
  }
}

void augment_batch(const augment_options& o, std::uint64_t seed, std::uint64_t epoch,
                   std::span<const std::uint32_t> indices, std::span<const std::size_t> shape, float pad,
                   std::span<float> rows) {
  if (!o.any()) return;
  std::size_t f = 1;
  for (std::size_t d : shape) f *= d;
  if (rows.size() != indices.size() * f)
    throw std::invalid_argument("augment: " + std::to_string(indices.size()) + " rows of " + std::to_string(f) +
                                " floats, got " + std::to_string(rows.size()));
  for (std::size_t r = 0; r < indices.size(); ++r)
    augment_sample(o, augment_draw(seed, epoch, indices[r]), shape, pad, rows.subspan(r * f, f));
}

}  // namespace nerve::data

#pragma once
/// \file
/// The per-sample shape of a tensor: `[784]` for a feature vector, `[C, H, W]` for an image.

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace nerve::layers {

/// The dimensions of one sample, batch excluded (`[1, 28, 28]`, `[784]`).
///
/// A value type; any thread may use its own copy.
class shape {
 public:
  shape() = default;
  shape(std::initializer_list<std::int64_t> dims) : dims_(dims) {}
  explicit shape(std::vector<std::int64_t> dims) : dims_(std::move(dims)) {}

  /// Number of dimensions.
  std::size_t rank() const noexcept { return dims_.size(); }
  /// Dimension `i` (no bounds check).
  std::int64_t operator[](std::size_t i) const noexcept { return dims_[i]; }
  /// The dimensions as a vector.
  const std::vector<std::int64_t>& dims() const noexcept { return dims_; }
  /// Product of the dimensions: the number of scalars per sample (1 for rank 0).
  std::int64_t numel() const noexcept {
    std::int64_t n = 1;
    for (auto d : dims_) n *= d;
    return n;
  }
  /// `[1, 28, 28]`.
  std::string to_string() const {
    std::string s = "[";
    for (std::size_t i = 0; i < dims_.size(); ++i) {
      if (i) s += ", ";
      s += std::to_string(dims_[i]);
    }
    return s + "]";
  }
  friend bool operator==(const shape&, const shape&) = default;

 private:
  std::vector<std::int64_t> dims_;
};

}  // namespace nerve::layers

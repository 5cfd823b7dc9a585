#pragma once
/// \file
/// `basic_tensor`: a batch-first, row-major tensor on Eigen, moved and never copied by accident.

#include <Eigen/Core>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "layers/shape.hpp"

namespace nerve::layers {

/// A batch of samples: an `N × F` row-major Eigen matrix plus the per-sample shape.
///
/// Row `n` is sample `n`, flattened in C order: an image batch `N×C×H×W` is stored
/// as `N × (C·H·W)`, exactly PyTorch's contiguous NCHW layout. Parameters use the
/// same type: a Linear weight `out×in` is a tensor of batch `out` and shape `[in]`.
///
/// Copying is deleted so a tensor travels through messages by move only; when a
/// copy is really wanted, `clone()` says so in the code. Not thread-safe: one
/// owner at a time, as for any value.
template <class Scalar>
class basic_tensor {
 public:
  using scalar_type = Scalar;
  /// The storage: row-major, one sample per row.
  using matrix_type = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

  /// An empty tensor (batch 0, rank-0 shape).
  basic_tensor() = default;
  /// `batch` samples of `sample_shape`, contents uninitialised.
  basic_tensor(std::int64_t batch, layers::shape sample_shape)
      : matrix_(batch, sample_shape.numel()), shape_(std::move(sample_shape)) {}
  /// Adopts `m` (moved) as `m.rows()` samples of `sample_shape`; throws if the sizes disagree.
  basic_tensor(matrix_type m, layers::shape sample_shape) : matrix_(std::move(m)), shape_(std::move(sample_shape)) {
    if (matrix_.cols() != shape_.numel())
      throw std::invalid_argument("tensor: matrix has " + std::to_string(matrix_.cols()) +
                                  " columns but shape " + shape_.to_string() + " needs " +
                                  std::to_string(shape_.numel()));
  }

  basic_tensor(basic_tensor&&) noexcept = default;
  basic_tensor& operator=(basic_tensor&&) noexcept = default;
  basic_tensor(const basic_tensor&) = delete;
  basic_tensor& operator=(const basic_tensor&) = delete;
  ~basic_tensor() = default;

  /// `batch` samples of zeros.
  static basic_tensor zeros(std::int64_t batch, layers::shape sample_shape) {
    basic_tensor t(batch, std::move(sample_shape));
    t.matrix_.setZero();
    return t;
  }
  /// `batch` samples filled with `value`.
  static basic_tensor constant(std::int64_t batch, layers::shape sample_shape, Scalar value) {
    basic_tensor t(batch, std::move(sample_shape));
    t.matrix_.setConstant(value);
    return t;
  }

  /// An explicit deep copy.
  basic_tensor clone() const {
    basic_tensor t;
    t.matrix_ = matrix_;
    t.shape_ = shape_;
    return t;
  }
  /// A deep copy of samples `[first, first + count)`.
  basic_tensor slice(std::int64_t first, std::int64_t count) const {
    if (first < 0 || count < 0 || first + count > batch())
      throw std::out_of_range("tensor: slice [" + std::to_string(first) + ", " + std::to_string(first + count) +
                              ") of a batch of " + std::to_string(batch()));
    return basic_tensor(matrix_type(matrix_.middleRows(first, count)), shape_);
  }
  /// A copy converted to another scalar type (float <-> double for gradient checks).
  template <class Other>
  basic_tensor<Other> cast() const {
    return basic_tensor<Other>(matrix_.template cast<Other>(), shape_);
  }

  /// Number of samples (rows).
  std::int64_t batch() const noexcept { return matrix_.rows(); }
  /// Scalars per sample (columns) = `sample_shape().numel()`.
  std::int64_t features() const noexcept { return matrix_.cols(); }
  /// Total number of scalars.
  std::int64_t size() const noexcept { return matrix_.size(); }
  /// True when the tensor holds no scalars.
  bool empty() const noexcept { return matrix_.size() == 0; }
  /// The shape of one sample.
  const layers::shape& sample_shape() const noexcept { return shape_; }
  /// The full shape, batch first: `[N, C, H, W]`.
  std::vector<std::int64_t> full_shape() const {
    std::vector<std::int64_t> s{batch()};
    s.insert(s.end(), shape_.dims().begin(), shape_.dims().end());
    return s;
  }
  /// Bytes of scalar payload (what a message moving this tensor carries).
  std::size_t payload_bytes() const noexcept { return static_cast<std::size_t>(matrix_.size()) * sizeof(Scalar); }

  /// The storage matrix.
  matrix_type& matrix() noexcept { return matrix_; }
  const matrix_type& matrix() const noexcept { return matrix_; }
  /// Contiguous scalars, row-major.
  Scalar* data() noexcept { return matrix_.data(); }
  const Scalar* data() const noexcept { return matrix_.data(); }
  /// The scalars of sample `n`.
  Scalar* row(std::int64_t n) noexcept { return matrix_.data() + n * matrix_.cols(); }
  const Scalar* row(std::int64_t n) const noexcept { return matrix_.data() + n * matrix_.cols(); }

  /// Reinterprets each sample as `new_shape` (same number of scalars; no data moves).
  void reshape(layers::shape new_shape) {
    if (new_shape.numel() != shape_.numel())
      throw std::invalid_argument("tensor: cannot reshape " + shape_.to_string() + " to " + new_shape.to_string());
    shape_ = std::move(new_shape);
  }
  /// Sets every scalar to zero.
  void set_zero() noexcept { matrix_.setZero(); }
  /// `*this += other` elementwise; shapes must match.
  basic_tensor& operator+=(const basic_tensor& other) {
    if (other.batch() != batch() || other.features() != features())
      throw std::invalid_argument("tensor: cannot add " + other.shape_string() + " to " + shape_string());
    matrix_ += other.matrix_;
    return *this;
  }
  /// `[N, C, H, W]` as text, for messages.
  std::string shape_string() const {
    std::string s = "[" + std::to_string(batch());
    for (auto d : shape_.dims()) s += ", " + std::to_string(d);
    return s + "]";
  }

 private:
  matrix_type matrix_;
  layers::shape shape_;
};

using tensor = basic_tensor<float>;
using tensor_d = basic_tensor<double>;

}  // namespace nerve::layers

#pragma once
/// \file
/// Reader for IDX files (the MNIST / Fashion-MNIST container), raw or gzip.
///
/// An IDX file is a 4-byte magic `00 00 TYPE NDIMS`, then NDIMS big-endian
/// 32-bit dimensions, then the elements in row-major order, big-endian.
/// Gzip input is recognised by its magic bytes (`1f 8b`) and decompressed
/// before it is parsed, so the file name does not matter.

#include "layers/data/format_error.hpp"

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

namespace nerve::data {

/// The element types of the IDX format (the third magic byte).
enum class idx_type : std::uint8_t {
  u8 = 0x08,   ///< unsigned byte (Fashion-MNIST images and labels)
  i8 = 0x09,   ///< signed byte
  i16 = 0x0B,  ///< short, big-endian
  i32 = 0x0C,  ///< int, big-endian
  f32 = 0x0D,  ///< float, big-endian
  f64 = 0x0E,  ///< double, big-endian
};

/// Lower-case name of `type` (`"u8"`, `"f32"`, …).
std::string_view idx_type_name(idx_type type) noexcept;

/// The `idx_type` whose elements are `T`s.
template <class T>
constexpr idx_type idx_type_of() {
  if constexpr (std::is_same_v<T, std::uint8_t>) return idx_type::u8;
  else if constexpr (std::is_same_v<T, std::int8_t>) return idx_type::i8;
  else if constexpr (std::is_same_v<T, std::int16_t>) return idx_type::i16;
  else if constexpr (std::is_same_v<T, std::int32_t>) return idx_type::i32;
  else if constexpr (std::is_same_v<T, float>) return idx_type::f32;
  else return idx_type::f64;
}

/// A parsed IDX array: its shape and its elements in host byte order.
///
/// A value type; safe to read from any thread once built.
class idx_array {
 public:
  /// The element storage, one alternative per `idx_type`.
  using storage = std::variant<std::vector<std::uint8_t>, std::vector<std::int8_t>,
                               std::vector<std::int16_t>, std::vector<std::int32_t>,
                               std::vector<float>, std::vector<double>>;

  idx_array(idx_type type, std::vector<std::size_t> shape, storage values);

  /// The element type read from the magic.
  idx_type type() const noexcept { return type_; }
  /// The dimensions, outermost first (e.g. `{60000, 28, 28}`).
  const std::vector<std::size_t>& shape() const noexcept { return shape_; }
  /// Number of elements (product of the dimensions).
  std::size_t size() const noexcept { return size_; }
  /// Number of elements per outermost index (product of all but the first dimension).
  std::size_t row_size() const noexcept;

  /// The elements as `T`; throws `std::invalid_argument` if `T` is not the stored type.
  template <class T>
  std::span<const T> values() const {
    if (auto* v = std::get_if<std::vector<T>>(&values_)) return {v->data(), v->size()};
    throw_type_mismatch(idx_type_of<T>());
  }

  /// Moves the elements out as `std::vector<T>` (the array is left empty);
  /// throws `std::invalid_argument` if `T` is not the stored type.
  template <class T>
  std::vector<T> release_values() && {
    if (auto* v = std::get_if<std::vector<T>>(&values_)) {
      size_ = 0;
      return std::move(*v);
    }
    throw_type_mismatch(idx_type_of<T>());
  }

  /// The elements converted to float (exact for every type but i32 and f64).
  std::vector<float> to_float() const;

 private:
  [[noreturn]] void throw_type_mismatch(idx_type asked) const;

  idx_type type_;
  std::vector<std::size_t> shape_;
  std::size_t size_;
  storage values_;
};

/// Reads the IDX file at `path`, raw or gzip-compressed.
///
/// Throws `format_error` naming the file, the byte offset and the problem for:
/// a wrong magic, an unknown type, zero dimensions or a zero-sized dimension,
/// a size that overflows, a truncated file, trailing bytes after the data,
/// and corrupt gzip data. Throws `std::system_error` if the file cannot be
/// opened or read. Any thread; no shared state.
idx_array read_idx(const std::filesystem::path& path);

/// Parses an IDX file held in memory (raw or gzip); `name` is used in errors.
idx_array parse_idx(std::span<const std::byte> bytes, std::string_view name = "<memory>");

/// Encodes `shape` and `values` as an uncompressed IDX file (for tests and tools).
template <class T>
std::vector<std::byte> encode_idx(std::span<const std::size_t> shape, std::span<const T> values);

/// Compresses `bytes` into a single-member gzip stream (for tests and tools).
std::vector<std::byte> gzip_compress(std::span<const std::byte> bytes, int level = 6);

}  // namespace nerve::data

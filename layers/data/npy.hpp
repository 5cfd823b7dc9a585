#pragma once
/// \file
/// Reader for NumPy `.npy` files (what `np.save` writes, and what PyTorch users export a
/// dataset as with `np.save("x.npy", t.numpy())`).
///
/// A `.npy` file is the magic `\x93NUMPY`, a major and a minor version byte, the header's
/// length (a little-endian `uint16` in version 1.0, `uint32` in 2.0 and 3.0), the header (a
/// Python dict literal such as `{'descr': '<f4', 'fortran_order': False, 'shape': (60000, 28, 28), }`,
/// padded with spaces and ended by a newline), then the elements. Only what `np.save`
/// writes for plain numbers is read: little-endian (or one-byte) integers and floats in C
/// order; everything else is refused naming the file and the header field.

#include "layers/data/format_error.hpp"

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace nerve::data {

/// The element types read from `.npy` files, by their `descr`.
enum class npy_type : std::uint8_t {
  u8,   ///< `|u1`
  i8,   ///< `|i1`
  u16,  ///< `<u2`
  i16,  ///< `<i2`
  u32,  ///< `<u4`
  i32,  ///< `<i4`
  u64,  ///< `<u8`
  i64,  ///< `<i8`
  f32,  ///< `<f4`
  f64,  ///< `<f8`
};

/// The `descr` NumPy writes for `type` (`"<f4"`, `"|u1"`, …).
std::string_view npy_descr(npy_type type) noexcept;

/// The `npy_type` whose elements are `T`s.
template <class T>
constexpr npy_type npy_type_of();
template <> constexpr npy_type npy_type_of<std::uint8_t>() { return npy_type::u8; }
template <> constexpr npy_type npy_type_of<std::int8_t>() { return npy_type::i8; }
template <> constexpr npy_type npy_type_of<std::uint16_t>() { return npy_type::u16; }
template <> constexpr npy_type npy_type_of<std::int16_t>() { return npy_type::i16; }
template <> constexpr npy_type npy_type_of<std::uint32_t>() { return npy_type::u32; }
template <> constexpr npy_type npy_type_of<std::int32_t>() { return npy_type::i32; }
template <> constexpr npy_type npy_type_of<std::uint64_t>() { return npy_type::u64; }
template <> constexpr npy_type npy_type_of<std::int64_t>() { return npy_type::i64; }
template <> constexpr npy_type npy_type_of<float>() { return npy_type::f32; }
template <> constexpr npy_type npy_type_of<double>() { return npy_type::f64; }

/// A parsed `.npy` array: its type, its shape and its elements as the file holds them
/// (little-endian). A value type; safe to read from any thread once built.
struct npy_array {
  npy_type type = npy_type::u8;
  /// The dimensions, outermost first; empty for a scalar.
  std::vector<std::size_t> shape;
  /// The elements' bytes, `size() * item size` of them, little-endian.
  std::vector<std::byte> data;
  /// The byte offset of the first element in the file (for messages).
  std::size_t data_offset = 0;

  /// Number of elements (product of the dimensions).
  std::size_t size() const noexcept;
  /// Whether the elements are integers (signed or not).
  bool is_integer() const noexcept;
  /// The elements as floats; throws `std::invalid_argument` unless `type` is `f32`.
  std::vector<float> floats() const;
  /// The elements as bytes; throws `std::invalid_argument` unless `type` is `u8`.
  std::vector<std::uint8_t> bytes() const;
  /// Element `i` of an integer array; throws `std::invalid_argument` for a float array.
  /// A `u64` above 2^63 - 1 comes back as -1 (out of range for any use here).
  std::int64_t integer(std::size_t i) const;
};

/// `(60000, 28, 28)`: a shape as the header writes it (`(5,)` for one dimension).
std::string npy_shape_text(std::span<const std::size_t> shape);

/// Reads the `.npy` file at `path`.
///
/// Throws `format_error` naming the file, the byte offset and the problem for: a wrong
/// magic, a version other than 1.0, 2.0 or 3.0, a header length past the end of the file,
/// a header that is no dict of `descr`, `fortran_order` and `shape`, `fortran_order: True`,
/// a big-endian or unknown `descr`, a size that overflows, fewer data bytes than the shape
/// needs and bytes after them. Throws `std::system_error` if the file cannot be read.
/// Any thread; no shared state.
npy_array read_npy(const std::filesystem::path& path);

/// Parses a `.npy` file held in memory; `name` is used in errors.
npy_array parse_npy(std::span<const std::byte> bytes, std::string_view name = "<memory>");

/// Encodes `shape` and `values` as a version 1.0 `.npy` file, as `np.save` writes it
/// (header padded to a multiple of 64 bytes): for tests, tools and the examples.
template <class T>
std::vector<std::byte> encode_npy(std::span<const std::size_t> shape, std::span<const T> values);

/// Writes `encode_npy(shape, values)` to `path` (replacing it); throws `std::system_error`.
template <class T>
void save_npy(const std::filesystem::path& path, std::span<const std::size_t> shape, std::span<const T> values);

}  // namespace nerve::data

#pragma once
/// \file
/// Reader and writer for the safetensors format (Hugging Face).
///
/// A file is an 8-byte little-endian header size N, N bytes of UTF-8 JSON,
/// then the data buffer:
///
/// ```
/// {"__metadata__": {"k": "v"},
///  "fc1.weight": {"dtype": "F32", "shape": [256, 784], "data_offsets": [0, 802816]}, ...}
/// ```
///
/// Offsets are relative to the start of the buffer; the tensors cover it
/// exactly (no holes, no overlap); data is little-endian, row-major. The
/// writer pads the header with spaces so the buffer starts 8-byte aligned and
/// orders tensors by dtype size, then name, as the Python `safetensors` package does.

#include "layers/data/format_error.hpp"

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace nerve::checkpoint {

using data::format_error;

/// The dtypes of the safetensors specification.
enum class dtype { boolean, u8, i8, f8_e5m2, f8_e4m3, i16, u16, f16, bf16, i32, u32, f32, f64, i64, u64 };

/// Bytes per element of `t`.
std::size_t dtype_size(dtype t) noexcept;

/// Header metadata: the `__metadata__` string-to-string map.
using metadata = std::map<std::string, std::string>;

/// One tensor of a parsed file.
struct tensor_info {
  std::string name;
  dtype type = dtype::f32;
  std::vector<std::uint64_t> shape;
  std::uint64_t begin = 0;  ///< offset of the first byte, relative to the buffer
  std::uint64_t end = 0;    ///< one past the last byte, relative to the buffer
  /// Number of elements (1 for a scalar of shape `[]`).
  std::uint64_t elements() const noexcept;
};

/// Largest header accepted, as in the reference implementation (100 MB).
inline constexpr std::uint64_t max_header_size = 100'000'000;

/// A parsed and validated safetensors file, holding its bytes.
///
/// Immutable once built; any thread may read it.
class safetensors_file {
 public:
  /// Reads and validates the file at `path`. The header is read and checked against the
  /// file's size first, so a malformed file is refused before its data is read (a 2 GB
  /// file with a bad header costs a few bytes of reading, not 2 GB). Throws
  /// `format_error` (naming the file, the tensor where there is one, the byte offset and
  /// the problem) or `std::system_error` if it cannot be read.
  static safetensors_file read(const std::filesystem::path& path);
  /// Validates the bytes of a file held in memory (taking them over); `name` is used in errors.
  static safetensors_file parse(std::vector<std::byte> bytes, std::string name = "<memory>");

  /// The file name given to `read`/`parse`.
  const std::string& name() const noexcept { return name_; }
  const checkpoint::metadata& metadata() const noexcept { return metadata_; }
  /// The tensors in buffer order.
  const std::vector<tensor_info>& tensors() const noexcept { return tensors_; }
  /// The tensor named `tensor`, or null.
  const tensor_info* find(std::string_view tensor) const noexcept;
  /// The tensor named `tensor`; throws `std::out_of_range` naming the file and the tensor.
  const tensor_info& at(std::string_view tensor) const;
  /// The raw little-endian bytes of `t`.
  std::span<const std::byte> data(const tensor_info& t) const noexcept;
  /// Where the buffer starts in the file (8 + header size).
  std::uint64_t buffer_offset() const noexcept { return buffer_offset_; }

  /// The elements of `t` converted to float (any floating or integer dtype; F8 rejected).
  std::vector<float> to_float(const tensor_info& t) const;
  /// The elements of `t` as int64 (integer and BOOL dtypes only).
  std::vector<std::int64_t> to_int64(const tensor_info& t) const;

 private:
  safetensors_file() = default;
  /// Validates the 8-byte size and the header (`head`, which holds them when they fit in
  /// `file_size`) against a file of `file_size` bytes; fills all but `bytes_`.
  static void parse_header(safetensors_file& f, std::span<const std::byte> head, std::uint64_t file_size);
  std::string name_;
  std::vector<std::byte> bytes_;
  std::uint64_t buffer_offset_ = 0;
  checkpoint::metadata metadata_;
  std::vector<tensor_info> tensors_;
};

/// A tensor to write: a view of its little-endian bytes (not copied).
struct tensor_ref {
  std::string name;
  dtype type = dtype::f32;
  std::vector<std::uint64_t> shape;
  std::span<const std::byte> bytes;
};

/// A tensor_ref viewing float data.
tensor_ref f32_tensor(std::string name, std::vector<std::uint64_t> shape, std::span<const float> values);
/// A tensor_ref viewing int64 data.
tensor_ref i64_tensor(std::string name, std::vector<std::uint64_t> shape, std::span<const std::int64_t> values);
/// A tensor_ref viewing double data.
tensor_ref f64_tensor(std::string name, std::vector<std::uint64_t> shape, std::span<const double> values);

/// Options for writing.
struct write_options {
  /// Called after each chunk reaches the temporary file with the bytes written so far.
  /// A test hook: if it throws, the write is abandoned, the temporary file removed,
  /// the target left as it was, and the exception propagates.
  std::function<void(std::uint64_t bytes_written)> on_progress;
  /// Bytes per write call (and per `on_progress` call).
  std::size_t chunk_bytes = std::size_t{1} << 20;
};

/// The header of a file holding `tensors` (JSON padded with spaces to a multiple of 8),
/// preceded by its 8-byte size. Throws `std::invalid_argument` for duplicate or reserved
/// names, or data whose size does not match its shape and dtype.
std::vector<std::byte> encode_header(std::span<const tensor_ref> tensors, const metadata& meta = {});

/// The whole file in memory (header and buffer).
std::vector<std::byte> encode_safetensors(std::span<const tensor_ref> tensors, const metadata& meta = {});

/// Writes `tensors` to `path` atomically: a temporary file in the same directory,
/// fsync, rename over `path`, fsync of the directory. A crash at any point leaves
/// either the old file or the new one, never a mix. Throws `std::system_error`
/// naming the file on I/O errors.
void write_safetensors(const std::filesystem::path& path, std::span<const tensor_ref> tensors,
                       const metadata& meta = {}, const write_options& options = {});

}  // namespace nerve::checkpoint

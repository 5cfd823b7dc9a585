#pragma once
/// \file
/// The error thrown when a data or checkpoint file is malformed.

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

namespace nerve::data {

/// A malformed or unreadable file: names the file, the byte offset where the
/// problem was found (when there is one) and what is wrong.
///
/// `what()` reads `FILE: at byte OFFSET: PROBLEM` (or `FILE: PROBLEM` without
/// an offset). For gzip-compressed IDX files the offset counts bytes of the
/// decompressed stream unless the message says otherwise.
class format_error : public std::runtime_error {
 public:
  /// Offset value meaning "no particular byte".
  static constexpr std::uint64_t no_offset = std::numeric_limits<std::uint64_t>::max();

  format_error(std::string file, std::uint64_t offset, const std::string& problem)
      : std::runtime_error(compose(file, offset, problem)),
        file_(std::move(file)),
        offset_(offset) {}

  /// The file (or the name given to an in-memory buffer).
  const std::string& file() const noexcept { return file_; }
  /// The byte offset of the problem, or `no_offset`.
  std::uint64_t offset() const noexcept { return offset_; }

 private:
  static std::string compose(const std::string& file, std::uint64_t offset,
                             const std::string& problem) {
    if (offset == no_offset) return file + ": " + problem;
    return file + ": at byte " + std::to_string(offset) + ": " + problem;
  }

  std::string file_;
  std::uint64_t offset_;
};

}  // namespace nerve::data

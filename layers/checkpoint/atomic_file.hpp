#pragma once
/// \file
/// Crash-safe replacement of a file: write a temporary, fsync, rename, fsync the directory.

#include <cstddef>
#include <filesystem>
#include <span>

namespace nerve::checkpoint {

/// A new version of `target`, written to a temporary file beside it and put in
/// place by `commit()`. Until then the old `target` is untouched; if the object
/// is destroyed without `commit()` (an exception, an early return) the temporary
/// is removed. A crash (SIGKILL, power loss) before the rename leaves the old
/// file intact and at worst a stray `.<name>.tmp-*` file beside it.
///
/// Not thread-safe; one writer per object. Throws `std::system_error` naming
/// the file on any I/O error.
class atomic_file {
 public:
  explicit atomic_file(std::filesystem::path target);
  atomic_file(const atomic_file&) = delete;
  atomic_file& operator=(const atomic_file&) = delete;
  ~atomic_file();

  /// Appends `bytes` to the temporary file.
  void write(std::span<const std::byte> bytes);
  /// fsyncs the temporary, renames it over the target and fsyncs the directory.
  void commit();

  /// The temporary file's path (for tests).
  const std::filesystem::path& temp_path() const noexcept { return temp_; }

 private:
  std::filesystem::path target_;
  std::filesystem::path temp_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace nerve::checkpoint

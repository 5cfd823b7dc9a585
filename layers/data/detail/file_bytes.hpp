#pragma once
/// \file
/// POSIX file helpers shared by the IDX and safetensors readers, the checkpoint writer and
/// the trainer's metrics log (not public API).

#include <cstddef>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace nerve::data::detail {

/// Throws `std::system_error` for the current `errno`, reading `PATH: what`.
[[noreturn]] void throw_errno(const std::filesystem::path& path, const std::string& what);

/// Closes `fd` at the end of its scope.
struct fd_guard {
  int fd;
  ~fd_guard();
};

/// Reads the whole file at `path`; throws `std::system_error` naming the file.
std::vector<std::byte> read_file_bytes(const std::filesystem::path& path);

/// Writes all of `bytes` to `fd` (a write cut short, or by a signal, goes on); false with
/// `errno` set when a write fails.
bool write_all(int fd, std::span<const std::byte> bytes);

}  // namespace nerve::data::detail

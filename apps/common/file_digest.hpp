#pragma once
/// \file
/// `file_digest`: a file's size and a hash of its bytes, for the ranks of a job to compare
/// what each reads from its own disk (`job::agree_inputs`). Header-only, for the apps.

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

namespace nerve::apps {

/// 64-bit FNV-1a of `bytes`, continuing from `hash` (start: the offset basis).
inline std::uint64_t fnv1a(const unsigned char* bytes, std::size_t n,
                           std::uint64_t hash = 0xcbf29ce484222325ull) noexcept {
  for (std::size_t i = 0; i < n; ++i) hash = (hash ^ bytes[i]) * 0x100000001b3ull;
  return hash;
}

/// `<size> bytes, FNV-1a <16 hex digits>` of the file at `path`, read whole (symlinks
/// followed), or `no such file` when there is none: the same text on two ranks means the
/// same bytes but for an accidental collision (FNV-1a is a checksum, not a defence
/// against a file crafted to collide). Throws `std::system_error` naming the file when it
/// exists but cannot be read. Any thread.
inline std::string file_digest(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return "no such file";
    throw std::system_error(errno, std::generic_category(), path.string() + ": cannot open it");
  }
  std::vector<unsigned char> chunk(std::size_t{1} << 20);
  std::uint64_t hash = fnv1a(nullptr, 0), size = 0;
  for (;;) {
    const ssize_t got = ::read(fd, chunk.data(), chunk.size());
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      const int e = errno;
      ::close(fd);
      throw std::system_error(e, std::generic_category(), path.string() + ": cannot read it");
    }
    if (got == 0) break;
    hash = fnv1a(chunk.data(), std::size_t(got), hash);
    size += std::uint64_t(got);
  }
  ::close(fd);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash));
  return std::to_string(size) + " bytes, FNV-1a " + hex;
}

}  // namespace nerve::apps

#include "layers/data/detail/file_bytes.hpp"

#include <cerrno>
#include <string>
#include <system_error>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace nerve::data::detail {

void throw_errno(const std::filesystem::path& path, const std::string& what) {
  throw std::system_error(errno, std::generic_category(), path.string() + ": " + what);
}

fd_guard::~fd_guard() { ::close(fd); }

std::vector<std::byte> read_file_bytes(const std::filesystem::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_errno(path, "cannot open");
  fd_guard guard{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw_errno(path, "cannot stat");
  if (S_ISDIR(st.st_mode)) {
    errno = EISDIR;
    throw_errno(path, "cannot read");
  }
  // One read of the known size; keep reading past it in case the file grew
  // (or is not a regular file and reports no size).
  std::vector<std::byte> bytes(static_cast<std::size_t>(st.st_size > 0 ? st.st_size : 0) + 1);
  std::size_t used = 0;
  for (;;) {
    if (used == bytes.size()) bytes.resize(bytes.size() * 2 + 4096);
    ssize_t n = ::read(fd, bytes.data() + used, bytes.size() - used);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_errno(path, "cannot read");
    }
    if (n == 0) break;
    used += static_cast<std::size_t>(n);
  }
  bytes.resize(used);
  return bytes;
}

bool write_all(int fd, std::span<const std::byte> bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    bytes = bytes.subspan(static_cast<std::size_t>(n));
  }
  return true;
}

}  // namespace nerve::data::detail

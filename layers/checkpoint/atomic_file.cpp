#include "layers/checkpoint/atomic_file.hpp"

#include <atomic>
#include <cerrno>
#include <random>
#include <cstdlib>
#include <string>
#include <system_error>

#include <fcntl.h>
#include <unistd.h>

namespace nerve::checkpoint {

namespace {
[[noreturn]] void throw_errno(const std::filesystem::path& path, const std::string& what) {
  throw std::system_error(errno, std::generic_category(), path.string() + ": " + what);
}
}  // namespace

atomic_file::atomic_file(std::filesystem::path target) : target_(std::move(target)) {
  std::filesystem::path dir = target_.parent_path();
  if (dir.empty()) dir = ".";
  // O_EXCL on a fresh name rather than mkstemp: mkstemp makes the file 0600, and the
  // only way to honour the umask afterwards (umask(0) and back) races with other threads.
  // Mode 0666 here gets the umask applied by the kernel, as any ordinary file does.
  static std::atomic<unsigned> counter{0};
  std::random_device entropy;
  for (int attempt = 0;; ++attempt) {
    std::string name = "." + target_.filename().string() + ".tmp-" + std::to_string(::getpid()) + "-" +
                       std::to_string(counter++) + "-" + std::to_string(entropy());
    temp_ = dir / name;
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ >= 0) break;
    if (errno != EEXIST || attempt == 100) {
      temp_.clear();
      throw_errno(target_, "cannot create a temporary file in " + dir.string());
    }
  }
}

atomic_file::~atomic_file() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !temp_.empty()) ::unlink(temp_.c_str());
}

void atomic_file::write(std::span<const std::byte> bytes) {
  const std::byte* p = bytes.data();
  std::size_t left = bytes.size();
  while (left > 0) {
    ssize_t n = ::write(fd_, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_errno(target_, "cannot write " + temp_.string());
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
}

void atomic_file::commit() {
  if (::fsync(fd_) != 0) throw_errno(target_, "cannot fsync " + temp_.string());
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) throw_errno(target_, "cannot close " + temp_.string());
  if (::rename(temp_.c_str(), target_.c_str()) != 0) throw_errno(target_, "cannot rename " + temp_.string() + " over it");
  committed_ = true;
  // The rename is durable only once the directory entry is: fsync the directory.
  std::filesystem::path dir = target_.parent_path();
  if (dir.empty()) dir = ".";
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) throw_errno(target_, "cannot open directory " + dir.string() + " to fsync it");
  int rc = ::fsync(dfd);
  int saved = errno;
  ::close(dfd);
  if (rc != 0) {
    errno = saved;
    throw_errno(target_, "cannot fsync directory " + dir.string());
  }
}

}  // namespace nerve::checkpoint

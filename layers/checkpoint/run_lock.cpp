#include "layers/checkpoint/run_lock.hpp"

#include "layers/checkpoint/atomic_file.hpp"

#include <cerrno>
#include <stdexcept>
#include <string>
#include <system_error>

#include <fcntl.h>
#include <signal.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

namespace nerve::checkpoint {

namespace {

[[noreturn]] void fail(int err, const std::string& what) { throw std::system_error(err, std::generic_category(), what); }

/// What the holder of `fd`'s lock wrote there: "PID 1234". A holder writes its PID just
/// after it takes the lock, over the PID of a run that died holding it; one caught in
/// between (an empty file, or a PID no longer alive) is given a moment (at most 0.2 s) to
/// finish, so the refusal can name it.
std::string holder_of(int fd) {
  for (int tries = 0; tries < 200; ++tries) {
    char buf[32] = {};
    const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
    if (n > 0) {
      const std::string text(buf, std::size_t(n));
      const auto end = text.find_first_not_of("0123456789");
      if (end > 0 && end < 10 && text[end] == '\n') {
        const auto pid = std::stol(text.substr(0, end));
        if (pid > 0 && (::kill(pid_t(pid), 0) == 0 || errno != ESRCH)) return "PID " + text.substr(0, end);
      }
    }
    if (n < 0) break;
    const timespec pause{0, 1'000'000};
    ::nanosleep(&pause, nullptr);
  }
  return "PID unknown";
}

bool same_inode(int fd, const std::filesystem::path& path) {
  struct stat held {}, named {};
  return ::fstat(fd, &held) == 0 && ::stat(path.c_str(), &named) == 0 && held.st_dev == named.st_dev &&
         held.st_ino == named.st_ino;
}

}  // namespace

std::filesystem::path run_lock::lock_file(const std::filesystem::path& path) {
  const auto target = replace_target(path);
  return target.parent_path() / ("." + target.filename().string() + ".lock");
}

run_lock::run_lock(const std::filesystem::path& path, std::string_view flag) : lock_(lock_file(path)) {
  const std::string named = std::string(flag) + " '" + path.string() + "'";
  // A run that ends removes its lock file while it still holds the lock. A run that
  // opened that file just before then locks a file no longer at the name: it looks
  // again, and takes (or finds held) the file that is there now.
  for (int attempt = 0;; ++attempt) {
    bool writable = true;
    int fd = ::open(lock_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
    if (fd < 0 && errno == EACCES) {  // another user's lock file: a read-only descriptor locks as well
      writable = false;
      fd = ::open(lock_.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    }
    if (fd < 0) fail(errno, named + ": cannot open its lock file " + lock_.string());
    int locked;
    do locked = ::flock(fd, LOCK_EX | LOCK_NB);
    while (locked != 0 && errno == EINTR);
    if (locked != 0) {
      const int err = errno;
      if (err == EWOULDBLOCK) {
        const auto holder = holder_of(fd);
        ::close(fd);
        throw std::invalid_argument(named + " is in use by another run (" + holder + ", lock file '" +
                                    lock_.string() + "'): give each run its own file, or wait for that one to end");
      }
      ::close(fd);
      fail(err, named + ": cannot lock " + lock_.string());
    }
    if (same_inode(fd, lock_)) {
      fd_ = fd;
      if (!writable) return;
      break;
    }
    ::close(fd);
    if (attempt == 100) fail(EAGAIN, named + ": its lock file " + lock_.string() + " keeps being replaced");
  }
  // Written over the last holder's PID, then cut to length: a reader sees one PID or the other.
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::pwrite(fd_, pid.data(), pid.size(), 0) != ssize_t(pid.size()) || ::ftruncate(fd_, off_t(pid.size())) != 0) {
    const int err = errno ? errno : EIO;
    ::unlink(lock_.c_str());
    ::close(fd_);
    fail(err, named + ": cannot write its lock file " + lock_.string());
  }
}

run_lock::~run_lock() {
  // Removed only while it is still ours: someone may have deleted it and another run
  // made a new one at the name.
  if (same_inode(fd_, lock_)) ::unlink(lock_.c_str());
  ::close(fd_);
}

}  // namespace nerve::checkpoint

#include "layers/checkpoint/atomic_file.hpp"

#include "layers/data/detail/file_bytes.hpp"

#include <atomic>
#include <cerrno>
#include <random>
#include <stdexcept>
#include <cstdlib>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

namespace nerve::checkpoint {

using data::detail::throw_errno;

namespace {
const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISREG(mode)) return "a regular file";
  return "not a regular file";
}

/// `target` once its directory is one this process can create the temporary file in:
/// else the run would find out only when it writes, after the work is done.
std::filesystem::path in_usable_directory(const std::filesystem::path& path, const std::filesystem::path& target) {
  std::filesystem::path dir = target.parent_path();
  if (dir.empty()) dir = ".";
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    if (errno == ENOENT)
      throw std::invalid_argument("'" + path.string() + "': the directory '" + dir.string() + "' does not exist");
    throw_errno(path, "cannot inspect " + dir.string());
  }
  if (!S_ISDIR(st.st_mode))
    throw std::invalid_argument("'" + path.string() + "': '" + dir.string() + "' is " + file_kind(st.st_mode) +
                                ", not a directory");
  if (::access(dir.c_str(), W_OK | X_OK) != 0) throw_errno(path, "cannot create files in " + dir.string());
  return target;
}
}  // namespace

std::filesystem::path replace_target(const std::filesystem::path& path) {
  std::filesystem::path at = path;
  for (int hops = 0;; ++hops) {
    struct stat st {};
    if (::lstat(at.c_str(), &st) != 0) {
      // A new file (or a dangling link's target); ENOTDIR: a file where its directory should be.
      if (errno == ENOENT || errno == ENOTDIR) return in_usable_directory(path, at);
      throw_errno(path, "cannot inspect " + at.string());
    }
    if (S_ISREG(st.st_mode)) return in_usable_directory(path, at);
    const std::string where = at == path ? "'" + path.string() + "'" : "'" + path.string() + "' leads to '" + at.string() + "', which";
    if (!S_ISLNK(st.st_mode))
      throw std::invalid_argument(where + " is " + file_kind(st.st_mode) +
                                  ", not a regular file: refusing to replace it");
    if (hops == 40) throw std::invalid_argument("'" + path.string() + "': more than 40 symlinks in a row (a loop?)");
    const auto link = std::filesystem::read_symlink(at);
    at = link.is_absolute() ? link : at.parent_path() / link;
  }
}

namespace {
/// The writer's PID in `name` when it is a temporary of `prefix` (`.<name>.tmp-`): a
/// PID, then one or two `-<number>` (the trace writer's counter; atomic_file's counter and
/// random number); 0 for any other name.
pid_t temporary_writer(std::string_view name, std::string_view prefix) {
  if (!name.starts_with(prefix)) return 0;
  name.remove_prefix(prefix.size());
  std::vector<std::string_view> parts;
  for (std::size_t from = 0;;) {
    const auto dash = name.find('-', from);
    parts.push_back(name.substr(from, dash == std::string_view::npos ? std::string_view::npos : dash - from));
    if (dash == std::string_view::npos) break;
    from = dash + 1;
  }
  if (parts.size() < 2 || parts.size() > 3) return 0;
  for (auto p : parts)
    if (p.empty() || p.size() > 20 || p.find_first_not_of("0123456789") != std::string_view::npos) return 0;
  if (parts[0].size() > 9) return 0;  // more than any pid_t
  const long pid = std::strtol(std::string(parts[0]).c_str(), nullptr, 10);
  return pid > 0 ? pid_t(pid) : 0;
}
}  // namespace

std::size_t remove_orphaned_temporaries(const std::filesystem::path& target) {
  std::filesystem::path file;
  try {
    file = replace_target(target);
  } catch (const std::exception&) {
    return 0;  // check_options names what is wrong with the target
  }
  std::filesystem::path dir = file.parent_path();
  if (dir.empty()) dir = ".";
  const std::string prefix = "." + file.filename().string() + ".tmp-";
  std::size_t removed = 0;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const auto name = it->path().filename().string();
    const pid_t pid = temporary_writer(name, prefix);
    if (pid == 0 || pid == ::getpid()) continue;
    // EPERM: alive, another user's. Only ESRCH says no such process.
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;
    if (::unlink(it->path().c_str()) == 0) ++removed;
  }
  return removed;
}

atomic_file::atomic_file(std::filesystem::path target) : target_(replace_target(target)) {
  struct stat old {};
  const bool replacing = ::stat(target_.c_str(), &old) == 0;
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
  // A 0600 checkpoint stays 0600: the replacement takes the old file's permission bits.
  if (replacing && ::fchmod(fd_, old.st_mode & 07777) != 0) {
    const std::system_error error(errno, std::generic_category(),
                                  target_.string() + ": cannot give the temporary file the mode of the old one");
    ::close(fd_);  // a constructor that throws runs no destructor
    ::unlink(temp_.c_str());
    throw error;
  }
}

atomic_file::~atomic_file() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !temp_.empty()) ::unlink(temp_.c_str());
}

void atomic_file::write(std::span<const std::byte> bytes) {
  if (!data::detail::write_all(fd_, bytes)) throw_errno(target_, "cannot write " + temp_.string());
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
  data::detail::fd_guard guard{dfd};  // closed after the error is made, errno read
  if (::fsync(dfd) != 0) throw_errno(target_, "cannot fsync directory " + dir.string());
}

}  // namespace nerve::checkpoint

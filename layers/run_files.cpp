#include "layers/run_files.hpp"

#include <cerrno>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>

#include <sys/stat.h>
#include <unistd.h>

#include "layers/checkpoint/atomic_file.hpp"
#include "layers/data/detail/file_bytes.hpp"

namespace nerve::layers {

namespace {

/// How two paths are compared: the file an existing path names, or the name a new one
/// will have (its symlinks followed, as the writers follow them).
struct file_identity {
  bool exists = false;
  dev_t dev = 0;
  ino_t ino = 0;
  std::filesystem::path name;

  bool operator==(const file_identity& other) const {
    if (exists != other.exists) return false;  // a file not there yet is none that is
    return exists ? dev == other.dev && ino == other.ino : name == other.name;
  }
};

file_identity identify(const std::filesystem::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) return {true, st.st_dev, st.st_ino, {}};
  std::filesystem::path name = path;
  try {
    name = checkpoint::replace_target(path);  // a dangling symlink: the file it will make
  } catch (const std::exception&) {
    // Not a place a file can be written: check_options names it; compare the name as given.
  }
  std::error_code ec;
  auto resolved = std::filesystem::weakly_canonical(std::filesystem::absolute(name, ec), ec);
  return {false, 0, 0, ec ? name.lexically_normal() : resolved};
}

}  // namespace

void check_distinct_files(const train_options& o) {
  struct file {
    const char* flag;
    const std::filesystem::path& path;
    bool written;
  };
  const file files[] = {{"--init", o.init, false},         {"--resume", o.resume, false},
                        {"--save", o.save, true},          {"--checkpoint", o.checkpoint, true},
                        {"--trace", o.trace, true},        {"--metrics", o.metrics, true},
                        {"--save-best", o.save_best, true}};
  std::vector<std::pair<const file*, file_identity>> named;
  for (const auto& f : files)
    if (!f.path.empty()) named.emplace_back(&f, identify(f.path));
  for (std::size_t j = 1; j < named.size(); ++j)
    for (std::size_t i = 0; i < j; ++i) {
      const file& a = *named[i].first;
      const file& b = *named[j].first;
      if (!a.written && !b.written) continue;  // reading one file twice harms nothing
      if (&a.path == &o.resume && &b.path == &o.checkpoint) continue;  // a resumed run saves where it was
      if (!(named[i].second == named[j].second)) continue;
      std::string message = std::string(b.flag) + " '" + b.path.string() + "' is the file " + a.flag +
                            " names: give each its own file";
      if (a.path != b.path) message += " (" + std::string(a.flag) + " '" + a.path.string() + "' is the same file by another name)";
      throw std::invalid_argument(message);
    }
}

run_files::run_files(const train_options& o) {
  if (!o.lead) return;  // the files are the lead's
  if (!o.checkpoint.empty()) checkpoint_.emplace(o.checkpoint, "--checkpoint");
  if (!o.metrics.empty()) metrics_.emplace(o.metrics, "--metrics");
  for (const auto* target : {&o.save, &o.checkpoint, &o.trace})
    if (!target->empty()) checkpoint::remove_orphaned_temporaries(*target);
}

void end_at_last_line(int fd, const std::filesystem::path& name) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) data::detail::throw_errno(name, "cannot inspect it");
  // Read backwards in blocks to the last newline: a metrics line is a few hundred bytes.
  off_t end = st.st_size;
  char block[4096];
  while (end > 0) {
    const off_t from = end > off_t(sizeof block) ? end - off_t(sizeof block) : 0;
    const auto want = std::size_t(end - from);
    std::size_t got = 0;
    while (got < want) {
      const ssize_t n = ::pread(fd, block + got, want - got, from + off_t(got));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        if (n == 0) errno = EIO;
        data::detail::throw_errno(name, "cannot read it");
      }
      got += std::size_t(n);
    }
    for (std::size_t k = want; k > 0; --k)
      if (block[k - 1] == '\n') {
        const off_t keep = from + off_t(k);
        if (keep != st.st_size && ::ftruncate(fd, keep) != 0)
          data::detail::throw_errno(name, "cannot cut the torn line at its end");
        return;
      }
    end = from;
  }
  if (st.st_size > 0 && ::ftruncate(fd, 0) != 0) data::detail::throw_errno(name, "cannot cut the torn line at its end");
}

bool append_whole_line(int fd, std::span<const std::byte> line) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return false;
  if (data::detail::write_all(fd, line)) return true;
  const int err = errno;
  // Truncating shrinks the file, which a full disk or a file size limit allows.
  while (::ftruncate(fd, st.st_size) != 0 && errno == EINTR) {
  }
  errno = err;
  return false;
}

}  // namespace nerve::layers

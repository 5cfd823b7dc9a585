#pragma once
/// \file
/// Crash-safe replacement of a file: write a temporary, fsync, rename, fsync the directory.
///
/// What is replaced is a regular file: a symlink is followed to the file it names (the
/// link stays), anything else (a directory, FIFO, device, socket) is refused, and the
/// new file keeps the old one's permission bits.

#include <cstddef>
#include <filesystem>
#include <span>

namespace nerve::checkpoint {

/// The regular file that replacing `path` must write: `path` itself (existing or not),
/// or the end of its chain of symlinks. Throws `std::invalid_argument` naming `path`
/// (and where its links lead) when that is not a regular file: renaming over a FIFO
/// or a device (`/dev/null`) would destroy it, and when its directory does not exist or
/// is not one. Throws `std::system_error` when it cannot be inspected or its directory
/// refuses new files (the temporary is made there). Any thread.
std::filesystem::path replace_target(const std::filesystem::path& path);

/// Removes the temporaries that writers of `target` (symlinks followed) left beside it
/// when they were killed mid-write: `.NAME.tmp-PID-N` (the trace writer's) and
/// `.NAME.tmp-PID-N-M` (`atomic_file`'s), where no process `PID` is alive
/// (`kill(pid, 0)` says ESRCH). A live writer's temporary, and any other name, is left
/// alone. The PID is this machine's: where two machines write one target in a shared
/// directory, the other's temporaries look orphaned (the trainer holds a `run_lock` on its
/// checkpoint). Best effort (a file that cannot be removed stays); returns how many were
/// removed. Any thread.
std::size_t remove_orphaned_temporaries(const std::filesystem::path& target);

/// A new version of `target`, written to a temporary file beside it and put in
/// place by `commit()`. Until then the old `target` is untouched; if the object
/// is destroyed without `commit()` (an exception, an early return) the temporary
/// is removed. A crash (SIGKILL, power loss) before the rename leaves the old
/// file intact and at worst a stray `.NAME.tmp-*` file beside it, which
/// `remove_orphaned_temporaries` removes once its writer is gone.
///
/// Not thread-safe; one writer per object. Throws `std::system_error` naming
/// the file on any I/O error.
class atomic_file {
 public:
  /// Opens a temporary beside `replace_target(target)` (which it may throw from), with
  /// the existing file's permission bits, or 0666 less the umask for a new file.
  explicit atomic_file(std::filesystem::path target);
  atomic_file(const atomic_file&) = delete;
  atomic_file& operator=(const atomic_file&) = delete;
  ~atomic_file();

  /// Appends `bytes` to the temporary file.
  void write(std::span<const std::byte> bytes);
  /// fsyncs the temporary, renames it over the target and fsyncs the directory.
  void commit();

  /// The file `commit()` replaces (`target` with its symlinks followed).
  const std::filesystem::path& target() const noexcept { return target_; }
  /// The temporary file's path (for tests).
  const std::filesystem::path& temp_path() const noexcept { return temp_; }

 private:
  std::filesystem::path target_;
  std::filesystem::path temp_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace nerve::checkpoint

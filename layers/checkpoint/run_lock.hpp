#pragma once
/// \file
/// One run's claim on a file it writes for its whole length (a checkpoint, training
/// curves): a second run given the same file is refused, naming the first one's PID.

#include <filesystem>
#include <string>
#include <string_view>

namespace nerve::checkpoint {

/// An exclusive advisory lock (`flock`) on `.NAME.lock` beside the file `name`
/// (symlinks followed, as `replace_target` does), which holds the PID of the process
/// that took it. The lock is on a file of its own because a checkpoint is replaced by
/// rename: a lock on the checkpoint's inode would not stop a run that opens the new one.
/// It is released when the object is destroyed (the lock file removed first) or the
/// process dies (the file stays, unlocked, and the next run takes it over).
///
/// `flock` locks an open file description: two `run_lock`s on one file conflict within
/// one process too. Not thread-safe; one object per lock.
class run_lock {
 public:
  /// Takes the lock for `path`. `flag` names the option in errors (`--checkpoint`).
  /// Throws `std::invalid_argument` when another run holds it:
  /// `--checkpoint 'ck.st' is in use by another run (PID 1234, lock file '.ck.st.lock')`;
  /// `std::system_error` naming the lock file when it cannot be made or locked.
  run_lock(const std::filesystem::path& path, std::string_view flag);
  run_lock(const run_lock&) = delete;
  run_lock& operator=(const run_lock&) = delete;
  ~run_lock();

  /// The lock file that guards `path`: `.<name>.lock` beside the file it resolves to.
  static std::filesystem::path lock_file(const std::filesystem::path& path);
  /// This lock's file.
  const std::filesystem::path& path() const noexcept { return lock_; }

 private:
  std::filesystem::path lock_;
  int fd_ = -1;
};

}  // namespace nerve::checkpoint

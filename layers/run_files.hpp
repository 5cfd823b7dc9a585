#pragma once
/// \file
/// The files a training run reads and writes, kept apart: from each other (no option may
/// name a file another writes), from other runs (one run per checkpoint and per metrics
/// file), and whole (no temporaries of dead writers, no torn metrics lines). Used by
/// `train` and `check_options`; on the process that writes them (`train_options::lead`).

#include <cstddef>
#include <filesystem>
#include <optional>
#include <span>

#include "layers/checkpoint/run_lock.hpp"
#include "layers/trainer.hpp"

namespace nerve::layers {

/// Throws `std::invalid_argument` when two of `o`'s files (`init`, `resume`, `save`,
/// `checkpoint`, `trace`, `metrics`), one of them written by the run, are one file:
/// existing files compared by device and inode (a hard link, a symlink or a dot
/// directory in the path is the same file), files not there yet by their resolved names. A `resume`
/// run's `checkpoint` may be its `resume` file: that is where it goes on saving. The
/// message names both options, e.g.
/// `--metrics 'w.st' is the file --init names: give each its own file`. Any thread.
void check_distinct_files(const train_options& o);

/// What a run holds on its files while it runs (`train`, on `train_options::lead`): a
/// `checkpoint::run_lock` on `checkpoint` and `metrics`, so a second run given either is
/// refused naming this one's PID; and, once they are held, the temporaries that killed
/// writers of `save`, `checkpoint` and `trace` left beside them are removed
/// (`checkpoint::remove_orphaned_temporaries`). Not thread-safe.
class run_files {
 public:
  /// Takes the locks (throwing what `run_lock` throws) and removes the orphans; does
  /// nothing when `o.lead` is false.
  explicit run_files(const train_options& o);

 private:
  std::optional<checkpoint::run_lock> checkpoint_, metrics_;
};

/// Cuts the file open on `fd` back to just after its last newline (to empty when it has
/// none): a line torn by a full disk or a crash, left at the end, is not followed by the
/// next line on the same line. A file that ends with a newline is left as it is. Throws
/// `std::system_error` naming `name`.
void end_at_last_line(int fd, const std::filesystem::path& name);

/// Appends `line` (ending in a newline) to the file open on `fd` (with O_APPEND, by one
/// writer); when the write fails part way (a full disk), cuts the file back to its size
/// before, so it still ends with a whole line. False with `errno` set when it failed.
bool append_whole_line(int fd, std::span<const std::byte> line);

}  // namespace nerve::layers

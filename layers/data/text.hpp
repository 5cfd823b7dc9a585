#pragma once
/// \file
/// A byte-level text corpus (the `gpt` preset's: Debian's `fortunes`) and its windows.
///
/// The corpus is every plain-text file of a directory, concatenated in a fixed order;
/// its tokens are its bytes, numbered by value. A model reads it in windows of T bytes
/// and learns, at every position, the byte that follows:
///
/// ```
///  files (sorted) ─► text ─► train part (first floor(0.9 n) bytes) ─► windows of T ─► [B, T] tokens
///                         └► validation part (the rest)           ─► windows of T ─► [B, T] targets
/// ```
///
/// Window `w` of a part starts at byte `w·T`; its inputs are bytes `[w·T, w·T + T)`,
/// its targets bytes `[w·T + 1, w·T + T + 1)` (the inputs shifted by one). A window
/// whose targets would run past the end of its part is not used, so a part of `n`
/// bytes holds `floor((n - 1) / T)` windows. Without shuffling, row `b` of step `s`
/// (batch B) is window `s·B + b`; shuffled, the windows of an epoch follow the seeded
/// order of `batcher` (layers/data/batcher.hpp) over window indices, so any epoch can
/// be replayed.

#include "layers/data/batcher.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace nerve::data {

/// Where Debian's `fortunes` package installs its files (the `gpt` preset's corpus).
inline constexpr std::string_view fortunes_default_dir = "/usr/share/games/fortunes";

/// One file of a corpus: its path relative to the corpus directory (with `/` between
/// folders) and the bytes of the text it became.
struct text_file {
  std::string path;
  std::size_t offset = 0;
  std::size_t size = 0;
};

/// A text as bytes, its vocabulary and its split into a training and a validation part.
///
/// The vocabulary is the distinct bytes of the whole text in increasing order: token `i`
/// is the `i`-th smallest byte value present. The training part is the first
/// `floor(0.9 n)` bytes of the `n`, the validation part the rest. A value type;
/// read-only use from several threads is safe.
struct text_corpus {
  /// Where the text came from (the directory, or the name given to `make_text_corpus`).
  std::string source;
  /// The files in the order they were concatenated (empty for an in-memory text).
  std::vector<text_file> files;
  /// The whole text.
  std::vector<std::uint8_t> bytes;
  /// The distinct byte values of `bytes`, increasing: token `i` is `vocabulary[i]`.
  std::vector<std::uint8_t> vocabulary;
  /// The token of each byte value, or -1 for a byte the text never holds.
  std::array<std::int16_t, 256> token_of{};
  /// Bytes in the training part: `floor(0.9 · bytes.size())`.
  std::size_t train_bytes = 0;

  /// Tokens in the vocabulary.
  std::size_t vocab_size() const noexcept { return vocabulary.size(); }
  /// The first `train_bytes` bytes.
  std::span<const std::uint8_t> train() const noexcept;
  /// The bytes after the training part.
  std::span<const std::uint8_t> validation() const noexcept;
};

/// The plain-text files of `dir` in corpus order, with their sizes (`offset` is where
/// each starts in the concatenation).
///
/// Plain text: a regular file whose name does not end in `.dat` (the binary index
/// `strfile` writes beside each fortune file). Symbolic links (to files or folders),
/// FIFOs, sockets and devices are skipped; subdirectories are searched, at any depth.
/// The order is that of the relative paths compared byte by byte (`A` < `a`,
/// `sub.txt` < `sub/x`). Throws `format_error` naming `dir` when it is missing, not a
/// directory or unreadable (and naming a subdirectory that cannot be read).
std::vector<text_file> list_text_files(const std::filesystem::path& dir);

/// Reads the corpus of `dir`: its plain-text files (`list_text_files`) concatenated.
///
/// Throws `format_error` naming `dir` when it is missing, unreadable, holds no
/// plain-text file or only empty ones (each message names the `fortunes` package, which
/// installs the `gpt` corpus in `fortunes_default_dir`), and naming a file that cannot
/// be read or that holds a NUL byte (at that byte: such a file is not plain text).
text_corpus load_text_corpus(const std::filesystem::path& dir);

/// A corpus of the text `bytes`, named `source` in errors (for tests and your own text).
/// Throws `std::invalid_argument` when `bytes` is empty.
text_corpus make_text_corpus(std::vector<std::uint8_t> bytes, std::string source = "text");

/// The windows of `context` bytes a part of `bytes` bytes holds: `floor((bytes - 1) / context)`
/// (0 for an empty part; `context` at least 1).
std::size_t window_count(std::size_t bytes, std::size_t context) noexcept;

/// Which part of a corpus a `text_windows` reads.
enum class text_part { train, validation };

/// How a `text_windows` cuts a part and orders an epoch.
struct window_options {
  /// T: bytes per window.
  std::size_t context = 64;
  /// B: windows per step.
  std::size_t batch_size = 32;
  /// Off: step `s` holds windows `[s·B, s·B + B)`. The validation part is read in order.
  bool shuffle = true;
  std::uint64_t seed = 0;
  /// Drop the last step if it has fewer than B windows.
  bool drop_last = false;
};

/// The windows of one part of a corpus, cut into steps of B windows, in a seeded order
/// per epoch (the file comment gives the rule).
///
/// Holds a pointer to `corpus`, which must outlive it. Not thread-safe: one thread (the
/// loader) owns it. `set_epoch` is one shuffle of the window indices; `gather` converts
/// only the bytes of the step asked.
class text_windows {
 public:
  /// Throws `std::invalid_argument` naming the option when `context` or `batch_size` is 0,
  /// when `shuffle` is asked of the validation part, or when the part is too short for
  /// one window (T + 1 bytes: the window and its last target), naming the corpus, the
  /// part and its size.
  text_windows(const text_corpus& corpus, text_part part, window_options options);

  /// The part read.
  text_part part() const noexcept { return part_; }
  /// T.
  std::size_t context() const noexcept { return context_; }
  /// Windows in the part (`window_count` of its size).
  std::size_t windows() const noexcept { return batches_.samples(); }
  /// Steps in an epoch: ceil(windows / B), or floor with `drop_last`.
  std::size_t batches_per_epoch() const noexcept { return batches_.batches_per_epoch(); }

  /// Makes `epoch`'s window order current (epoch 0 is current after construction).
  void set_epoch(std::uint64_t epoch) { batches_.set_epoch(epoch); }
  std::uint64_t epoch() const noexcept { return batches_.epoch(); }
  /// The window order of the current epoch (a permutation of [0, windows)).
  std::span<const std::uint32_t> order() const noexcept { return batches_.order(); }
  /// The windows of step `b` of the current epoch; throws `std::out_of_range`.
  std::span<const std::uint32_t> indices(std::size_t b) const { return batches_.indices(b); }
  /// The first byte of window `w` in its part: `w · T`.
  std::size_t window_start(std::uint32_t w) const noexcept { return std::size_t{w} * context_; }

  /// Writes step `b` of the current epoch: `tokens` gets `[rows, T]` token ids as floats
  /// (how the embedding layer reads them), `targets` the `[rows, T]` token ids that follow
  /// each. Both must hold exactly `indices(b).size() · T` values; throws
  /// `std::invalid_argument` otherwise.
  void gather(std::size_t b, std::span<float> tokens, std::span<std::int32_t> targets) const;

 private:
  const text_corpus* corpus_;
  text_part part_;
  std::span<const std::uint8_t> text_;
  std::size_t context_;
  batcher batches_;
};

}  // namespace nerve::data

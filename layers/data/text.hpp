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
/// bytes holds `floor((n - 1) / T)` windows. The windows are a `dataset` (`text_dataset`)
/// of a sample per window and a label per token, so the trainer shuffles and batches them
/// as it does images.

#include "layers/data/dataset.hpp"

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

/// Which part of a corpus a `text_dataset` holds.
enum class text_part { train, validation };

/// The windows of one part of `corpus` as a dataset the trainer's loader reads like any
/// other (shuffled per epoch by `batcher`, seeded, so any epoch can be replayed): sample
/// `w` is window `w`, its `context` tokens (`[T]`, token ids as floats, how the embedding
/// layer reads them) and its `context` labels, the token that follows each
/// (`labels_per_sample` T). Without shuffling, row `b` of step `s` (batch B) is window
/// `s·B + b`. The tokens stay bytes (`pixels`), mapped to their ids by `pixel_value`:
/// a batch costs what an image batch does.
///
/// Throws `std::invalid_argument` when `context` is 0, and when the part is too short for
/// one window (T + 1 bytes: the window and its last target), naming the corpus, the part
/// and its size.
dataset text_dataset(const text_corpus& corpus, text_part part, std::size_t context);

}  // namespace nerve::data

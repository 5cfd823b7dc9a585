#include "layers/data/text.hpp"

#include "layers/data/detail/file_bytes.hpp"
#include "layers/data/format_error.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <system_error>
#include <utility>

namespace nerve::data {

namespace {

namespace fs = std::filesystem;

const std::string fortunes_package_hint =
    " (the gpt preset's corpus is Debian's 'fortunes' package: apt-get install fortunes; it installs " +
    std::string(fortunes_default_dir) + ")";

bool is_strfile_index(const std::string& name) {
  return name.size() >= 4 && name.compare(name.size() - 4, 4, ".dat") == 0;
}

// Appends the plain-text files under `folder` (whose path relative to the root is
// `prefix`, empty for the root itself) to `out`, unsorted.
void collect_text_files(const fs::path& folder, const std::string& prefix, std::vector<text_file>& out) {
  std::error_code ec;
  fs::directory_iterator it(folder, ec);
  const fs::directory_iterator end;
  for (; !ec && it != end; it.increment(ec)) {
    const fs::directory_entry& entry = *it;
    const std::string name = entry.path().filename().string();
    const std::string relative = prefix.empty() ? name : prefix + "/" + name;
    // symlink_status: a link is skipped whatever it points at, and never followed into.
    std::error_code stat_ec;
    const fs::file_status st = entry.symlink_status(stat_ec);
    if (stat_ec) {
      throw format_error(entry.path().string(), format_error::no_offset, "cannot stat: " + stat_ec.message());
    }
    if (fs::is_directory(st)) {
      collect_text_files(entry.path(), relative, out);
    } else if (fs::is_regular_file(st) && !is_strfile_index(name)) {
      out.push_back({relative, 0, 0});
    }
  }
  if (ec) {
    throw format_error(folder.string(), format_error::no_offset,
                       "cannot read the directory: " + ec.message() + (prefix.empty() ? fortunes_package_hint : ""));
  }
}

}  // namespace

std::span<const std::uint8_t> text_corpus::train() const noexcept {
  return std::span<const std::uint8_t>(bytes).first(train_bytes);
}

std::span<const std::uint8_t> text_corpus::validation() const noexcept {
  return std::span<const std::uint8_t>(bytes).subspan(train_bytes);
}

std::vector<text_file> list_text_files(const fs::path& dir) {
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (ec && st.type() != fs::file_type::not_found) {
    throw format_error(dir.string(), format_error::no_offset, "cannot stat: " + ec.message() + fortunes_package_hint);
  }
  if (!fs::exists(st)) {
    throw format_error(dir.string(), format_error::no_offset, "no such directory" + fortunes_package_hint);
  }
  if (!fs::is_directory(st)) {
    throw format_error(dir.string(), format_error::no_offset, "not a directory" + fortunes_package_hint);
  }
  std::vector<text_file> files;
  collect_text_files(dir, "", files);
  // std::string compares its chars as unsigned bytes, so this is the byte order of the paths.
  std::sort(files.begin(), files.end(), [](const text_file& a, const text_file& b) { return a.path < b.path; });
  std::size_t offset = 0;
  for (text_file& f : files) {
    std::error_code size_ec;
    const auto size = fs::file_size(dir / f.path, size_ec);
    if (size_ec) {
      throw format_error((dir / f.path).string(), format_error::no_offset, "cannot stat: " + size_ec.message());
    }
    f.offset = offset;
    f.size = static_cast<std::size_t>(size);
    offset += f.size;
  }
  return files;
}

text_corpus load_text_corpus(const fs::path& dir) {
  std::vector<text_file> files = list_text_files(dir);
  if (files.empty()) {
    throw format_error(dir.string(), format_error::no_offset,
                       "holds no plain-text file (only .dat indices, links or other non-regular files)" +
                           fortunes_package_hint);
  }
  std::vector<std::uint8_t> text;
  std::size_t total = 0;
  for (const text_file& f : files) total += f.size;
  text.reserve(total);
  // The sizes are re-taken from what was read: a file that changed since it was listed
  // still gives consistent offsets.
  for (text_file& f : files) {
    const fs::path path = dir / f.path;
    std::vector<std::byte> bytes;
    try {
      bytes = detail::read_file_bytes(path);
    } catch (const std::system_error& e) {
      throw format_error(path.string(), format_error::no_offset, std::string("cannot read: ") + e.code().message());
    }
    if (const void* nul = std::memchr(bytes.data(), 0, bytes.size())) {
      const auto at = static_cast<std::uint64_t>(static_cast<const std::byte*>(nul) - bytes.data());
      throw format_error(path.string(), at, "a NUL byte: not a plain-text file (remove it from " + dir.string() + ")");
    }
    f.offset = text.size();
    f.size = bytes.size();
    const auto* first = reinterpret_cast<const std::uint8_t*>(bytes.data());
    text.insert(text.end(), first, first + bytes.size());
  }
  if (text.empty()) {
    throw format_error(dir.string(), format_error::no_offset,
                       "its " + std::to_string(files.size()) + " plain-text files are all empty" +
                           fortunes_package_hint);
  }
  text_corpus corpus = make_text_corpus(std::move(text), dir.string());
  corpus.files = std::move(files);
  return corpus;
}

text_corpus make_text_corpus(std::vector<std::uint8_t> bytes, std::string source) {
  if (bytes.empty()) throw std::invalid_argument(source + ": the text is empty");
  text_corpus corpus;
  corpus.source = std::move(source);
  corpus.bytes = std::move(bytes);
  std::array<bool, 256> present{};
  for (std::uint8_t b : corpus.bytes) present[b] = true;
  corpus.token_of.fill(-1);
  for (int v = 0; v < 256; ++v) {
    if (!present[static_cast<std::size_t>(v)]) continue;
    corpus.token_of[static_cast<std::size_t>(v)] = static_cast<std::int16_t>(corpus.vocabulary.size());
    corpus.vocabulary.push_back(static_cast<std::uint8_t>(v));
  }
  // floor(0.9 n) exactly, in integers.
  corpus.train_bytes = corpus.bytes.size() / 10 * 9 + corpus.bytes.size() % 10 * 9 / 10;
  return corpus;
}

std::size_t window_count(std::size_t bytes, std::size_t context) noexcept {
  if (bytes == 0 || context == 0) return 0;
  return (bytes - 1) / context;
}

namespace {

const char* text_part_name(text_part part) { return part == text_part::train ? "training" : "validation"; }

std::span<const std::uint8_t> text_part_bytes(const text_corpus& corpus, text_part part) {
  return part == text_part::train ? corpus.train() : corpus.validation();
}

// The window count of the part, after refusing what cannot be cut (before the batcher,
// whose own messages would not name these options).
std::size_t checked_window_count(const text_corpus& corpus, text_part part, const window_options& options) {
  if (options.context == 0) throw std::invalid_argument("text windows: context must be at least 1 (got 0)");
  if (options.batch_size == 0) throw std::invalid_argument("text windows: batch_size must be at least 1 (got 0)");
  if (part == text_part::validation && options.shuffle) {
    throw std::invalid_argument("text windows: the validation part is read in order (shuffle must be off)");
  }
  const std::size_t bytes = text_part_bytes(corpus, part).size();
  const std::size_t n = window_count(bytes, options.context);
  if (n == 0) {
    throw std::invalid_argument(corpus.source + ": the " + text_part_name(part) + " part holds " +
                                std::to_string(bytes) + " bytes, too few for one window of context " +
                                std::to_string(options.context) + " (" + std::to_string(options.context + 1) +
                                " bytes: the window and its last target)");
  }
  return n;
}

}  // namespace

text_windows::text_windows(const text_corpus& corpus, text_part part, window_options options)
    : corpus_(&corpus),
      part_(part),
      text_(text_part_bytes(corpus, part)),
      context_(options.context),
      batches_(checked_window_count(corpus, part, options), batcher_options{.batch_size = options.batch_size,
                                                                       .shuffle = options.shuffle,
                                                                       .seed = options.seed,
                                                                       .drop_last = options.drop_last}) {}

void text_windows::gather(std::size_t b, std::span<float> tokens, std::span<std::int32_t> targets) const {
  const auto idx = indices(b);
  const std::size_t t_len = context_;
  const std::size_t need = idx.size() * t_len;
  if (tokens.size() != need || targets.size() != need) {
    throw std::invalid_argument("text windows: step " + std::to_string(b) + " needs " + std::to_string(idx.size()) +
                                " x " + std::to_string(t_len) + " tokens and as many targets, got " +
                                std::to_string(tokens.size()) + " and " + std::to_string(targets.size()));
  }
  const auto& token_of = corpus_->token_of;
  for (std::size_t r = 0; r < idx.size(); ++r) {
    const std::uint8_t* window = text_.data() + window_start(idx[r]);
    float* row_tokens = tokens.data() + r * t_len;
    std::int32_t* row_targets = targets.data() + r * t_len;
    for (std::size_t t = 0; t < t_len; ++t) {
      row_tokens[t] = static_cast<float>(token_of[window[t]]);
      row_targets[t] = token_of[window[t + 1]];
    }
  }
}

}  // namespace nerve::data

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

dataset text_dataset(const text_corpus& corpus, text_part part, std::size_t context) {
  if (context == 0) throw std::invalid_argument("text windows: context must be at least 1 (got 0)");
  const bool train = part == text_part::train;
  const auto text = train ? corpus.train() : corpus.validation();
  const std::size_t n = window_count(text.size(), context);
  if (n == 0)
    throw std::invalid_argument(corpus.source + ": the " + (train ? "training" : "validation") + " part holds " +
                                std::to_string(text.size()) + " bytes, too few for one window of context " +
                                std::to_string(context) + " (" + std::to_string(context + 1) +
                                " bytes: the window and its last target)");
  dataset d;
  // Window w is bytes [w·T, w·T + T): the windows side by side are the part's first n·T
  // bytes, and their targets the same run shifted by one.
  d.pixels.assign(text.begin(), text.begin() + std::ptrdiff_t(n * context));
  d.labels.resize(n * context);
  for (std::size_t i = 0; i < d.labels.size(); ++i) d.labels[i] = corpus.token_of[text[i + 1]];
  d.labels_per_sample = context;
  d.sample_shape = {context};
  d.classes = corpus.vocab_size();
  // A byte becomes its token id (a byte the text lacks never occurs in it).
  for (std::size_t v = 0; v < 256; ++v) d.pixel_value[v] = static_cast<float>(corpus.token_of[v]);
  return d;
}

}  // namespace nerve::data

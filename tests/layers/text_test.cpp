// Tests for the byte-level text corpus and its windows (layers/data/text.hpp): which files
// a directory contributes and in what order, the vocabulary, the split, the window rule,
// the seeded window order, the errors, and the real `fortunes` package where installed.

#include "layers/data/batcher.hpp"
#include "layers/data/format_error.hpp"
#include "layers/data/text.hpp"
#include "tests/layers/common.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace nerve::data;

namespace {

using nerve::layers::testing::contains;

/// A temporary folder, removed with everything in it at the end of the scope.
struct text_temp_dir {
  std::filesystem::path path;
  text_temp_dir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "nerve-text-XXXXXX").string();
    path = ::mkdtemp(tmpl.data());
  }
  ~text_temp_dir() {
    std::error_code ec;
    std::filesystem::permissions(path, std::filesystem::perms::owner_all, std::filesystem::perm_options::add, ec);
    std::filesystem::remove_all(path, ec);
  }
  void write(const std::string& relative, const std::string& bytes) const {
    std::ofstream(path / relative, std::ios::binary) << bytes;
  }
};

/// A corpus folder with one of each kind of entry the loader meets: plain files whose
/// byte order differs from a case-blind or folder-first order, an empty file, `.dat`
/// indices, links to a file and to a folder, a FIFO (reading it would block) and a
/// subdirectory with a file and an index of its own.
struct text_tiny_corpus {
  text_temp_dir dir;
  text_tiny_corpus() {
    dir.write("b.txt", "hello\n");
    dir.write("a", "abc");
    dir.write("A", "Z");
    dir.write("e", "");
    dir.write("sub.txt", "!");
    dir.write("a.dat", std::string("\0\0\0\2\xff", 5));
    std::filesystem::create_directory(dir.path / "sub");
    dir.write("sub/x", "xyz");
    dir.write("sub/x.dat", std::string("\0\1", 2));
    std::filesystem::create_symlink("a", dir.path / "a.u8");
    std::filesystem::create_directory_symlink("sub", dir.path / "linked");
    REQUIRE(::mkfifo((dir.path / "fifo").c_str(), 0600) == 0);
  }
};

/// A text of `n` capital letters: byte i is 'A' + 7i mod 26, so for n of 26 or more every
/// letter is present and token i of the vocabulary is 'A' + i.
std::vector<std::uint8_t> text_letters(std::size_t n) {
  std::vector<std::uint8_t> text(n);
  for (std::size_t i = 0; i < n; ++i) text[i] = static_cast<std::uint8_t>('A' + (7 * i) % 26);
  return text;
}

std::vector<std::uint32_t> text_vec(std::span<const std::uint32_t> s) { return {s.begin(), s.end()}; }

/// Step `s` of `windows` as the trainer's loader gathers it: the tokens and their targets.
std::pair<std::vector<float>, std::vector<std::int32_t>> text_step(const dataset& windows, const batcher& steps,
                                                                   std::size_t s) {
  const std::size_t rows = steps.indices(s).size();
  std::vector<float> tokens(rows * windows.features());
  std::vector<std::int32_t> targets(rows * windows.labels_per_sample);
  steps.gather(windows, s, tokens, targets);
  return {std::move(tokens), std::move(targets)};
}

template <typename F>
std::string text_error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no error";
}


/// The message `f` throws, run as a user who owns none of the test's files: as root (who
/// reads everything) in a child process that drops to uid and gid 65534 (`nobody`) first.
template <typename F>
std::string text_error_as_nobody(F&& f) {
  if (::geteuid() != 0) return text_error_of(f);
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::close(fds[0]);
    std::string message = (::setgid(65534) == 0 && ::setuid(65534) == 0) ? text_error_of(f) : "setuid failed";
    const char* p = message.data();
    std::size_t left = message.size();
    while (left > 0) {
      const ssize_t n = ::write(fds[1], p, left);
      if (n <= 0) break;
      p += n;
      left -= static_cast<std::size_t>(n);
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string message;
  char buffer[512];
  for (ssize_t n; (n = ::read(fds[0], buffer, sizeof buffer)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    message.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  CHECK(WIFEXITED(status));
  return message;
}
}  // namespace

TEST_SUITE("layers.data.text") {
  TEST_CASE("a corpus is its plain-text files concatenated in byte order of their paths") {
    text_tiny_corpus files;
    const text_corpus corpus = load_text_corpus(files.dir.path);
    std::vector<std::string> paths;
    for (const auto& f : corpus.files) paths.push_back(f.path);
    CHECK(paths == std::vector<std::string>{"A", "a", "b.txt", "e", "sub.txt", "sub/x"});
    const std::string text(corpus.bytes.begin(), corpus.bytes.end());
    CHECK(text == "Zabchello\n!xyz");
    CHECK(corpus.source == files.dir.path.string());
    CHECK(corpus.files[2].offset == 4);
    CHECK(corpus.files[2].size == 6);
    CHECK(corpus.files[3].size == 0);
    CHECK(corpus.files[5].offset == 11);
  }

  TEST_CASE("the vocabulary is the distinct bytes in increasing order") {
    text_tiny_corpus files;
    const text_corpus corpus = load_text_corpus(files.dir.path);
    const std::string vocabulary(corpus.vocabulary.begin(), corpus.vocabulary.end());
    CHECK(vocabulary == "\n!Zabcehloxyz");
    CHECK(corpus.vocab_size() == 13);
    CHECK(corpus.token_of['\n'] == 0);
    CHECK(corpus.token_of['!'] == 1);
    CHECK(corpus.token_of['z'] == 12);
    CHECK(corpus.token_of['d'] == -1);
    CHECK(corpus.token_of[0] == -1);
  }

  TEST_CASE("the first 90 percent of the bytes, rounded down, are for training") {
    text_tiny_corpus files;
    const text_corpus corpus = load_text_corpus(files.dir.path);
    CHECK(corpus.train_bytes == 12);  // floor(14 * 0.9) = floor(12.6)
    CHECK(std::string(corpus.train().begin(), corpus.train().end()) == "Zabchello\n!x");
    CHECK(std::string(corpus.validation().begin(), corpus.validation().end()) == "yz");
    for (std::size_t n : {1, 9, 10, 11, 19, 20, 99, 100, 101, 12345}) {
      CAPTURE(n);
      CHECK(make_text_corpus(text_letters(n)).train_bytes == n * 9 / 10);
    }
  }

  TEST_CASE("plain-text files are listed alone, without reading a FIFO or following a link") {
    text_tiny_corpus files;
    files.dir.write("sub/deeper.dat", "index");
    std::filesystem::create_directory(files.dir.path / "sub" / "deep");
    files.dir.write("sub/deep/y", "!");
    const auto listed = list_text_files(files.dir.path);
    std::vector<std::string> paths;
    for (const auto& f : listed) paths.push_back(f.path);
    CHECK(paths == std::vector<std::string>{"A", "a", "b.txt", "e", "sub.txt", "sub/deep/y", "sub/x"});
    CHECK(listed.back().offset == 12);
    CHECK(listed.back().size == 3);
  }

  TEST_CASE("windows without shuffle are the bytes at (s*B + b)*T and the next byte after each") {
    const text_corpus corpus = make_text_corpus(text_letters(100));
    REQUIRE(corpus.vocab_size() == 26);
    REQUIRE(corpus.train_bytes == 90);
    const dataset windows = text_dataset(corpus, text_part::train, 4);
    CHECK(windows.size() == 22);  // floor((90 - 1) / 4)
    CHECK(windows.labels_per_sample == 4);
    CHECK(windows.sample_shape == std::vector<std::size_t>{4});
    CHECK(windows.classes == 26);
    batcher steps(windows.size(), {.batch_size = 5, .shuffle = false});
    CHECK(steps.batches_per_epoch() == 5);
    for (std::size_t s = 0; s < steps.batches_per_epoch(); ++s) {
      const std::size_t rows = steps.indices(s).size();
      CHECK(rows == (s < 4 ? 5 : 2));
      const auto [tokens, targets] = text_step(windows, steps, s);
      for (std::size_t b = 0; b < rows; ++b) {
        const std::size_t start = (s * 5 + b) * 4;
        for (std::size_t t = 0; t < 4; ++t) {
          CAPTURE(s);
          CAPTURE(b);
          CAPTURE(t);
          CHECK(tokens[b * 4 + t] == static_cast<float>(corpus.bytes[start + t] - 'A'));
          CHECK(targets[b * 4 + t] == corpus.bytes[start + t + 1] - 'A');
        }
      }
    }
  }

  TEST_CASE("a window whose last target would run past the end of its part is not used") {
    SUBCASE("a part of 9 bytes holds two windows of 4: the second's last target is byte 8") {
      const text_corpus corpus = make_text_corpus(text_letters(10));
      REQUIRE(corpus.train_bytes == 9);
      const dataset windows = text_dataset(corpus, text_part::train, 4);
      CHECK(windows.size() == 2);
      batcher steps(windows.size(), {.batch_size = 8, .shuffle = false});
      const auto [tokens, targets] = text_step(windows, steps, 0);
      CHECK(targets[7] == corpus.token_of[corpus.bytes[8]]);  // 10 letters: ids are not byte - 'A' here
      CHECK(tokens[4] == static_cast<float>(corpus.token_of[corpus.bytes[4]]));
    }
    SUBCASE("a part of 8 bytes holds one") {
      const text_corpus corpus = make_text_corpus(text_letters(9));
      REQUIRE(corpus.train_bytes == 8);
      CHECK(text_dataset(corpus, text_part::train, 4).size() == 1);
    }
    CHECK(window_count(0, 4) == 0);
    CHECK(window_count(4, 4) == 0);
    CHECK(window_count(5, 4) == 1);
    CHECK(window_count(2319006, 64) == 36234);
  }

  TEST_CASE("validation windows are the validation part's, in order") {
    const text_corpus corpus = make_text_corpus(text_letters(200));
    const dataset windows = text_dataset(corpus, text_part::validation, 3);
    CHECK(windows.size() == 6);  // 20 bytes: floor(19 / 3)
    batcher steps(windows.size(), {.batch_size = 4, .shuffle = false});
    CHECK(steps.batches_per_epoch() == 2);
    const auto [tokens, targets] = text_step(windows, steps, 1);
    // Row 1 of step 1 is window 5, at byte 180 + 15 of the text.
    CHECK(tokens[3] == static_cast<float>(corpus.bytes[195] - 'A'));
    CHECK(targets[5] == corpus.bytes[198] - 'A');
  }

  TEST_CASE("a shuffled step holds the windows its indices name, and the batcher's seeded order replays it") {
    const text_corpus corpus = make_text_corpus(text_letters(1000));
    const dataset windows = text_dataset(corpus, text_part::train, 8);
    REQUIRE(windows.size() == 112);  // floor(899 / 8)
    batcher run(windows.size(), {.batch_size = 16, .shuffle = true, .seed = 42});
    run.set_epoch(2);
    batcher replay(windows.size(), {.batch_size = 16, .shuffle = true, .seed = 42});
    replay.set_epoch(2);
    CHECK(text_vec(replay.order()) == text_vec(run.order()));
    const auto idx = replay.indices(3);
    const auto [tokens, targets] = text_step(windows, replay, 3);
    for (std::size_t r = 0; r < idx.size(); ++r) {
      const std::size_t start = std::size_t{idx[r]} * 8;
      CHECK(tokens[r * 8] == static_cast<float>(corpus.bytes[start] - 'A'));
      CHECK(targets[r * 8 + 7] == corpus.bytes[start + 8] - 'A');
    }
    // A batch's buffers are sized by its rows and the labels per sample.
    std::vector<float> short_tokens(idx.size() * 8);
    std::vector<std::int32_t> one_label_each(idx.size());
    CHECK(contains(text_error_of([&] { replay.gather(windows, 3, short_tokens, one_label_each); }),
                   "needs 16 x 8 floats and 128 labels"));
  }

  TEST_CASE("what the windows refuse names the option or the part") {
    const text_corpus corpus = make_text_corpus(text_letters(100));
    CHECK(contains(text_error_of([&] { (void)text_dataset(corpus, text_part::train, 0); }),
                   "context must be at least 1"));
    CHECK(text_error_of([&] { (void)text_dataset(corpus, text_part::validation, 10); }) ==
          "text: the validation part holds 10 bytes, too few for one window of context 10 "
          "(11 bytes: the window and its last target)");
    CHECK_THROWS_AS(make_text_corpus({}), std::invalid_argument);
  }

  TEST_CASE("a missing, non-directory, empty or unreadable corpus is an error naming it and the package") {
    text_temp_dir dir;
    SUBCASE("missing") {
      const auto missing = dir.path / "nope";
      const std::string e = text_error_of([&] { load_text_corpus(missing); });
      CHECK(contains(e, missing.string() + ": no such directory"));
      CHECK(contains(e, "apt-get install fortunes"));
    }
    SUBCASE("a file") {
      dir.write("file", "text");
      const std::string e = text_error_of([&] { load_text_corpus(dir.path / "file"); });
      CHECK(contains(e, (dir.path / "file").string() + ": not a directory"));
      CHECK(contains(e, "apt-get install fortunes"));
    }
    SUBCASE("no plain-text file") {
      dir.write("a.dat", "index");
      std::filesystem::create_symlink("a.dat", dir.path / "a");
      std::filesystem::create_directory(dir.path / "sub");
      const std::string e = text_error_of([&] { load_text_corpus(dir.path); });
      CHECK(contains(e, dir.path.string() + ": holds no plain-text file"));
      CHECK(contains(e, "apt-get install fortunes"));
      CHECK_THROWS_AS(load_text_corpus(dir.path), format_error);
    }
    SUBCASE("only empty files") {
      dir.write("a", "");
      dir.write("b", "");
      const std::string e = text_error_of([&] { load_text_corpus(dir.path); });
      CHECK(contains(e, dir.path.string() + ": its 2 plain-text files are all empty"));
      CHECK(contains(e, "apt-get install fortunes"));
    }
    SUBCASE("unreadable: the directory, a folder in it, a file in it") {
      namespace fp = std::filesystem;
      // Enterable but not listable, by the owner and by the others (root's child is one).
      const auto no_listing = fp::perms::owner_write | fp::perms::owner_exec | fp::perms::others_exec;
      const auto readable = fp::perms::owner_read | fp::perms::others_read;
      fp::permissions(dir.path, no_listing | readable);
      const auto corpus = dir.path / "corpus";
      fp::create_directory(corpus);
      dir.write("corpus/a", "text");
      fp::permissions(corpus, no_listing);
      std::string e = text_error_as_nobody([&] { load_text_corpus(corpus); });
      CHECK(contains(e, corpus.string() + ": cannot read the directory: Permission denied"));
      CHECK(contains(e, "apt-get install fortunes"));

      fp::permissions(corpus, no_listing | readable);
      fp::create_directory(corpus / "sub");
      dir.write("corpus/sub/b", "more");
      fp::permissions(corpus / "sub", no_listing);
      e = text_error_as_nobody([&] { load_text_corpus(corpus); });
      CHECK(e == (corpus / "sub").string() + ": cannot read the directory: Permission denied");

      fp::permissions(corpus / "sub", no_listing | readable);
      fp::permissions(corpus / "sub" / "b", fp::perms::owner_write);
      e = text_error_as_nobody([&] { load_text_corpus(corpus); });
      CHECK(e == (corpus / "sub" / "b").string() + ": cannot read: Permission denied");
    }
  }

  TEST_CASE("a file holding a NUL byte is refused at that byte as not plain text") {
    text_tiny_corpus files;
    files.dir.write("sub/bin", std::string("ab\0c", 4));
    try {
      load_text_corpus(files.dir.path);
      FAIL("no error");
    } catch (const format_error& e) {
      CHECK(e.file() == (files.dir.path / "sub/bin").string());
      CHECK(e.offset() == 2);
      CHECK(contains(e.what(), "a NUL byte: not a plain-text file"));
    }
  }

  TEST_CASE("the fortunes package gives the gpt preset's corpus, vocabulary and windows") {
    const std::filesystem::path dir{std::string(fortunes_default_dir)};
    if (!std::filesystem::is_directory(dir)) {
      MESSAGE("fortunes is not installed (scripts/deps installs it); skipping");
      return;
    }
    const text_corpus corpus = load_text_corpus(dir);

    // A second, plain computation of the same figures: recursive_directory_iterator does
    // not follow links into folders; every regular non-.dat file, sorted, read whole.
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
      if (entry.is_symlink() || !entry.is_regular_file()) continue;
      if (entry.path().extension() == ".dat") continue;
      names.push_back(entry.path().lexically_relative(dir).generic_string());
    }
    std::sort(names.begin(), names.end());
    std::string text;
    for (const auto& name : names) {
      std::ifstream in(dir / name, std::ios::binary);
      text.append(std::istreambuf_iterator<char>(in), {});
    }
    std::set<unsigned char> distinct(text.begin(), text.end());
    const std::size_t train = text.size() * 9 / 10;
    std::size_t windows = 0;
    while ((windows + 1) * 64 + 1 <= train) ++windows;
    const std::size_t steps = (windows + 31) / 32;

    std::vector<std::string> listed;
    for (const auto& f : corpus.files) listed.push_back(f.path);
    CHECK(listed == names);
    CHECK(std::equal(corpus.bytes.begin(), corpus.bytes.end(), text.begin(), text.end(),
                     [](std::uint8_t a, char b) { return a == static_cast<unsigned char>(b); }));
    CHECK(corpus.vocab_size() == distinct.size());
    CHECK(std::equal(corpus.vocabulary.begin(), corpus.vocabulary.end(), distinct.begin(), distinct.end()));
    CHECK(corpus.train_bytes == train);

    const dataset train_windows = text_dataset(corpus, text_part::train, 64);
    const dataset validation = text_dataset(corpus, text_part::validation, 64);
    const batcher epoch(train_windows.size(), {.batch_size = 32, .shuffle = true, .seed = 1});
    CHECK(train_windows.size() == windows);
    CHECK(epoch.batches_per_epoch() == steps);
    MESSAGE("fortunes: " << names.size() << " files, " << corpus.bytes.size() << " bytes, vocabulary "
                         << corpus.vocab_size() << ", training " << corpus.train_bytes << " bytes = "
                         << train_windows.size() << " windows of 64 = " << epoch.batches_per_epoch()
                         << " steps of 32; validation " << corpus.validation().size() << " bytes = "
                         << validation.size() << " windows");
  }
}

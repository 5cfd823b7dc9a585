// What `--save` (a checkpoint, atomic_file) and `--trace` (the recorder's write_file)
// replace: regular files only, through symlinks, keeping their mode, leaving nothing
// behind when a write fails; and a safetensors file refused by its header alone.
#include <doctest/doctest.h>

#include "tests/layers/file_size_limit.hpp"

#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "actors/runtime.hpp"
#include "layers/checkpoint/atomic_file.hpp"
#include "layers/checkpoint/checkpoint.hpp"
#include "layers/checkpoint/safetensors.hpp"
#include "tests/layers/common.hpp"

#include <nlohmann/json.hpp>

namespace fs = std::filesystem;
using namespace nerve;

namespace {

struct temp_save_dir {
  fs::path path;
  temp_save_dir() {
    std::string tmpl = (fs::temp_directory_path() / "nerve-save-XXXXXX").string();
    path = ::mkdtemp(tmpl.data());
  }
  ~temp_save_dir() { fs::remove_all(path); }
  /// The names in the directory, sorted (a stray temporary shows here).
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (auto& e : fs::directory_iterator(path)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
};

using nerve::layers::testing::contents;

using nerve::layers::testing::put;

unsigned mode_of(const fs::path& p) {
  struct stat st {};
  REQUIRE(::stat(p.c_str(), &st) == 0);
  return st.st_mode & 07777;
}

/// The one writer kind under test: a checkpoint (atomic_file) or a trace (recorder).
enum class writer { checkpoint, trace };

void write_with(writer w, const fs::path& path) {
  if (w == writer::checkpoint) {
    checkpoint::state_dict d;
    d.add("w", {64}, std::vector<float>(64, 1.5f));
    checkpoint::save_checkpoint(path, d);
  } else {
    actors::runtime rt({.loops = 1, .record = true});
    rt.write_trace(path.string(), nlohmann::json::object());
  }
}

using test::file_size_limit;

}  // namespace

TEST_SUITE("layers.save_target") {
  TEST_CASE("a symlink is written through: the link stays, its target gets the new file") {
    for (auto w : {writer::checkpoint, writer::trace}) {
      CAPTURE(int(w));
      temp_save_dir d;
      put(d.path / "real", "old");
      fs::create_symlink("real", d.path / "link");
      write_with(w, d.path / "link");
      CHECK(fs::is_symlink(fs::symlink_status(d.path / "link")));
      CHECK(contents(d.path / "real") != "old");
      CHECK(d.names() == std::vector<std::string>{"link", "real"});
    }
  }

  TEST_CASE("what is not a regular file is refused, named, and left as it was") {
    for (auto w : {writer::checkpoint, writer::trace}) {
      CAPTURE(int(w));
      temp_save_dir d;
      SUBCASE("a FIFO") {
        REQUIRE(::mkfifo((d.path / "fifo").c_str(), 0600) == 0);
        CHECK_THROWS_WITH(write_with(w, d.path / "fifo"), doctest::Contains("is a FIFO, not a regular file"));
        CHECK(fs::is_fifo(d.path / "fifo"));
        CHECK(d.names() == std::vector<std::string>{"fifo"});
      }
      SUBCASE("a symlink to a character device (--save /dev/null as root replaced /dev/null)") {
        fs::create_symlink("/dev/null", d.path / "null");
        CHECK_THROWS_WITH(write_with(w, d.path / "null"),
                          doctest::Contains("leads to '/dev/null', which is a character device, not a regular file"));
        CHECK(fs::is_symlink(fs::symlink_status(d.path / "null")));
        CHECK(d.names() == std::vector<std::string>{"null"});
      }
      SUBCASE("a directory") {
        fs::create_directory(d.path / "dir");
        CHECK_THROWS_WITH(write_with(w, d.path / "dir"), doctest::Contains("is a directory, not a regular file"));
        CHECK(fs::is_directory(d.path / "dir"));
      }
    }
    CHECK_THROWS_WITH_AS(checkpoint::replace_target("/dev/null"),
                         "'/dev/null' is a character device, not a regular file: refusing to replace it",
                         std::invalid_argument);
  }

  TEST_CASE("the replacement keeps the old file's mode") {
    for (auto w : {writer::checkpoint, writer::trace}) {
      CAPTURE(int(w));
      temp_save_dir d;
      const mode_t umask_was = ::umask(022);  // a new file would be 0644
      put(d.path / "private", "old");
      fs::permissions(d.path / "private", fs::perms::owner_read | fs::perms::owner_write);
      write_with(w, d.path / "private");
      CHECK(mode_of(d.path / "private") == 0600);
      write_with(w, d.path / "new");
      CHECK(mode_of(d.path / "new") == 0644);
      ::umask(umask_was);
    }
  }

  TEST_CASE("a write that fails (a full disk: RLIMIT_FSIZE, SIGXFSZ ignored) leaves no temporary and the old file") {
    for (auto w : {writer::checkpoint, writer::trace}) {
      CAPTURE(int(w));
      temp_save_dir d;
      put(d.path / "out", "old");
      {
        file_size_limit full(40);
        CHECK_THROWS_WITH(write_with(w, d.path / "out"), doctest::Contains((d.path / "out").c_str()));
      }
      CHECK(contents(d.path / "out") == "old");
      CHECK(d.names() == std::vector<std::string>{"out"});
    }
  }

  TEST_CASE("a safetensors file is refused by its header, before its data is read") {
    // A valid header for 8 bytes of data, then a terabyte of holes: reading the file
    // whole first cannot even allocate it.
    temp_save_dir d;
    const auto path = d.path / "huge.safetensors";
    const std::vector<float> two{1.0f, 2.0f};
    const std::vector<checkpoint::tensor_ref> refs{checkpoint::f32_tensor("w", {2}, two)};
    const auto bytes = checkpoint::encode_safetensors(refs);
    {
      std::ofstream out(path, std::ios::binary);
      out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    }
    const std::uintmax_t size = std::uintmax_t{1} << 40;
    fs::resize_file(path, size);
    const auto buffer = size - (bytes.size() - 8);
    CHECK_THROWS_WITH_AS(checkpoint::safetensors_file::read(path),
                         doctest::Contains((std::to_string(buffer - 8) +
                                            " bytes after the last tensor are not covered by any tensor")
                                               .c_str()),
                         checkpoint::format_error);
    // And a header size past the end of the file, on a small file.
    put(d.path / "short.safetensors", std::string("\x10\0\0\0\0\0\0\0{}", 10));
    CHECK_THROWS_WITH_AS(checkpoint::safetensors_file::read(d.path / "short.safetensors"),
                         doctest::Contains("runs past the end of the file (10 bytes)"), checkpoint::format_error);
    // A well-formed file still reads, data included.
    fs::resize_file(path, bytes.size());
    auto f = checkpoint::safetensors_file::read(path);
    CHECK(f.to_float(f.at("w")) == two);
  }
}

// Tests for the IDX reader: generated files (raw and gzip), every error path,
// and the real Fashion-MNIST files installed by Debian's dataset-fashion-mnist.

#include "layers/data/format_error.hpp"
#include "layers/data/idx.hpp"
#include "tests/layers/common.hpp"

#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

using namespace nerve::data;

namespace {

std::vector<std::byte> bytes_of(std::initializer_list<int> v) {
  std::vector<std::byte> out;
  for (int x : v) out.push_back(std::byte(static_cast<unsigned char>(x)));
  return out;
}

std::vector<std::byte> small_u8() {
  std::vector<std::size_t> shape{2, 3};
  std::vector<std::uint8_t> v{1, 2, 3, 250, 251, 255};
  return encode_idx<std::uint8_t>(shape, v);
}

// The error a parse throws, for checking its message and offset.
format_error idx_parse_error(std::span<const std::byte> bytes, std::string_view name = "test.idx") {
  try {
    parse_idx(bytes, name);
  } catch (const format_error& e) {
    return e;
  }
  FAIL("parse_idx accepted a malformed file");
  return format_error("", 0, "");
}

using nerve::layers::testing::contains;

struct temp_idx_dir {
  std::filesystem::path path;
  temp_idx_dir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "nerve-idx-XXXXXX").string();
    path = ::mkdtemp(tmpl.data());
  }
  ~temp_idx_dir() { std::filesystem::remove_all(path); }
  std::filesystem::path write(const std::string& name, std::span<const std::byte> bytes) const {
    auto p = path / name;
    std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    return p;
  }
};

const std::filesystem::path fmnist = "/usr/share/datasets/fashion-mnist";

}  // namespace

TEST_SUITE("layers.idx") {
  TEST_CASE("a generated u8 file reads back raw and gzip-compressed") {
    auto raw = small_u8();
    // The header is the documented layout: 00 00 08 02, then 2 and 3 big-endian.
    CHECK(raw.size() == 4 + 8 + 6);
    CHECK(raw[2] == std::byte{0x08});
    CHECK(raw[3] == std::byte{0x02});
    auto gz = gzip_compress(raw);
    CHECK(gz[0] == std::byte{0x1f});
    for (auto* input : {&raw, &gz}) {
      auto a = parse_idx(*input);
      CHECK(a.type() == idx_type::u8);
      CHECK(a.shape() == std::vector<std::size_t>{2, 3});
      CHECK(a.size() == 6);
      CHECK(a.row_size() == 3);
      auto v = a.values<std::uint8_t>();
      CHECK(std::vector<std::uint8_t>(v.begin(), v.end()) == std::vector<std::uint8_t>{1, 2, 3, 250, 251, 255});
      CHECK_THROWS_AS(a.values<float>(), std::invalid_argument);
    }
  }

  TEST_CASE("every IDX element type round-trips in big-endian order") {
    std::vector<std::size_t> shape{3};
    SUBCASE("i8") {
      std::vector<std::int8_t> v{-128, 0, 127};
      auto a = parse_idx(encode_idx<std::int8_t>(shape, v));
      CHECK(a.type() == idx_type::i8);
      CHECK(std::equal(v.begin(), v.end(), a.values<std::int8_t>().begin()));
    }
    SUBCASE("i16") {
      std::vector<std::int16_t> v{-32768, 258, 32767};
      auto bytes = encode_idx<std::int16_t>(shape, v);
      CHECK(bytes[8 + 2] == std::byte{0x01});  // 258 = 0x0102, most significant byte first
      CHECK(bytes[8 + 3] == std::byte{0x02});
      auto a = parse_idx(bytes);
      CHECK(std::equal(v.begin(), v.end(), a.values<std::int16_t>().begin()));
    }
    SUBCASE("i32") {
      std::vector<std::int32_t> v{-2147483647 - 1, 16909060, 2147483647};
      auto a = parse_idx(gzip_compress(encode_idx<std::int32_t>(shape, v)));
      CHECK(std::equal(v.begin(), v.end(), a.values<std::int32_t>().begin()));
    }
    SUBCASE("f32") {
      std::vector<float> v{-1.5f, 0.0f, 3.25e10f};
      auto a = parse_idx(encode_idx<float>(shape, v));
      CHECK(std::equal(v.begin(), v.end(), a.values<float>().begin()));
      CHECK(a.to_float() == v);
    }
    SUBCASE("f64") {
      std::vector<double> v{-1e300, 0.1, 2.0};
      auto a = parse_idx(encode_idx<double>(shape, v));
      CHECK(std::equal(v.begin(), v.end(), a.values<double>().begin()));
    }
  }

  TEST_CASE("a wrong magic is an error at byte 0 naming the file") {
    auto bytes = small_u8();
    bytes[0] = std::byte{0x1e};
    auto e = idx_parse_error(bytes, "images.idx");
    CHECK(e.file() == "images.idx");
    CHECK(e.offset() == 0);
    CHECK(contains(e.what(), "images.idx: at byte 0: wrong magic 0x1e"));
    bytes[0] = std::byte{0};
    bytes[1] = std::byte{0x08};
    CHECK(idx_parse_error(bytes).offset() == 1);
  }

  TEST_CASE("an unknown data type is an error at byte 2") {
    auto bytes = small_u8();
    bytes[2] = std::byte{0x0a};
    auto e = idx_parse_error(bytes);
    CHECK(e.offset() == 2);
    CHECK(contains(e.what(), "unknown data type 0x0a"));
  }

  TEST_CASE("wrong dimensions are errors at the offending header field") {
    SUBCASE("zero dimensions") {
      auto e = idx_parse_error(bytes_of({0, 0, 8, 0}));
      CHECK(e.offset() == 3);
      CHECK(contains(e.what(), "zero dimensions"));
    }
    SUBCASE("a zero-sized dimension") {
      auto e = idx_parse_error(bytes_of({0, 0, 8, 2, 0, 0, 0, 5, 0, 0, 0, 0}));
      CHECK(e.offset() == 8);
      CHECK(contains(e.what(), "dimension 1 is zero"));
    }
    SUBCASE("dimensions whose product overflows") {
      auto e = idx_parse_error(bytes_of({0, 0, 0x0e, 3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                     0xff, 0xff}));
      CHECK(e.offset() == 8);
      CHECK(contains(e.what(), "larger than 1 TiB"));
    }
    SUBCASE("dimensions that claim more data than the file holds") {
      auto bytes = small_u8();
      bytes[7] = std::byte{3};  // 3x3 instead of 2x3 (dimension 0 is bytes 4..7)
      auto e = idx_parse_error(bytes);
      CHECK(contains(e.what(), "truncated"));
      CHECK(contains(e.what(), "needs 9 bytes"));
      CHECK(e.offset() == 18);
    }
    SUBCASE("dimensions that claim less data than the file holds") {
      auto bytes = small_u8();
      bytes[11] = std::byte{1};  // 2x1 instead of 2x3
      auto e = idx_parse_error(bytes);
      CHECK(contains(e.what(), "4 trailing bytes"));
      CHECK(e.offset() == 14);
    }
  }

  TEST_CASE("truncated files are errors at the point where they end") {
    auto full = small_u8();
    for (std::size_t n = 0; n < full.size(); ++n) {
      CAPTURE(n);
      std::span<const std::byte> cut(full.data(), n);
      auto e = idx_parse_error(cut);
      CHECK(contains(e.what(), "truncated"));
      CHECK(e.offset() == n);
    }
  }

  TEST_CASE("trailing garbage after the data is an error") {
    auto bytes = small_u8();
    bytes.push_back(std::byte{0});
    auto e = idx_parse_error(bytes);
    CHECK(contains(e.what(), "1 trailing bytes"));
    CHECK(e.offset() == 18);
  }

  TEST_CASE("corrupt gzip input is an error, not a short read") {
    auto gz = gzip_compress(small_u8());
    SUBCASE("truncated compressed stream") {
      for (std::size_t n : {std::size_t{2}, std::size_t{10}, gz.size() - 4, gz.size() - 1}) {
        CAPTURE(n);
        auto e = idx_parse_error(std::span<const std::byte>(gz.data(), n));
        // Either the gzip layer or the IDX layer notices, never silence.
        CHECK(contains(e.what(), "truncated"));
      }
    }
    SUBCASE("a flipped CRC") {
      gz[gz.size() - 6] ^= std::byte{0xff};
      auto e = idx_parse_error(gz);
      CHECK(contains(e.what(), "corrupt gzip data"));
      CHECK(contains(e.what(), "compressed file"));
    }
    SUBCASE("bytes after the gzip stream") {
      gz.push_back(std::byte{'x'});
      auto e = idx_parse_error(gz);
      CHECK(contains(e.what(), "trailing bytes after the end of the gzip stream"));
      CHECK(e.offset() == gz.size() - 1);
    }
    SUBCASE("concatenated gzip members form one stream") {
      auto raw = small_u8();
      auto a = gzip_compress(std::span<const std::byte>(raw.data(), 7));
      auto b = gzip_compress(std::span<const std::byte>(raw.data() + 7, raw.size() - 7));
      a.insert(a.end(), b.begin(), b.end());
      CHECK(parse_idx(a).size() == 6);
    }
  }

  TEST_CASE("a huge claimed size in a tiny file does not allocate it") {
    // 4 GiB claimed by a 16-byte file: must fail fast as truncated (raw and gzip).
    auto bytes = bytes_of({0, 0, 8, 2, 0, 1, 0, 0, 0, 1, 0, 0, 1, 2, 3, 4});
    CHECK(contains(idx_parse_error(bytes).what(), "truncated"));
    CHECK(contains(idx_parse_error(gzip_compress(bytes)).what(), "truncated"));
  }

  TEST_CASE("a small gzip file that inflates far past its header's claim is not inflated whole") {
    // 6 bytes of data claimed, then 16 MiB of zeros that compress to about 16 KiB
    // (a gzip bomb): the reader stops once it holds more than the claim, at most its first
    // output chunk (twice the compressed size) later, and says the count is a lower bound.
    auto bytes = small_u8();
    bytes.resize(bytes.size() + (std::size_t{16} << 20), std::byte{0});
    const auto gz = gzip_compress(bytes);
    CHECK(gz.size() < bytes.size() / 500);
    auto e = idx_parse_error(gz);
    const std::string what = e.what();
    const auto at = what.find("at least ");
    REQUIRE(at != std::string::npos);
    CHECK(contains(what, " trailing bytes"));
    const auto inflated = std::stoull(what.substr(at + 9));
    CHECK(inflated >= 1);
    CHECK(inflated <= std::max<std::size_t>(2 * gz.size(), 4096));
    CHECK(e.offset() == 18);
    // Without gzip the whole file is read anyway: the exact count.
    bytes.resize(small_u8().size() + 5);
    CHECK(contains(idx_parse_error(bytes).what(), " 5 trailing bytes"));
  }

  TEST_CASE("files on disk: errors name the path, missing files are system errors") {
    temp_idx_dir dir;
    auto ok = dir.write("ok.idx.gz", gzip_compress(small_u8()));
    CHECK(read_idx(ok).shape() == std::vector<std::size_t>{2, 3});
    auto bad = small_u8();
    bad.pop_back();
    auto p = dir.write("bad.idx", bad);
    try {
      read_idx(p);
      FAIL("no error");
    } catch (const format_error& e) {
      CHECK(e.file() == p.string());
      CHECK(contains(e.what(), p.string()));
    }
    try {
      read_idx(dir.path / "missing.idx");
      FAIL("no error");
    } catch (const std::system_error& e) {
      CHECK(contains(e.what(), "missing.idx"));
    }
  }

  TEST_CASE("the real Fashion-MNIST files have the published shapes and first labels") {
    if (!std::filesystem::exists(fmnist / "train-labels-idx1-ubyte.gz")) {
      MESSAGE("dataset-fashion-mnist is not installed; skipping");
      return;
    }
    auto labels = read_idx(fmnist / "train-labels-idx1-ubyte.gz");
    CHECK(labels.shape() == std::vector<std::size_t>{60000});
    auto lv = labels.values<std::uint8_t>();
    CHECK(std::vector<int>(lv.begin(), lv.begin() + 10) == std::vector<int>{9, 0, 0, 3, 0, 2, 7, 2, 5, 5});
    auto images = read_idx(fmnist / "train-images-idx3-ubyte.gz");
    CHECK(images.type() == idx_type::u8);
    CHECK(images.shape() == std::vector<std::size_t>{60000, 28, 28});
    auto test_images = read_idx(fmnist / "t10k-images-idx3-ubyte.gz");
    CHECK(test_images.shape() == std::vector<std::size_t>{10000, 28, 28});
    auto test_labels = read_idx(fmnist / "t10k-labels-idx1-ubyte.gz");
    CHECK(test_labels.shape() == std::vector<std::size_t>{10000});
    auto tl = test_labels.values<std::uint8_t>();
    CHECK(std::vector<int>(tl.begin(), tl.begin() + 5) == std::vector<int>{9, 2, 1, 1, 6});
  }
}

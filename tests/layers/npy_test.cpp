// The .npy reader and the .npy dataset pair: files built byte by byte here (as np.save
// writes them) in every dtype, and every malformed file refused word for word.
#include <doctest/doctest.h>

#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "layers/data/dataset.hpp"
#include "layers/data/npy.hpp"
#include "tests/layers/common.hpp"

using namespace nerve::data;
namespace fs = std::filesystem;

namespace {

/// A `.npy` file's bytes: `dict` as the header (padded with spaces and a newline so the
/// data starts on a 64-byte boundary, as np.save does), then `payload`.
std::string npy_text(const std::string& dict, const std::string& payload, int major = 1) {
  const std::size_t preamble = major == 1 ? 10 : 12;
  std::string header = dict;
  header.append((64 - (preamble + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  std::string out = "\x93NUMPY";
  out += char(major);
  out += char(0);
  const std::size_t len = header.size();
  out += char(len & 0xff);
  out += char((len >> 8) & 0xff);
  if (major != 1) {
    out += char((len >> 16) & 0xff);
    out += char((len >> 24) & 0xff);
  }
  return out + header + payload;
}

/// `values` as little-endian bytes.
template <class T>
std::string npy_le_bytes(const std::vector<T>& values) {
  std::string s;
  for (const T& v : values) {
    std::uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    for (std::size_t k = 0; k < sizeof(T); ++k) s += char((bits >> (8 * k)) & 0xff);
  }
  return s;
}

std::string npy_dict(const std::string& descr, const std::string& shape, const std::string& fortran = "False") {
  return "{'descr': '" + descr + "', 'fortran_order': " + fortran + ", 'shape': " + shape + ", }";
}

npy_array parse_text(const std::string& text, const std::string& name = "x.npy") {
  return parse_npy(std::as_bytes(std::span(text.data(), text.size())), name);
}

/// The message `parse_text(text)` throws (empty when it throws none).
std::string npy_refusal(const std::string& text) {
  try {
    parse_text(text);
  } catch (const format_error& e) {
    return e.what();
  }
  return {};
}

/// A temporary folder, removed at the end of the test.
struct npy_folder {
  fs::path dir;
  npy_folder() {
    std::string tmpl = (fs::temp_directory_path() / "nerve-npy-XXXXXX").string();
    dir = ::mkdtemp(tmpl.data());
  }
  ~npy_folder() { fs::remove_all(dir); }
  npy_folder(const npy_folder&) = delete;
  npy_folder& operator=(const npy_folder&) = delete;
  fs::path file(const std::string& name, const std::string& text) const {
    nerve::layers::testing::put(dir / name, text);
    return dir / name;
  }
};

/// The message `load_npy_pair(x, y, {}, classes)` throws (empty when it throws none).
std::string pair_refusal(const fs::path& x, const fs::path& y, std::size_t classes = 0) {
  try {
    load_npy_pair(x, y, {}, classes);
  } catch (const format_error& e) {
    return e.what();
  }
  return {};
}

}  // namespace

TEST_SUITE("layers.data.npy") {
  TEST_CASE("a file in each dtype np.save writes reads back its shape and values") {
    SUBCASE("|u1") {
      const auto a = parse_text(npy_text(npy_dict("|u1", "(2, 3)"), npy_le_bytes<std::uint8_t>({0, 1, 2, 253, 254, 255})));
      CHECK(a.type == npy_type::u8);
      CHECK(a.shape == std::vector<std::size_t>{2, 3});
      CHECK(a.bytes() == std::vector<std::uint8_t>{0, 1, 2, 253, 254, 255});
      CHECK(a.integer(5) == 255);
    }
    SUBCASE("|i1, <i2, <i4, <i8 (sign kept)") {
      CHECK(parse_text(npy_text(npy_dict("|i1", "(2,)"), npy_le_bytes<std::int8_t>({-128, 127}))).integer(0) == -128);
      CHECK(parse_text(npy_text(npy_dict("<i2", "(2,)"), npy_le_bytes<std::int16_t>({-2, 300}))).integer(0) == -2);
      const auto i4 = parse_text(npy_text(npy_dict("<i4", "(3,)"), npy_le_bytes<std::int32_t>({-1, 7, 2147483647})));
      CHECK(i4.type == npy_type::i32);
      CHECK(i4.integer(0) == -1);
      CHECK(i4.integer(2) == 2147483647);
      const auto i8 = parse_text(npy_text(npy_dict("<i8", "(2,)"), npy_le_bytes<std::int64_t>({-5, 1LL << 40})));
      CHECK(i8.type == npy_type::i64);
      CHECK(i8.integer(0) == -5);
      CHECK(i8.integer(1) == (1LL << 40));
    }
    SUBCASE("<u2, <u4, <u8") {
      CHECK(parse_text(npy_text(npy_dict("<u2", "(1,)"), npy_le_bytes<std::uint16_t>({65535}))).integer(0) == 65535);
      CHECK(parse_text(npy_text(npy_dict("<u4", "(1,)"), npy_le_bytes<std::uint32_t>({4000000000u}))).integer(0) == 4000000000LL);
      CHECK(parse_text(npy_text(npy_dict("<u8", "(1,)"), npy_le_bytes<std::uint64_t>({~0ULL}))).integer(0) == -1);
    }
    SUBCASE("<f4 bit for bit, <f8 read as its type") {
      const std::vector<float> v = {0.1f, -2.5f, 1e-30f, 3.4e38f};
      const auto a = parse_text(npy_text(npy_dict("<f4", "(2, 1, 2)"), npy_le_bytes(v)));
      CHECK(a.type == npy_type::f32);
      CHECK(a.shape == std::vector<std::size_t>{2, 1, 2});
      CHECK(a.floats() == v);
      CHECK(parse_text(npy_text(npy_dict("<f8", "(1,)"), npy_le_bytes<double>({1.5}))).type == npy_type::f64);
    }
    SUBCASE("format versions 2.0 and 3.0 (a 4-byte header length)") {
      for (int major : {2, 3}) {
        const auto a = parse_text(npy_text(npy_dict("<f4", "(1, 2)"), npy_le_bytes<float>({1, 2}), major));
        CHECK(a.floats() == std::vector<float>{1, 2});
      }
    }
    SUBCASE("a scalar, double quotes, no trailing comma and keys in another order") {
      CHECK(parse_text(npy_text("{'descr': '<i8', 'fortran_order': False, 'shape': ()}", npy_le_bytes<std::int64_t>({9})))
                .integer(0) == 9);
      const auto a = parse_text(npy_text("{\"shape\": (2,), \"fortran_order\": False, \"descr\": \"|u1\"}", "\x01\x02"));
      CHECK(a.shape == std::vector<std::size_t>{2});
      // A one-byte type has no byte order: any it states is taken.
      CHECK(parse_text(npy_text(npy_dict(">u1", "(1,)"), "\x07")).type == npy_type::u8);
      CHECK(parse_text(npy_text(npy_dict("<i1", "(1,)"), "\xff")).integer(0) == -1);
    }
  }

  TEST_CASE("encode_npy writes the bytes np.save writes") {
    const std::vector<std::size_t> shape{2, 2};
    const std::vector<float> f = {1, 2, 3, 4};
    const auto enc = encode_npy<float>(shape, f);
    const std::string want = npy_text(npy_dict("<f4", "(2, 2)"), npy_le_bytes(f));
    CHECK(std::string(reinterpret_cast<const char*>(enc.data()), enc.size()) == want);
    CHECK(want.size() == 128 + 16);  // the data starts on a 64-byte boundary
    const std::vector<std::size_t> one{3};
    const std::vector<std::int64_t> l = {0, 2, 1};
    const auto enc_l = encode_npy<std::int64_t>(one, l);
    CHECK(std::string(reinterpret_cast<const char*>(enc_l.data()), enc_l.size()) ==
          npy_text(npy_dict("<i8", "(3,)"), npy_le_bytes(l)));
  }

  TEST_CASE("a malformed file is refused naming the file, the byte and the field") {
    const std::string f4 = npy_le_bytes<float>({1, 2, 3, 4, 5, 6});
    CHECK(npy_refusal("NUMPY\x01\x00") == "x.npy: at byte 0: not a .npy file (it does not start with \\x93NUMPY)");
    CHECK(npy_refusal(std::string("\x93NUMPY\x04\x00", 8) + "\x10\x00") ==
          "x.npy: at byte 6: format version 4.0 (this reader takes 1.0, 2.0 and 3.0)");
    CHECK(npy_refusal(npy_text(npy_dict("<f4", "(2, 3)", "True"), f4)) ==
          "x.npy: at byte 10: fortran_order is True: only C order is read (save np.ascontiguousarray(x))");
    CHECK(npy_refusal(npy_text(npy_dict(">f4", "(2, 3)"), f4)) ==
          "x.npy: at byte 10: descr '>f4' is big-endian: only little-endian files are read (save "
          "x.astype(x.dtype.newbyteorder('<')))");
    CHECK(npy_refusal(npy_text(npy_dict("<c8", "(2, 3)"), f4 + f4)) ==
          "x.npy: at byte 10: descr '<c8' is not a plain number type this reader takes (|u1, |i1, <u2, <i2, <u4, <i4, "
          "<u8, <i8, <f4, <f8)");
    CHECK(npy_refusal(npy_text(npy_dict("<f4", "(2, 3)"), f4.substr(0, 20))) ==
          "x.npy: at byte 148: shape (2, 3) of '<f4' needs 24 bytes of data, the file has 20 (truncated?)");
    CHECK(npy_refusal(npy_text(npy_dict("<f4", "(2, 3)"), f4 + "xy")) ==
          "x.npy: at byte 152: 2 bytes after the 24 bytes of data that shape (2, 3) of '<f4' needs");
    SUBCASE("a header length that runs past the end of the file") {
      std::string text = npy_text(npy_dict("<f4", "(2, 3)"), "");
      text[8] = char(0x00);
      text[9] = char(0x10);  // 4096
      CHECK(npy_refusal(text) == "x.npy: at byte 8: the header length says 4096 bytes, but only 118 follow it");
    }
    SUBCASE("a header length that cuts the dict short") {
      std::string text = npy_text(npy_dict("<f4", "(2, 3)"), f4);
      text[8] = char(20);
      CHECK(npy_refusal(text) == "x.npy: at byte 27: header: a string that is never closed");
    }
    SUBCASE("a header with a field missing, or one unknown") {
      CHECK(npy_refusal(npy_text("{'descr': '<f4', 'fortran_order': False}", "")) ==
            "x.npy: at byte 49: header: the header has no 'shape'");
      CHECK(npy_refusal(npy_text("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}", f4.substr(0, 4))) ==
            "x.npy: at byte 66: header: unknown header key 'x' (a .npy header holds 'descr', 'fortran_order' and 'shape')");
      CHECK(npy_refusal(npy_text("{'descr': '<f4', 'fortran_order': 0, 'shape': (1,)}", f4.substr(0, 4))) ==
            "x.npy: at byte 44: header: 'fortran_order' must be True or False");
      CHECK(npy_refusal(npy_text("{'descr': '<f4', 'fortran_order': False, 'shape': [1]}", f4.substr(0, 4))) ==
            "x.npy: at byte 60: header: 'shape' must be a tuple of whole numbers such as (60000, 28, 28)");
    }
  }

  TEST_CASE("an input and label pair loads as a dataset with the sample shape of the file") {
    npy_folder d;
    SUBCASE("float32 inputs [N, F] are taken as they are, int64 labels") {
      const auto x = d.file("x.npy", npy_text(npy_dict("<f4", "(3, 2)"), npy_le_bytes<float>({0.5f, -1, 2, 3, 4, 1e6f})));
      const auto y = d.file("y.npy", npy_text(npy_dict("<i8", "(3,)"), npy_le_bytes<std::int64_t>({2, 0, 1})));
      const auto ds = load_npy_pair(x, y);
      CHECK(ds.sample_shape == std::vector<std::size_t>{2});
      CHECK(ds.classes == 3);
      CHECK(ds.labels == std::vector<std::int32_t>{2, 0, 1});
      CHECK(ds.rows(0, 3) == std::vector<float>{0.5f, -1, 2, 3, 4, 1e6f});
      CHECK(ds.zero_value() == 0.0f);
      const auto norm = load_npy_pair(x, y, {normalization{1, 2}});
      CHECK(norm.rows(0, 1) == std::vector<float>{-0.25f, -1.0f});
      CHECK(norm.zero_value() == -0.5f);
    }
    SUBCASE("uint8 inputs [N, H, W] are read as [N, 1, H, W] and scaled as IDX pixels") {
      const auto x = d.file("x.npy", npy_text(npy_dict("|u1", "(2, 1, 2)"), npy_le_bytes<std::uint8_t>({0, 51, 255, 128})));
      const auto y = d.file("y.npy", npy_text(npy_dict("|u1", "(2,)"), npy_le_bytes<std::uint8_t>({1, 4})));
      const auto ds = load_npy_pair(x, y, {}, 10);
      CHECK(ds.sample_shape == std::vector<std::size_t>{1, 1, 2});
      CHECK(ds.classes == 10);
      CHECK(ds.rows(0, 2) == std::vector<float>{0.0f, 51.0f / 255.0f, 1.0f, 128.0f / 255.0f});
    }
    SUBCASE("[N, C, H, W] keeps its channels; <i4 labels") {
      const auto x = d.file("x.npy", npy_text(npy_dict("<f4", "(1, 3, 2, 2)"), npy_le_bytes(std::vector<float>(12, 1.0f))));
      const auto y = d.file("y.npy", npy_text(npy_dict("<i4", "(1,)"), npy_le_bytes<std::int32_t>({0})));
      CHECK(load_npy_pair(x, y, {}, 2).sample_shape == std::vector<std::size_t>{3, 2, 2});
    }
    SUBCASE("files written by save_npy") {
      const std::vector<std::size_t> xs{4, 3}, ys{4};
      const std::vector<float> xv = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
      const std::vector<std::int64_t> yv = {0, 1, 2, 1};
      save_npy<float>(d.dir / "sx.npy", xs, xv);
      save_npy<std::int64_t>(d.dir / "sy.npy", ys, yv);
      const auto ds = load_npy_pair(d.dir / "sx.npy", d.dir / "sy.npy");
      CHECK(ds.rows(0, 4) == xv);
      CHECK(ds.labels == std::vector<std::int32_t>{0, 1, 2, 1});
    }
  }

  TEST_CASE("a pair that cannot be a dataset is refused naming the file and the field") {
    npy_folder d;
    const auto x = d.file("x.npy", npy_text(npy_dict("<f4", "(3, 2)"), npy_le_bytes(std::vector<float>(6, 0.0f))));
    const auto y = d.file("y.npy", npy_text(npy_dict("<i8", "(3,)"), npy_le_bytes<std::int64_t>({0, 1, 2})));
    const std::string xs = x.string(), ys = y.string();
    SUBCASE("float64 inputs") {
      const auto x8 = d.file("x8.npy", npy_text(npy_dict("<f8", "(3, 2)"), npy_le_bytes(std::vector<double>(6, 0.0))));
      CHECK(pair_refusal(x8, y) == x8.string() +
                                       ": descr '<f8': inputs must be float32 ('<f4') or uint8 ('|u1') (save "
                                       "x.astype(np.float32))");
    }
    SUBCASE("inputs of one dimension") {
      const auto x1 = d.file("x1.npy", npy_text(npy_dict("<f4", "(3,)"), npy_le_bytes(std::vector<float>(3, 0.0f))));
      CHECK(pair_refusal(x1, y) == x1.string() + ": shape (3,): inputs need 2 or more dimensions (N, then the shape of a sample)");
    }
    SUBCASE("float labels") {
      const auto yf = d.file("yf.npy", npy_text(npy_dict("<f4", "(3,)"), npy_le_bytes(std::vector<float>(3, 0.0f))));
      CHECK(pair_refusal(x, yf) == yf.string() +
                                       ": descr '<f4': labels must be integers (|u1, |i1, <u2, <i2, <u4, <i4, <u8, <i8; "
                                       "save y.astype(np.int64))");
    }
    SUBCASE("labels of two dimensions") {
      const auto y2 = d.file("y2.npy", npy_text(npy_dict("<i8", "(3, 1)"), npy_le_bytes<std::int64_t>({0, 1, 2})));
      CHECK(pair_refusal(x, y2) == y2.string() + ": shape (3, 1): labels must have 1 dimension, [N]");
    }
    SUBCASE("counts that differ, naming both files") {
      const auto y4 = d.file("y4.npy", npy_text(npy_dict("<i8", "(4,)"), npy_le_bytes<std::int64_t>({0, 1, 2, 0})));
      CHECK(pair_refusal(x, y4) == xs + ": 3 samples but " + y4.string() + " holds 4 labels");
    }
    SUBCASE("a label out of range for the model's classes, and a negative one") {
      CHECK(pair_refusal(x, y, 2) == ys + ": at byte 144: label 2 of sample 2 is out of range for 2 classes");
      const auto yn = d.file("yn.npy", npy_text(npy_dict("<i8", "(3,)"), npy_le_bytes<std::int64_t>({0, -1, 2})));
      CHECK(pair_refusal(x, yn) == yn.string() + ": at byte 136: label -1 of sample 1 is negative");
    }
    SUBCASE("a file that is not there") {
      CHECK_THROWS_WITH_AS(load_npy_pair(d.dir / "none.npy", y), doctest::Contains("none.npy"), std::system_error);
    }
  }
}

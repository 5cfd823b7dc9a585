#include "layers/data/npy.hpp"

#include "layers/data/detail/file_bytes.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <optional>
#include <stdexcept>

namespace nerve::data {

namespace {

struct npy_type_info {
  npy_type type;
  std::string_view descr;  // as np.save writes it
  std::size_t size;
  char kind;               // 'u', 'i' or 'f'
};
constexpr std::array<npy_type_info, 10> npy_types = {{{npy_type::u8, "|u1", 1, 'u'},
                                                      {npy_type::i8, "|i1", 1, 'i'},
                                                      {npy_type::u16, "<u2", 2, 'u'},
                                                      {npy_type::i16, "<i2", 2, 'i'},
                                                      {npy_type::u32, "<u4", 4, 'u'},
                                                      {npy_type::i32, "<i4", 4, 'i'},
                                                      {npy_type::u64, "<u8", 8, 'u'},
                                                      {npy_type::i64, "<i8", 8, 'i'},
                                                      {npy_type::f32, "<f4", 4, 'f'},
                                                      {npy_type::f64, "<f8", 8, 'f'}}};

const npy_type_info& npy_info(npy_type t) {
  for (const auto& i : npy_types)
    if (i.type == t) return i;
  return npy_types[0];
}

constexpr std::string_view npy_magic = "\x93NUMPY";

/// The dict literal of a `.npy` header, read by hand: only what `np.save` writes (string,
/// boolean and tuple-of-integers values) is accepted. `base` is the header's offset in the
/// file, so that errors point at the byte.
class npy_header_parser {
 public:
  npy_header_parser(std::string_view text, std::size_t base, std::string file)
      : text_(text), base_(base), file_(std::move(file)) {}

  std::optional<std::string> descr;
  std::optional<bool> fortran_order;
  std::optional<std::vector<std::size_t>> shape;

  void parse() {
    skip_space();
    expect('{', "the header is no Python dict (it must start with '{')");
    for (;;) {
      skip_space();
      if (peek() == '}') break;
      const std::size_t key_at = at_;
      const std::string key = string_literal("a key in quotes");
      skip_space();
      expect(':', "':' after the key '" + key + "'");
      skip_space();
      if (key == "descr") {
        if (descr) fail(key_at, "the key 'descr' appears twice");
        descr = string_literal("'descr' must be a string such as '<f4'");
      } else if (key == "fortran_order") {
        if (fortran_order) fail(key_at, "the key 'fortran_order' appears twice");
        fortran_order = boolean("'fortran_order' must be True or False");
      } else if (key == "shape") {
        if (shape) fail(key_at, "the key 'shape' appears twice");
        shape = tuple();
      } else {
        fail(key_at, "unknown header key '" + key + "' (a .npy header holds 'descr', 'fortran_order' and 'shape')");
      }
      skip_space();
      if (peek() == ',') {
        ++at_;
        continue;
      }
      skip_space();
      if (peek() != '}') fail(at_, "',' or '}' expected after the value of '" + key + "'");
    }
    const std::size_t close_at = at_;
    ++at_;
    skip_space();
    if (at_ != text_.size()) fail(at_, "text after the header's closing '}'");
    for (const auto& [name, present] : {std::pair{"descr", descr.has_value()},
                                        std::pair{"fortran_order", fortran_order.has_value()},
                                        std::pair{"shape", shape.has_value()}})
      if (!present) fail(close_at, std::string("the header has no '") + name + "'");
  }

  [[noreturn]] void fail(std::size_t at, const std::string& problem) const {
    throw format_error(file_, base_ + at, "header: " + problem);
  }

 private:
  char peek() const { return at_ < text_.size() ? text_[at_] : '\0'; }
  void skip_space() {
    while (at_ < text_.size() && (text_[at_] == ' ' || text_[at_] == '\t' || text_[at_] == '\n' || text_[at_] == '\r'))
      ++at_;
  }
  void expect(char c, const std::string& what) {
    if (peek() != c) fail(at_, what);
    ++at_;
  }
  std::string string_literal(const std::string& what) {
    const char quote = peek();
    if (quote != '\'' && quote != '"') fail(at_, what);
    const std::size_t end = text_.find(quote, at_ + 1);
    if (end == std::string_view::npos) fail(at_, "a string that is never closed");
    std::string s(text_.substr(at_ + 1, end - at_ - 1));
    at_ = end + 1;
    return s;
  }
  bool boolean(const std::string& what) {
    if (text_.substr(at_, 4) == "True") {
      at_ += 4;
      return true;
    }
    if (text_.substr(at_, 5) == "False") {
      at_ += 5;
      return false;
    }
    fail(at_, what);
  }
  std::vector<std::size_t> tuple() {
    expect('(', "'shape' must be a tuple of whole numbers such as (60000, 28, 28)");
    std::vector<std::size_t> dims;
    for (;;) {
      skip_space();
      if (peek() == ')') break;
      const std::size_t num_at = at_;
      if (peek() < '0' || peek() > '9') fail(at_, "'shape' must be a tuple of whole numbers such as (60000, 28, 28)");
      std::uint64_t v = 0;
      while (peek() >= '0' && peek() <= '9') {
        const unsigned d = unsigned(peek() - '0');
        if (v > (std::numeric_limits<std::uint64_t>::max() - d) / 10) fail(num_at, "a dimension of 'shape' overflows");
        v = v * 10 + d;
        ++at_;
      }
      if (peek() == 'L') ++at_;  // Python 2's long literal, as old files have it
      dims.push_back(static_cast<std::size_t>(v));
      skip_space();
      if (peek() == ',') {
        ++at_;
        continue;
      }
      skip_space();
      if (peek() != ')') fail(at_, "',' or ')' expected in 'shape'");
    }
    ++at_;
    return dims;
  }

  std::string_view text_;
  std::size_t base_;
  std::string file_;
  std::size_t at_ = 0;
};

std::uint64_t npy_read_le(const std::byte* p, std::size_t n) {
  std::uint64_t v = 0;
  for (std::size_t k = 0; k < n; ++k) v |= std::uint64_t(std::to_integer<std::uint8_t>(p[k])) << (8 * k);
  return v;
}

}  // namespace

std::string_view npy_descr(npy_type type) noexcept { return npy_info(type).descr; }

std::string npy_shape_text(std::span<const std::size_t> shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

std::size_t npy_array::size() const noexcept {
  std::size_t n = 1;
  for (std::size_t d : shape) n *= d;
  return n;
}

bool npy_array::is_integer() const noexcept { return npy_info(type).kind != 'f'; }

std::vector<float> npy_array::floats() const {
  if (type != npy_type::f32)
    throw std::invalid_argument("npy_array: floats() of a '" + std::string(npy_descr(type)) + "' array");
  std::vector<float> out(size());
  if constexpr (std::endian::native == std::endian::little) {
    if (!out.empty()) std::memcpy(out.data(), data.data(), 4 * out.size());
  } else {
    for (std::size_t i = 0; i < out.size(); ++i) {
      const auto bits = static_cast<std::uint32_t>(npy_read_le(data.data() + 4 * i, 4));
      std::memcpy(&out[i], &bits, 4);
    }
  }
  return out;
}

std::vector<std::uint8_t> npy_array::bytes() const {
  if (type != npy_type::u8)
    throw std::invalid_argument("npy_array: bytes() of a '" + std::string(npy_descr(type)) + "' array");
  std::vector<std::uint8_t> out(size());
  if (!out.empty()) std::memcpy(out.data(), data.data(), out.size());
  return out;
}

std::int64_t npy_array::integer(std::size_t i) const {
  const auto& info = npy_info(type);
  if (info.kind == 'f')
    throw std::invalid_argument("npy_array: integer() of a '" + std::string(info.descr) + "' array");
  const std::uint64_t raw = npy_read_le(data.data() + info.size * i, info.size);
  if (info.kind == 'u') return raw > std::uint64_t(std::numeric_limits<std::int64_t>::max()) ? -1 : std::int64_t(raw);
  const unsigned bits = unsigned(8 * info.size);
  if (bits < 64 && (raw >> (bits - 1)) & 1u) return std::int64_t(raw | (~std::uint64_t{0} << bits));  // sign-extend
  return std::int64_t(raw);
}

namespace {

/// Checks everything of `bytes` but copies no element: the array's type and shape, and
/// where its data starts (`data_offset`), with `data` left empty.
npy_array parse_npy_header(std::span<const std::byte> bytes, std::string_view name_view) {
  const std::string name(name_view);
  const auto* p = bytes.data();
  const std::size_t n = bytes.size();
  if (n < npy_magic.size() || std::memcmp(p, npy_magic.data(), npy_magic.size()) != 0)
    throw format_error(name, 0, "not a .npy file (it does not start with \\x93NUMPY)");
  if (n < 8) throw format_error(name, n, "the file ends inside the format version");
  const auto major = std::to_integer<unsigned>(p[6]), minor = std::to_integer<unsigned>(p[7]);
  if (major < 1 || major > 3 || minor != 0)
    throw format_error(name, 6,
                       "format version " + std::to_string(major) + "." + std::to_string(minor) +
                           " (this reader takes 1.0, 2.0 and 3.0)");
  const std::size_t len_size = major == 1 ? 2 : 4;
  if (n < 8 + len_size) throw format_error(name, n, "the file ends inside the header length");
  const std::uint64_t header_len = npy_read_le(p + 8, len_size);
  const std::size_t header_at = 8 + len_size;
  if (header_len > n - header_at)
    throw format_error(name, 8,
                       "the header length says " + std::to_string(header_len) + " bytes, but only " +
                           std::to_string(n - header_at) + " follow it");
  std::string_view header(reinterpret_cast<const char*>(p + header_at), static_cast<std::size_t>(header_len));
  npy_header_parser h(header, header_at, name);
  h.parse();

  npy_array a;
  const std::string& d = *h.descr;
  const npy_type_info* info = nullptr;
  for (const auto& i : npy_types) {
    // One-byte types may state any byte order as well as '|' (none to state); '=' is the
    // machine's order, little-endian on every machine this builds for.
    const bool one_byte_alias = i.size == 1 && d.size() == 3 && (d[0] == '<' || d[0] == '=' || d[0] == '>') &&
                                d.substr(1) == i.descr.substr(1);
    const bool native_alias = d.size() == 3 && d[0] == '=' && d.substr(1) == i.descr.substr(1);
    if (d == i.descr || one_byte_alias || native_alias) info = &i;
  }
  if (!info) {
    if (d.size() == 3 && d[0] == '>' && d[2] != '1')
      throw format_error(name, header_at,
                         "descr '" + d + "' is big-endian: only little-endian files are read (save "
                         "x.astype(x.dtype.newbyteorder('<')))");
    throw format_error(name, header_at,
                       "descr '" + d + "' is not a plain number type this reader takes (|u1, |i1, <u2, <i2, <u4, "
                       "<i4, <u8, <i8, <f4, <f8)");
  }
  if (*h.fortran_order)
    throw format_error(name, header_at,
                       "fortran_order is True: only C order is read (save np.ascontiguousarray(x))");
  a.type = info->type;
  a.shape = *h.shape;
  std::uint64_t elements = 1;
  for (std::size_t dim : a.shape) {
    if (dim != 0 && elements > std::numeric_limits<std::uint64_t>::max() / info->size / dim)
      throw format_error(name, header_at, "shape " + npy_shape_text(a.shape) + " overflows");
    elements *= dim;
  }
  const std::uint64_t need = elements * info->size;
  const std::size_t data_at = header_at + static_cast<std::size_t>(header_len);
  const std::size_t have = n - data_at;
  if (have < need)
    throw format_error(name, n,
                       "shape " + npy_shape_text(a.shape) + " of '" + d + "' needs " + std::to_string(need) +
                           " bytes of data, the file has " + std::to_string(have) + " (truncated?)");
  if (have > need)
    throw format_error(name, data_at + need,
                       std::to_string(have - need) + " bytes after the " + std::to_string(need) + " bytes of data that shape " +
                           npy_shape_text(a.shape) + " of '" + d + "' needs");
  a.data_offset = data_at;
  return a;
}

}  // namespace

npy_array parse_npy(std::span<const std::byte> bytes, std::string_view name) {
  npy_array a = parse_npy_header(bytes, name);
  a.data.assign(bytes.begin() + std::ptrdiff_t(a.data_offset), bytes.end());
  return a;
}

npy_array read_npy(const std::filesystem::path& path) {
  auto bytes = detail::read_file_bytes(path);
  npy_array a = parse_npy_header(bytes, path.string());
  // The file's buffer becomes the array's: no second copy of a dataset-sized file.
  bytes.erase(bytes.begin(), bytes.begin() + std::ptrdiff_t(a.data_offset));
  a.data = std::move(bytes);
  return a;
}

template <class T>
std::vector<std::byte> encode_npy(std::span<const std::size_t> shape, std::span<const T> values) {
  const auto& info = npy_info(npy_type_of<T>());
  std::string header = "{'descr': '" + std::string(info.descr) + "', 'fortran_order': False, 'shape': " +
                       npy_shape_text(shape) + ", }";
  // np.save pads with spaces so that the data starts on a 64-byte boundary, then a newline.
  const std::size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::vector<std::byte> out;
  out.reserve(10 + header.size() + values.size() * sizeof(T));
  for (char c : npy_magic) out.push_back(std::byte(static_cast<unsigned char>(c)));
  out.push_back(std::byte{1});
  out.push_back(std::byte{0});
  out.push_back(std::byte(header.size() & 0xff));
  out.push_back(std::byte(header.size() >> 8));
  for (char c : header) out.push_back(std::byte(static_cast<unsigned char>(c)));
  for (const T& v : values) {
    std::uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    for (std::size_t k = 0; k < sizeof(T); ++k) out.push_back(std::byte((bits >> (8 * k)) & 0xff));
  }
  return out;
}

template <class T>
void save_npy(const std::filesystem::path& path, std::span<const std::size_t> shape, std::span<const T> values) {
  const auto bytes = encode_npy<T>(shape, values);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) detail::throw_errno(path, "cannot create it");
  detail::fd_guard guard{fd};
  if (!detail::write_all(fd, bytes)) detail::throw_errno(path, "cannot write it");
}

#define NERVE_NPY_INSTANTIATE(T)                                                                  \
  template std::vector<std::byte> encode_npy<T>(std::span<const std::size_t>, std::span<const T>); \
  template void save_npy<T>(const std::filesystem::path&, std::span<const std::size_t>, std::span<const T>);
NERVE_NPY_INSTANTIATE(std::uint8_t)
NERVE_NPY_INSTANTIATE(std::int8_t)
NERVE_NPY_INSTANTIATE(std::uint16_t)
NERVE_NPY_INSTANTIATE(std::int16_t)
NERVE_NPY_INSTANTIATE(std::uint32_t)
NERVE_NPY_INSTANTIATE(std::int32_t)
NERVE_NPY_INSTANTIATE(std::uint64_t)
NERVE_NPY_INSTANTIATE(std::int64_t)
NERVE_NPY_INSTANTIATE(float)
NERVE_NPY_INSTANTIATE(double)
#undef NERVE_NPY_INSTANTIATE

}  // namespace nerve::data

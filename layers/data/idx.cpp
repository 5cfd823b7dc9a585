#include "layers/data/idx.hpp"

#include "layers/data/detail/file_bytes.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <climits>
#include <cstring>
#include <new>
#include <sstream>

#include <zlib.h>

namespace nerve::data {

namespace {

constexpr std::uint64_t max_idx_bytes = std::uint64_t{1} << 40;  // 1 TiB: far beyond any real file

struct idx_type_info {
  idx_type type;
  std::string_view name;
  std::size_t size;
};
constexpr std::array<idx_type_info, 6> idx_types = {{{idx_type::u8, "u8", 1}, {idx_type::i8, "i8", 1},
                                                     {idx_type::i16, "i16", 2}, {idx_type::i32, "i32", 4},
                                                     {idx_type::f32, "f32", 4}, {idx_type::f64, "f64", 8}}};

// The type whose magic byte is `t`; null for none.
const idx_type_info* find_type(std::uint8_t t) {
  for (const auto& i : idx_types)
    if (static_cast<std::uint8_t>(i.type) == t) return &i;
  return nullptr;
}

std::string hex_byte(std::uint8_t b) {
  static constexpr char digits[] = "0123456789abcdef";
  return std::string("0x") + digits[b >> 4] + digits[b & 15];
}

// The bytes of the gzip members in `in`, decompressed (`cat a.gz b.gz` makes one stream,
// as gzip reads it); errors give offsets in the compressed file. The IDX header's claims
// are checked against what this returns, so a tiny file claiming 4 GiB allocates nothing.
// `enough(so_far)` says how many decompressed bytes can matter (the header's claim and one
// more, once the header is in): decompression stops there and sets `stopped`, so a small
// file that inflates far past its claim (a gzip bomb) costs no more memory than the claim.
template <class Enough>
std::vector<std::byte> gunzip(std::span<const std::byte> in, const std::string& name, const Enough& enough,
                              bool& stopped) {
  z_stream zs{};
  if (inflateInit2(&zs, 15 + 16) != Z_OK) throw std::bad_alloc();  // gzip wrapper only
  struct inflate_end {
    z_stream& zs;
    ~inflate_end() { inflateEnd(&zs); }
  } guard{zs};
  std::vector<std::byte> out(std::max<std::size_t>(2 * in.size(), 4096));
  std::size_t in_pos = 0, used = 0;  // input handed to zlib, output it made
  for (;;) {
    if (zs.avail_in == 0 && in_pos < in.size()) {
      const std::size_t k = std::min<std::size_t>(in.size() - in_pos, UINT_MAX);
      zs.next_in = reinterpret_cast<Bytef*>(const_cast<std::byte*>(in.data() + in_pos));
      zs.avail_in = static_cast<uInt>(k);
      in_pos += k;
    }
    const std::uint64_t cap = enough(std::span<const std::byte>(out.data(), used));
    if (used >= cap) {
      stopped = true;
      break;
    }
    if (used == out.size()) out.resize(2 * out.size());
    const std::size_t room = std::min<std::uint64_t>({out.size() - used, UINT_MAX, cap - used});
    zs.next_out = reinterpret_cast<Bytef*>(out.data() + used);
    zs.avail_out = static_cast<uInt>(room);
    const int rc = inflate(&zs, Z_NO_FLUSH);
    used += room - zs.avail_out;
    const std::uint64_t at = in_pos - zs.avail_in;  // where inflate stopped reading
    if (rc == Z_STREAM_END) {
      if (at == in.size()) break;
      const std::uint64_t left = in.size() - at;
      // Another member may follow; anything else after the stream is an error.
      if (left < 2 || in[at] != std::byte{0x1f} || in[at + 1] != std::byte{0x8b})
        throw format_error(name, at,
                           std::to_string(left) +
                               " trailing bytes after the end of the gzip stream (offset in the compressed file)");
      inflateReset(&zs);
    } else if (rc == Z_BUF_ERROR && zs.avail_in == 0 && in_pos == in.size()) {  // no progress: out of input
      throw format_error(name, at, "gzip stream is truncated: the file ends before the end of the compressed data "
                                   "(offset in the compressed file)");
    } else if (rc == Z_MEM_ERROR) {
      throw std::bad_alloc();
    } else if (rc != Z_OK && rc != Z_BUF_ERROR) {  // Z_DATA_ERROR, Z_NEED_DICT, Z_STREAM_ERROR
      throw format_error(name, at, std::string("corrupt gzip data: ") + (zs.msg ? zs.msg : "inflate failed") +
                                       " (offset in the compressed file)");
    }
  }
  out.resize(used);
  return out;
}

std::uint32_t load_be32(const std::byte* p) {
  return (std::uint32_t(p[0]) << 24) | (std::uint32_t(p[1]) << 16) | (std::uint32_t(p[2]) << 8) |
         std::uint32_t(p[3]);
}

std::string shape_string(const std::vector<std::size_t>& shape) {
  std::ostringstream os;
  for (std::size_t i = 0; i < shape.size(); ++i) os << (i ? "x" : "") << shape[i];
  return os.str();
}

// The elements of `data` (big-endian `T`s, as many as `shape` holds) in host order.
template <class T>
idx_array elements(idx_type type, std::vector<std::size_t> shape, std::span<const std::byte> data) {
  std::vector<T> v(data.size() / sizeof(T));
  std::memcpy(v.data(), data.data(), data.size());
  if constexpr (sizeof(T) > 1 && std::endian::native == std::endian::little) {
    auto* p = reinterpret_cast<unsigned char*>(v.data());
    for (std::size_t i = 0; i < v.size(); ++i, p += sizeof(T)) std::reverse(p, p + sizeof(T));
  }
  return idx_array(type, std::move(shape), std::move(v));
}

}  // namespace

std::string_view idx_type_name(idx_type type) noexcept {
  const auto* i = find_type(static_cast<std::uint8_t>(type));
  return i ? i->name : "unknown";
}

idx_array::idx_array(idx_type type, std::vector<std::size_t> shape, storage values)
    : type_(type), shape_(std::move(shape)), values_(std::move(values)) {
  size_ = std::visit([](const auto& v) { return v.size(); }, values_);
}

std::size_t idx_array::row_size() const noexcept {
  if (shape_.empty()) return 0;
  std::size_t n = 1;
  for (std::size_t i = 1; i < shape_.size(); ++i) n *= shape_[i];
  return n;
}

void idx_array::throw_type_mismatch(idx_type asked) const {
  throw std::invalid_argument("idx_array holds " + std::string(idx_type_name(type_)) + " elements, not " +
                              std::string(idx_type_name(asked)));
}

std::vector<float> idx_array::to_float() const {
  return std::visit(
      [](const auto& v) {
        std::vector<float> out(v.size());
        std::transform(v.begin(), v.end(), out.begin(), [](auto x) { return static_cast<float>(x); });
        return out;
      },
      values_);
}

idx_array parse_idx(std::span<const std::byte> bytes, std::string_view name_view) {
  const std::string name(name_view);
  const bool gzip = bytes.size() >= 2 && bytes[0] == std::byte{0x1f} && bytes[1] == std::byte{0x8b};
  // The bytes the header of `so_far` claims, and one more (a trailing byte is an error
  // already); the header itself where it is wrong (its error needs no more).
  const auto claim = [](std::span<const std::byte> so_far) -> std::uint64_t {
    if (so_far.size() < 4) return UINT64_MAX;
    const std::size_t header = 4 + 4 * std::size_t(so_far[3]);
    const auto* t = find_type(std::uint8_t(so_far[2]));
    if (so_far[0] != std::byte{0} || so_far[1] != std::byte{0} || !t || header == 4) return 4;
    if (so_far.size() < header) return UINT64_MAX;
    std::uint64_t count = 1;
    for (std::size_t i = 4; i < header; i += 4) {
      const std::uint32_t d = load_be32(so_far.data() + i);
      if (d == 0 || count > max_idx_bytes / t->size / d) return header;
      count *= d;
    }
    return header + count * t->size + 1;
  };
  std::vector<std::byte> inflated;
  bool stopped = false;
  if (gzip) inflated = gunzip(bytes, name, claim, stopped);
  const std::span<const std::byte> in = gzip ? std::span<const std::byte>(inflated) : bytes;
  // The reader should know which stream the offsets of the messages count.
  auto fail = [&](std::uint64_t at, const std::string& problem) {
    return format_error(name, at, problem + (gzip ? " (offsets count decompressed bytes)" : ""));
  };
  if (in.size() < 4) {
    throw fail(in.size(), "truncated: the file has " + std::to_string(in.size()) +
                              " bytes, an IDX file starts with a 4-byte magic");
  }
  auto b = [&](std::size_t i) { return static_cast<std::uint8_t>(in[i]); };
  if (b(0) != 0 || b(1) != 0) {
    throw fail(b(0) != 0 ? 0 : 1, "wrong magic " + hex_byte(b(0)) + " " + hex_byte(b(1)) + " " + hex_byte(b(2)) +
                                      " " + hex_byte(b(3)) +
                                      ": an IDX file starts with two zero bytes, the type and the number of "
                                      "dimensions (00 00 TYPE NDIMS)");
  }
  const auto* info = find_type(b(2));
  if (!info) {
    throw fail(2, "unknown data type " + hex_byte(b(2)) +
                      " (IDX knows 0x08 u8, 0x09 i8, 0x0b i16, 0x0c i32, 0x0d f32, 0x0e f64)");
  }
  const auto type = static_cast<idx_type>(b(2));
  const std::size_t ndims = b(3), header = 4 + 4 * ndims;
  if (ndims == 0) throw fail(3, "zero dimensions: an IDX array needs at least one");
  if (in.size() < header) {
    throw fail(in.size(), "truncated: the header declares " + std::to_string(ndims) + " dimensions (" +
                              std::to_string(ndims * 4) + " bytes) but the file ends after " +
                              std::to_string(in.size() - 4) + " of them");
  }
  std::vector<std::size_t> shape(ndims);
  std::uint64_t count = 1;
  const std::uint64_t elem = info->size;
  for (std::size_t i = 0; i < ndims; ++i) {
    std::uint32_t d = load_be32(in.data() + 4 + 4 * i);
    if (d == 0) throw fail(4 + 4 * i, "dimension " + std::to_string(i) + " is zero");
    if (count > max_idx_bytes / elem / d) {
      throw fail(4 + 4 * i, "dimension " + std::to_string(i) + " (" + std::to_string(d) +
                                ") makes the data larger than 1 TiB; the dimensions are corrupt");
    }
    count *= d;
    shape[i] = d;
  }
  const std::uint64_t want = count * elem, have = in.size() - header;
  if (have < want) {
    throw fail(in.size(), "truncated: the " + std::string(idx_type_name(type)) + " data of shape " +
                              shape_string(shape) + " needs " + std::to_string(want) + " bytes after the " +
                              std::to_string(header) + "-byte header, the file has " + std::to_string(have));
  }
  // Anything after the last element is an error: the wrong dimensions, or two files glued.
  if (have > want) {
    throw fail(header + want, (stopped ? "at least " : "") + std::to_string(have - want) +
                                  " trailing bytes after the last element of the " +
                                  shape_string(shape) + " " + std::string(idx_type_name(type)) + " data");
  }
  const auto data = in.subspan(header);
  switch (type) {
    case idx_type::u8: return elements<std::uint8_t>(type, std::move(shape), data);
    case idx_type::i8: return elements<std::int8_t>(type, std::move(shape), data);
    case idx_type::i16: return elements<std::int16_t>(type, std::move(shape), data);
    case idx_type::i32: return elements<std::int32_t>(type, std::move(shape), data);
    case idx_type::f32: return elements<float>(type, std::move(shape), data);
    case idx_type::f64: return elements<double>(type, std::move(shape), data);
  }
  throw fail(2, "unknown data type");  // unreachable: checked above
}

idx_array read_idx(const std::filesystem::path& path) {
  auto bytes = detail::read_file_bytes(path);
  return parse_idx(bytes, path.string());
}

template <class T>
std::vector<std::byte> encode_idx(std::span<const std::size_t> shape, std::span<const T> values) {
  if (shape.empty() || shape.size() > 255) throw std::invalid_argument("encode_idx: 1 to 255 dimensions");
  std::vector<std::byte> out{std::byte{0}, std::byte{0}, std::byte(idx_type_of<T>()), std::byte(shape.size())};
  out.reserve(4 + 4 * shape.size() + values.size() * sizeof(T));
  auto put_big_endian = [&](auto x) {
    auto raw = std::bit_cast<std::array<std::byte, sizeof x>>(x);
    if constexpr (std::endian::native == std::endian::little) std::reverse(raw.begin(), raw.end());
    out.insert(out.end(), raw.begin(), raw.end());
  };
  for (std::size_t d : shape) put_big_endian(static_cast<std::uint32_t>(d));
  for (const T& x : values) put_big_endian(x);
  return out;
}

template std::vector<std::byte> encode_idx<std::uint8_t>(std::span<const std::size_t>, std::span<const std::uint8_t>);
template std::vector<std::byte> encode_idx<std::int8_t>(std::span<const std::size_t>, std::span<const std::int8_t>);
template std::vector<std::byte> encode_idx<std::int16_t>(std::span<const std::size_t>, std::span<const std::int16_t>);
template std::vector<std::byte> encode_idx<std::int32_t>(std::span<const std::size_t>, std::span<const std::int32_t>);
template std::vector<std::byte> encode_idx<float>(std::span<const std::size_t>, std::span<const float>);
template std::vector<std::byte> encode_idx<double>(std::span<const std::size_t>, std::span<const double>);

std::vector<std::byte> gzip_compress(std::span<const std::byte> bytes, int level) {
  z_stream zs{};
  if (deflateInit2(&zs, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) throw std::bad_alloc();
  std::vector<std::byte> out(deflateBound(&zs, static_cast<uLong>(bytes.size())) + 64);
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<std::byte*>(bytes.data()));
  zs.avail_in = static_cast<uInt>(bytes.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  int rc = deflate(&zs, Z_FINISH);
  std::size_t used = out.size() - zs.avail_out;
  deflateEnd(&zs);
  if (rc != Z_STREAM_END) throw std::runtime_error("gzip_compress: deflate failed");
  out.resize(used);
  return out;
}

}  // namespace nerve::data

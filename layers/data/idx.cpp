#include "layers/data/idx.hpp"

#include "layers/data/detail/file_bytes.hpp"

#include <algorithm>
#include <bit>
#include <climits>
#include <cstring>
#include <new>
#include <sstream>

#include <zlib.h>

namespace nerve::data {

namespace {

constexpr std::uint64_t max_idx_bytes = std::uint64_t{1} << 40;  // 1 TiB: far beyond any real file

bool known_type(std::uint8_t t) {
  return t == 0x08 || t == 0x09 || t == 0x0B || t == 0x0C || t == 0x0D || t == 0x0E;
}

std::string hex_byte(std::uint8_t b) {
  static constexpr char digits[] = "0123456789abcdef";
  return std::string("0x") + digits[b >> 4] + digits[b & 15];
}

// Sequential reader over the bytes of an IDX file, decompressing gzip on the way.
// offset() counts bytes delivered, i.e. offsets in the (decompressed) IDX stream.
class byte_source {
 public:
  byte_source(std::span<const std::byte> in, std::string name) : in_(in), name_(std::move(name)) {
    gzip_ = in.size() >= 2 && in[0] == std::byte{0x1f} && in[1] == std::byte{0x8b};
    if (gzip_) {
      zs_.next_in = Z_NULL;
      zs_.avail_in = 0;
      if (inflateInit2(&zs_, 15 + 16) != Z_OK) throw std::bad_alloc();  // gzip wrapper only
      zs_open_ = true;
    }
  }
  byte_source(const byte_source&) = delete;
  byte_source& operator=(const byte_source&) = delete;
  ~byte_source() {
    if (zs_open_) inflateEnd(&zs_);
  }

  bool gzip() const { return gzip_; }
  std::uint64_t offset() const { return delivered_; }
  const std::string& name() const { return name_; }

  // An upper bound on the bytes still to come (deflate expands at most 1032:1),
  // used to cap allocations before the data has proven it exists.
  std::uint64_t max_remaining() const {
    std::uint64_t in_left = in_.size() - in_pos_;
    if (!gzip_) return in_left;
    if (finished_) return 0;
    std::uint64_t pending = zs_.avail_in;
    return (in_left + pending) * 1032 + 65536;
  }

  // Reads up to n bytes; fewer only at the end of the data.
  std::size_t read(std::byte* dst, std::size_t n) {
    std::size_t got = gzip_ ? read_gzip(dst, n) : read_raw(dst, n);
    delivered_ += got;
    return got;
  }

  // Suffix for offsets in messages: the reader should know which stream they count.
  std::string where() const { return gzip_ ? " (offsets count decompressed bytes)" : ""; }

 private:
  std::size_t read_raw(std::byte* dst, std::size_t n) {
    std::size_t k = std::min(n, in_.size() - in_pos_);
    if (k) std::memcpy(dst, in_.data() + in_pos_, k);
    in_pos_ += k;
    return k;
  }

  [[noreturn]] void gzip_fail(const std::string& problem) {
    // The compressed offset is where inflate stopped reading.
    std::uint64_t at = in_pos_ - zs_.avail_in;
    throw format_error(name_, at, problem + " (offset in the compressed file)");
  }

  std::size_t read_gzip(std::byte* dst, std::size_t n) {
    std::size_t got = 0;
    while (got < n && !finished_) {
      if (zs_.avail_in == 0 && in_pos_ < in_.size()) {
        std::size_t k = std::min<std::size_t>(in_.size() - in_pos_, UINT_MAX);
        zs_.next_in = reinterpret_cast<Bytef*>(const_cast<std::byte*>(in_.data() + in_pos_));
        zs_.avail_in = static_cast<uInt>(k);
        in_pos_ += k;
      }
      std::size_t want = std::min<std::size_t>(n - got, UINT_MAX);
      zs_.next_out = reinterpret_cast<Bytef*>(dst + got);
      zs_.avail_out = static_cast<uInt>(want);
      int rc = inflate(&zs_, Z_NO_FLUSH);
      got += want - zs_.avail_out;
      switch (rc) {
        case Z_OK:
          break;
        case Z_STREAM_END:
          next_member();
          break;
        case Z_BUF_ERROR:
          // No progress was possible: out of input before the end of the stream.
          if (zs_.avail_in == 0 && in_pos_ == in_.size())
            gzip_fail("gzip stream is truncated: the file ends before the end of the compressed data");
          break;
        case Z_MEM_ERROR:
          throw std::bad_alloc();
        default:  // Z_DATA_ERROR, Z_NEED_DICT, Z_STREAM_ERROR
          gzip_fail(std::string("corrupt gzip data: ") + (zs_.msg ? zs_.msg : "inflate failed"));
      }
    }
    return got;
  }

  // After a gzip member ends: another member may follow (concatenated gzip, as
  // `cat a.gz b.gz` makes); anything else after the stream is an error.
  void next_member() {
    std::uint64_t member_end = in_pos_ - zs_.avail_in;
    if (member_end == in_.size()) {
      finished_ = true;
      return;
    }
    std::uint64_t left = in_.size() - member_end;
    if (left >= 2 && in_[member_end] == std::byte{0x1f} && in_[member_end + 1] == std::byte{0x8b}) {
      inflateReset(&zs_);
      return;
    }
    throw format_error(name_, member_end,
                       std::to_string(left) +
                           " trailing bytes after the end of the gzip stream (offset in the compressed file)");
  }

  std::span<const std::byte> in_;
  std::string name_;
  bool gzip_ = false;
  bool finished_ = false;
  bool zs_open_ = false;
  z_stream zs_{};
  std::size_t in_pos_ = 0;  // input handed to zlib (gzip) or consumed (raw)
  std::uint64_t delivered_ = 0;
};

std::uint32_t load_be32(const std::byte* p) {
  return (std::uint32_t(p[0]) << 24) | (std::uint32_t(p[1]) << 16) | (std::uint32_t(p[2]) << 8) |
         std::uint32_t(p[3]);
}

template <class T>
void to_host_order(std::vector<T>& v) {
  if constexpr (sizeof(T) > 1 && std::endian::native == std::endian::little) {
    auto* p = reinterpret_cast<unsigned char*>(v.data());
    for (std::size_t i = 0; i < v.size(); ++i, p += sizeof(T)) std::reverse(p, p + sizeof(T));
  }
}

std::string shape_string(const std::vector<std::size_t>& shape) {
  std::ostringstream os;
  for (std::size_t i = 0; i < shape.size(); ++i) os << (i ? "x" : "") << shape[i];
  return os.str();
}

template <class T>
idx_array read_elements(byte_source& src, idx_type type, std::vector<std::size_t> shape,
                        std::size_t count) {
  const std::uint64_t header = src.offset();
  const std::uint64_t want_bytes = std::uint64_t{count} * sizeof(T);
  // Allocate no more than the input can possibly hold, growing if it does hold more:
  // a 20-byte file claiming 4 GiB of data must not allocate 4 GiB.
  std::vector<T> v;
  std::uint64_t cap = std::min<std::uint64_t>(count, src.max_remaining() / sizeof(T) + 1);
  v.resize(static_cast<std::size_t>(cap));
  std::uint64_t got_bytes = 0;
  for (;;) {
    auto* base = reinterpret_cast<std::byte*>(v.data());
    std::size_t ask = v.size() * sizeof(T) - got_bytes;
    std::size_t n = src.read(base + got_bytes, ask);
    got_bytes += n;
    if (n < ask) break;                    // end of data
    if (v.size() == count) break;          // all there
    v.resize(static_cast<std::size_t>(std::min<std::uint64_t>(count, std::uint64_t{v.size()} * 2)));
  }
  if (got_bytes < want_bytes) {
    throw format_error(src.name(), src.offset(),
                       "truncated: the " + std::string(idx_type_name(type)) + " data of shape " +
                           shape_string(shape) + " needs " + std::to_string(want_bytes) +
                           " bytes after the " + std::to_string(header) + "-byte header, the file has " +
                           std::to_string(got_bytes) + src.where());
  }
  // Anything after the last element is an error: the wrong dimensions, or two files glued.
  std::byte scratch[4096];
  std::uint64_t extra = 0;
  for (std::size_t n; (n = src.read(scratch, sizeof scratch)) > 0;) extra += n;
  if (extra) {
    throw format_error(src.name(), header + want_bytes,
                       std::to_string(extra) + " trailing bytes after the last element of the " +
                           shape_string(shape) + " " + std::string(idx_type_name(type)) + " data" +
                           src.where());
  }
  to_host_order(v);
  return idx_array(type, std::move(shape), std::move(v));
}

}  // namespace

std::size_t idx_type_size(idx_type type) noexcept {
  switch (type) {
    case idx_type::u8:
    case idx_type::i8: return 1;
    case idx_type::i16: return 2;
    case idx_type::i32:
    case idx_type::f32: return 4;
    case idx_type::f64: return 8;
  }
  return 0;
}

std::string_view idx_type_name(idx_type type) noexcept {
  switch (type) {
    case idx_type::u8: return "u8";
    case idx_type::i8: return "i8";
    case idx_type::i16: return "i16";
    case idx_type::i32: return "i32";
    case idx_type::f32: return "f32";
    case idx_type::f64: return "f64";
  }
  return "unknown";
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

void idx_array::throw_type_mismatch(std::string_view asked) const {
  throw std::invalid_argument("idx_array holds " + std::string(idx_type_name(type_)) +
                              " elements, not " + std::string(asked));
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

idx_array parse_idx(std::span<const std::byte> bytes, std::string_view name) {
  byte_source src(bytes, std::string(name));
  std::byte magic[4];
  std::size_t got = src.read(magic, 4);
  if (got < 4) {
    throw format_error(src.name(), got,
                       "truncated: the file has " + std::to_string(got) +
                           " bytes, an IDX file starts with a 4-byte magic" + src.where());
  }
  auto b = [&](int i) { return static_cast<std::uint8_t>(magic[i]); };
  if (b(0) != 0 || b(1) != 0) {
    throw format_error(src.name(), b(0) != 0 ? 0 : 1,
                       "wrong magic " + hex_byte(b(0)) + " " + hex_byte(b(1)) + " " + hex_byte(b(2)) +
                           " " + hex_byte(b(3)) +
                           ": an IDX file starts with two zero bytes, the type and the number of "
                           "dimensions (00 00 TYPE NDIMS)" + src.where());
  }
  if (!known_type(b(2))) {
    throw format_error(src.name(), 2,
                       "unknown data type " + hex_byte(b(2)) +
                           " (IDX knows 0x08 u8, 0x09 i8, 0x0b i16, 0x0c i32, 0x0d f32, 0x0e f64)" +
                           src.where());
  }
  const auto type = static_cast<idx_type>(b(2));
  const std::size_t ndims = b(3);
  if (ndims == 0) throw format_error(src.name(), 3, "zero dimensions: an IDX array needs at least one" + src.where());

  std::byte dims_raw[255 * 4];
  got = src.read(dims_raw, ndims * 4);
  if (got < ndims * 4) {
    throw format_error(src.name(), src.offset(),
                       "truncated: the header declares " + std::to_string(ndims) + " dimensions (" +
                           std::to_string(ndims * 4) + " bytes) but the file ends after " +
                           std::to_string(got) + " of them" + src.where());
  }
  std::vector<std::size_t> shape(ndims);
  std::uint64_t count = 1;
  const std::uint64_t elem = idx_type_size(type);
  for (std::size_t i = 0; i < ndims; ++i) {
    std::uint32_t d = load_be32(dims_raw + 4 * i);
    if (d == 0) {
      throw format_error(src.name(), 4 + 4 * i,
                         "dimension " + std::to_string(i) + " is zero" + src.where());
    }
    if (count > max_idx_bytes / elem / d) {
      throw format_error(src.name(), 4 + 4 * i,
                         "dimension " + std::to_string(i) + " (" + std::to_string(d) +
                             ") makes the data larger than 1 TiB; the dimensions are corrupt" +
                             src.where());
    }
    count *= d;
    shape[i] = d;
  }
  const auto n = static_cast<std::size_t>(count);
  switch (type) {
    case idx_type::u8: return read_elements<std::uint8_t>(src, type, std::move(shape), n);
    case idx_type::i8: return read_elements<std::int8_t>(src, type, std::move(shape), n);
    case idx_type::i16: return read_elements<std::int16_t>(src, type, std::move(shape), n);
    case idx_type::i32: return read_elements<std::int32_t>(src, type, std::move(shape), n);
    case idx_type::f32: return read_elements<float>(src, type, std::move(shape), n);
    case idx_type::f64: return read_elements<double>(src, type, std::move(shape), n);
  }
  throw format_error(src.name(), 2, "unknown data type");  // unreachable: checked above
}

idx_array read_idx(const std::filesystem::path& path) {
  auto bytes = detail::read_file_bytes(path);
  return parse_idx(bytes, path.string());
}

template <class T>
std::vector<std::byte> encode_idx(std::span<const std::size_t> shape, std::span<const T> values) {
  static_assert(sizeof(T) <= 8);
  std::uint8_t type = 0;
  if constexpr (std::is_same_v<T, std::uint8_t>) type = 0x08;
  else if constexpr (std::is_same_v<T, std::int8_t>) type = 0x09;
  else if constexpr (std::is_same_v<T, std::int16_t>) type = 0x0B;
  else if constexpr (std::is_same_v<T, std::int32_t>) type = 0x0C;
  else if constexpr (std::is_same_v<T, float>) type = 0x0D;
  else type = 0x0E;
  if (shape.empty() || shape.size() > 255) throw std::invalid_argument("encode_idx: 1 to 255 dimensions");
  std::vector<std::byte> out;
  out.reserve(4 + 4 * shape.size() + values.size() * sizeof(T));
  auto put = [&](std::uint8_t x) { out.push_back(std::byte{x}); };
  put(0);
  put(0);
  put(type);
  put(static_cast<std::uint8_t>(shape.size()));
  for (std::size_t d : shape) {
    auto v = static_cast<std::uint32_t>(d);
    put(v >> 24);
    put((v >> 16) & 0xff);
    put((v >> 8) & 0xff);
    put(v & 0xff);
  }
  for (const T& x : values) {
    unsigned char raw[sizeof(T)];
    std::memcpy(raw, &x, sizeof(T));
    if constexpr (std::endian::native == std::endian::little) std::reverse(raw, raw + sizeof(T));
    for (unsigned char c : raw) put(c);
  }
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

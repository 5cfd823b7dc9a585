#include "layers/checkpoint/safetensors.hpp"

#include "layers/checkpoint/atomic_file.hpp"
#include "layers/data/detail/file_bytes.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <set>
#include <sstream>
#include <system_error>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdexcept>

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; a big-endian host needs byte swapping here");

namespace nerve::checkpoint {

namespace {

using json = nlohmann::json;

struct dtype_entry {
  dtype type;
  std::string_view name;
  std::size_t size;
};

constexpr std::array<dtype_entry, 15> dtypes = {{
    {dtype::boolean, "BOOL", 1}, {dtype::u8, "U8", 1},     {dtype::i8, "I8", 1},
    {dtype::f8_e5m2, "F8_E5M2", 1}, {dtype::f8_e4m3, "F8_E4M3", 1}, {dtype::i16, "I16", 2},
    {dtype::u16, "U16", 2},        {dtype::f16, "F16", 2},         {dtype::bf16, "BF16", 2},
    {dtype::i32, "I32", 4},        {dtype::u32, "U32", 4},         {dtype::f32, "F32", 4},
    {dtype::f64, "F64", 8},        {dtype::i64, "I64", 8},         {dtype::u64, "U64", 8},
}};

// The name used in the header (`"F32"`, `"BOOL"`, …).
std::string_view dtype_name(dtype t) noexcept {
  for (auto& e : dtypes)
    if (e.type == t) return e.name;
  return "?";
}

// The dtype for a header name; empty if unknown.
std::optional<dtype> parse_dtype(std::string_view name) noexcept {
  for (auto& e : dtypes)
    if (e.name == name) return e.type;
  return std::nullopt;
}

std::string in_quotes(std::string_view s) { return "'" + std::string(s) + "'"; }

std::string header_shape_string(std::span<const std::uint64_t> shape) {
  std::ostringstream os;
  os << '[';
  for (std::size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

// `[begin, end]`: a tensor's data_offsets, for messages.
std::string offsets_string(const tensor_info& t) {
  return "[" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "]";
}

// Product of the dimensions times the element size, or nothing on overflow.
std::optional<std::uint64_t> byte_count(std::span<const std::uint64_t> shape, std::size_t elem) {
  std::uint64_t n = elem;
  for (std::uint64_t d : shape) {
    if (d != 0 && n > UINT64_MAX / d) return std::nullopt;
    n *= d;
  }
  return n;
}

float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000) << 16;
  std::uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000 | (mant << 13);  // inf / nan
  } else if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400) == 0);
      bits = sign | std::uint32_t(127 - 15 - e) << 23 | ((mant & 0x3ff) << 13);
    }
  } else {
    bits = sign | (exp + 127 - 15) << 23 | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

template <class T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

}  // namespace

std::size_t dtype_size(dtype t) noexcept {
  for (auto& e : dtypes)
    if (e.type == t) return e.size;
  return 0;
}

std::uint64_t tensor_info::elements() const noexcept {
  std::uint64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

// ---- reading -----------------------------------------------------------------

namespace {
using data::detail::throw_errno;
// Reads `n` bytes at `offset` into `out`; false when the file ends first.
bool read_at(int fd, const std::filesystem::path& path, std::uint64_t offset, std::byte* out, std::size_t n) {
  while (n > 0) {
    const ssize_t got = ::pread(fd, out, n, off_t(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw_errno(path, "cannot read");
    if (got == 0) return false;
    out += got, offset += std::uint64_t(got), n -= std::size_t(got);
  }
  return true;
}
}  // namespace

safetensors_file safetensors_file::read(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_errno(path, "cannot open");
  data::detail::fd_guard guard{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw_errno(path, "cannot stat");
  // A pipe or a device reports no size to check against: read it whole.
  if (!S_ISREG(st.st_mode)) return parse(data::detail::read_file_bytes(path), path.string());

  safetensors_file f;
  f.name_ = path.string();
  const auto size = static_cast<std::uint64_t>(st.st_size);
  std::vector<std::byte> head(std::min<std::uint64_t>(size, 8));
  if (!read_at(fd, path, 0, head.data(), head.size()))
    throw format_error(f.name_, 0, "the file shrank while it was read");
  if (size >= 8) {
    const auto n = load<std::uint64_t>(head.data());
    if (n <= max_header_size && n <= size - 8) {
      head.resize(8 + n);
      if (!read_at(fd, path, 8, head.data() + 8, n)) throw format_error(f.name_, 8, "the file shrank while it was read");
    }
  }
  parse_header(f, head, size);  // every offset checked against the size: now the data is worth reading
  f.bytes_ = std::move(head);
  f.bytes_.resize(size);
  if (!read_at(fd, path, f.buffer_offset_, f.bytes_.data() + f.buffer_offset_, size - f.buffer_offset_))
    throw format_error(f.name_, f.buffer_offset_, "the file shrank while it was read");
  return f;
}

safetensors_file safetensors_file::parse(std::vector<std::byte> bytes, std::string name) {
  safetensors_file f;
  f.name_ = std::move(name);
  f.bytes_ = std::move(bytes);
  parse_header(f, f.bytes_, f.bytes_.size());
  return f;
}

void safetensors_file::parse_header(safetensors_file& f, std::span<const std::byte> head, std::uint64_t file_size) {
  const std::string& file = f.name_;
  const std::uint64_t size = file_size;
  auto fail = [&](std::uint64_t at, const std::string& problem) -> format_error { return format_error(file, at, problem); };

  if (size < 8) {
    throw fail(size, "truncated: the file has " + std::to_string(size) +
                         " bytes, a safetensors file starts with an 8-byte header size");
  }
  const std::uint64_t n = load<std::uint64_t>(head.data());
  if (n > max_header_size) {
    throw fail(0, "header size " + std::to_string(n) + " is over the limit of " + std::to_string(max_header_size) +
                      " bytes (a corrupt file, or not safetensors)");
  }
  if (n > size - 8) {
    throw fail(0, "header size " + std::to_string(n) + " runs past the end of the file (" + std::to_string(size) +
                      " bytes): truncated");
  }
  f.buffer_offset_ = 8 + n;
  const char* text = reinterpret_cast<const char*>(head.data() + 8);
  if (n < 2 || text[0] != '{') throw fail(8, "the JSON header does not start with '{'");

  // nlohmann keeps the last of duplicate keys silently; a checkpoint with two
  // 'fc1.weight' entries is corrupt, so watch the keys as the parser sees them.
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  auto watch = [&](int, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start: open_objects.emplace_back(); break;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case json::parse_event_t::key:
        if (!open_objects.empty() && !open_objects.back().insert(parsed.get<std::string>()).second &&
            duplicate.empty())
          duplicate = parsed.get<std::string>();
        break;
      default: break;
    }
    return true;
  };
  json header;
  try {
    header = json::parse(text, text + n, watch);
  } catch (const json::parse_error& e) {
    // e.byte is 1-based within the header.
    throw fail(8 + (e.byte > 0 ? e.byte - 1 : 0), std::string("the header is not valid JSON: ") + e.what());
  } catch (const json::exception& e) {
    // Found by fuzzing: a number beyond double's range (1e400) is out_of_range, not parse_error.
    throw fail(8, std::string("the header is not valid JSON: ") + e.what());
  }
  if (!duplicate.empty()) throw fail(8, "the header has the key " + in_quotes(duplicate) + " twice");
  if (!header.is_object()) throw fail(8, "the header is not a JSON object");

  const std::uint64_t buffer_size = size - f.buffer_offset_;
  for (auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) throw fail(8, "__metadata__ is not an object of strings");
      for (auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) throw fail(8, "__metadata__ entry " + in_quotes(mk) + " is not a string");
        f.metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor " + in_quotes(key) + ": ";
    if (!value.is_object()) throw fail(8, where + "its entry is not an object");
    tensor_info t;
    t.name = key;
    for (auto& [field, _] : value.items()) {
      if (field != "dtype" && field != "shape" && field != "data_offsets")
        throw fail(8, where + "unknown field " + in_quotes(field));
    }
    auto dt = value.find("dtype");
    if (dt == value.end() || !dt->is_string()) throw fail(8, where + "no dtype string");
    auto parsed = parse_dtype(dt->get_ref<const std::string&>());
    if (!parsed) throw fail(8, where + "unknown dtype " + in_quotes(dt->get_ref<const std::string&>()));
    t.type = *parsed;
    auto sh = value.find("shape");
    if (sh == value.end() || !sh->is_array()) throw fail(8, where + "no shape array");
    for (auto& d : *sh) {
      if (!d.is_number_unsigned()) throw fail(8, where + "shape " + sh->dump() + " holds something other than a non-negative integer");
      t.shape.push_back(d.get<std::uint64_t>());
    }
    auto off = value.find("data_offsets");
    if (off == value.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned())
      throw fail(8, where + "data_offsets is not a pair of non-negative integers");
    t.begin = (*off)[0].get<std::uint64_t>();
    t.end = (*off)[1].get<std::uint64_t>();
    const std::string offsets = "data_offsets " + offsets_string(t);
    if (t.end < t.begin) throw fail(8, where + offsets + " end before they begin");
    if (t.end > buffer_size) {
      throw fail(f.buffer_offset_ + t.begin, where + offsets + " run past the end of the " +
                                                 std::to_string(buffer_size) + "-byte buffer: truncated file?");
    }
    auto need = byte_count(t.shape, dtype_size(t.type));
    if (!need || *need != t.end - t.begin) {
      throw fail(f.buffer_offset_ + t.begin,
                 where + "shape " + header_shape_string(t.shape) + " of " + std::string(dtype_name(t.type)) + " needs " +
                     (need ? std::to_string(*need) : std::string("more than 2^64")) + " bytes, " + offsets +
                     " hold " + std::to_string(t.end - t.begin));
    }
    f.tensors_.push_back(std::move(t));
  }

  // The tensors must tile the buffer: sorted by offset, each starts where the last ended.
  std::sort(f.tensors_.begin(), f.tensors_.end(),
            [](const tensor_info& a, const tensor_info& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
  std::uint64_t at = 0;
  const tensor_info* prev = nullptr;
  for (const auto& t : f.tensors_) {
    if (t.begin != at) {
      const std::string range = offsets_string(t);
      if (t.begin < at) {
        throw fail(f.buffer_offset_ + t.begin, "tensor " + in_quotes(t.name) + ": data_offsets " + range +
                                                   " overlap tensor " + in_quotes(prev->name) + " (which ends at " +
                                                   std::to_string(at) + ")");
      }
      throw fail(f.buffer_offset_ + at, "tensor " + in_quotes(t.name) + ": data_offsets " + range +
                                            " leave a hole of " + std::to_string(t.begin - at) + " bytes after " +
                                            (prev ? "tensor " + in_quotes(prev->name) : std::string("the header")));
    }
    at = t.end;
    prev = &t;
  }
  if (at != buffer_size) {
    throw fail(f.buffer_offset_ + at, std::to_string(buffer_size - at) +
                                          " bytes after the last tensor are not covered by any tensor");
  }
}

const tensor_info* safetensors_file::find(std::string_view tensor) const noexcept {
  for (const auto& t : tensors_)
    if (t.name == tensor) return &t;
  return nullptr;
}

const tensor_info& safetensors_file::at(std::string_view tensor) const {
  if (auto* t = find(tensor)) return *t;
  throw std::out_of_range(name_ + ": no tensor " + in_quotes(tensor));
}

std::span<const std::byte> safetensors_file::data(const tensor_info& t) const noexcept {
  return std::span<const std::byte>(bytes_).subspan(buffer_offset_ + t.begin, t.end - t.begin);
}

std::vector<float> safetensors_file::to_float(const tensor_info& t) const {
  const auto raw = data(t);
  const std::size_t n = static_cast<std::size_t>(t.elements()), es = dtype_size(t.type);
  std::vector<float> out(n);
  const std::byte* p = raw.data();
  auto each = [&](auto convert) {
    for (std::size_t i = 0; i < n; ++i) out[i] = convert(p + i * es);
  };
  switch (t.type) {
    case dtype::f32: if (n) std::memcpy(out.data(), p, n * 4); break;
    case dtype::f64: each([](const std::byte* q) { return static_cast<float>(load<double>(q)); }); break;
    case dtype::f16: each([](const std::byte* q) { return half_to_float(load<std::uint16_t>(q)); }); break;
    case dtype::bf16:
      each([](const std::byte* q) { return std::bit_cast<float>(std::uint32_t{load<std::uint16_t>(q)} << 16); });
      break;
    case dtype::boolean: each([](const std::byte* q) { return q[0] != std::byte{0} ? 1.0f : 0.0f; }); break;
    case dtype::u8: each([](const std::byte* q) { return static_cast<float>(load<std::uint8_t>(q)); }); break;
    case dtype::i8: each([](const std::byte* q) { return static_cast<float>(load<std::int8_t>(q)); }); break;
    case dtype::i16: each([](const std::byte* q) { return static_cast<float>(load<std::int16_t>(q)); }); break;
    case dtype::u16: each([](const std::byte* q) { return static_cast<float>(load<std::uint16_t>(q)); }); break;
    case dtype::i32: each([](const std::byte* q) { return static_cast<float>(load<std::int32_t>(q)); }); break;
    case dtype::u32: each([](const std::byte* q) { return static_cast<float>(load<std::uint32_t>(q)); }); break;
    case dtype::i64: each([](const std::byte* q) { return static_cast<float>(load<std::int64_t>(q)); }); break;
    case dtype::u64: each([](const std::byte* q) { return static_cast<float>(load<std::uint64_t>(q)); }); break;
    case dtype::f8_e5m2:
    case dtype::f8_e4m3:
      throw format_error(name_, buffer_offset_ + t.begin,
                         "tensor " + in_quotes(t.name) + ": converting " + std::string(dtype_name(t.type)) +
                             " to float is not supported");
  }
  return out;
}

std::vector<std::int64_t> safetensors_file::to_int64(const tensor_info& t) const {
  const auto raw = data(t);
  const std::size_t n = static_cast<std::size_t>(t.elements()), es = dtype_size(t.type);
  std::vector<std::int64_t> out(n);
  const std::byte* p = raw.data();
  auto each = [&](auto convert) {
    for (std::size_t i = 0; i < n; ++i) out[i] = convert(p + i * es);
  };
  switch (t.type) {
    case dtype::i64: if (n) std::memcpy(out.data(), p, n * 8); break;
    case dtype::boolean:
    case dtype::u8: each([](const std::byte* q) { return std::int64_t{load<std::uint8_t>(q)}; }); break;
    case dtype::i8: each([](const std::byte* q) { return std::int64_t{load<std::int8_t>(q)}; }); break;
    case dtype::i16: each([](const std::byte* q) { return std::int64_t{load<std::int16_t>(q)}; }); break;
    case dtype::u16: each([](const std::byte* q) { return std::int64_t{load<std::uint16_t>(q)}; }); break;
    case dtype::i32: each([](const std::byte* q) { return std::int64_t{load<std::int32_t>(q)}; }); break;
    case dtype::u32: each([](const std::byte* q) { return std::int64_t{load<std::uint32_t>(q)}; }); break;
    default:
      throw format_error(name_, buffer_offset_ + t.begin,
                         "tensor " + in_quotes(t.name) + ": dtype " + std::string(dtype_name(t.type)) +
                             " is not an integer type that fits int64");
  }
  return out;
}

// ---- writing -----------------------------------------------------------------

namespace {
// Python's safetensors order: larger dtypes first (keeps every tensor aligned), then by name.
std::vector<const tensor_ref*> layout_order(std::span<const tensor_ref> tensors) {
  std::vector<const tensor_ref*> order;
  for (auto& t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const tensor_ref* a, const tensor_ref* b) {
    auto sa = dtype_size(a->type), sb = dtype_size(b->type);
    return sa != sb ? sa > sb : a->name < b->name;
  });
  return order;
}
}  // namespace

tensor_ref f32_tensor(std::string name, std::vector<std::uint64_t> shape, std::span<const float> values) {
  return {std::move(name), dtype::f32, std::move(shape), std::as_bytes(values)};
}
tensor_ref i64_tensor(std::string name, std::vector<std::uint64_t> shape, std::span<const std::int64_t> values) {
  return {std::move(name), dtype::i64, std::move(shape), std::as_bytes(values)};
}
tensor_ref f64_tensor(std::string name, std::vector<std::uint64_t> shape, std::span<const double> values) {
  return {std::move(name), dtype::f64, std::move(shape), std::as_bytes(values)};
}

std::vector<std::byte> encode_header(std::span<const tensor_ref> tensors, const metadata& meta) {
  json header = json::object();
  if (!meta.empty()) header["__metadata__"] = meta;
  std::uint64_t at = 0;
  for (const tensor_ref* t : layout_order(tensors)) {
    if (t->name == "__metadata__") throw std::invalid_argument("safetensors: '__metadata__' is not a tensor name");
    if (header.contains(t->name)) throw std::invalid_argument("safetensors: tensor " + in_quotes(t->name) + " given twice");
    auto need = byte_count(t->shape, dtype_size(t->type));
    if (!need || *need != t->bytes.size()) {
      throw std::invalid_argument("safetensors: tensor " + in_quotes(t->name) + " of shape " + header_shape_string(t->shape) +
                                  " and dtype " + std::string(dtype_name(t->type)) + " has " +
                                  std::to_string(t->bytes.size()) + " bytes of data");
    }
    header[t->name] = {{"dtype", dtype_name(t->type)}, {"shape", t->shape}, {"data_offsets", {at, at + *need}}};
    at += *need;
  }
  std::string text;
  try {
    text = header.dump();  // compact; the control characters are escaped, UTF-8 passes as it is
  } catch (const json::type_error& e) {
    throw std::invalid_argument(std::string("safetensors: a tensor name or metadata string is not valid UTF-8: ") +
                                e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  std::vector<std::byte> out(8 + text.size());
  const std::uint64_t n = text.size();
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, text.data(), text.size());
  return out;
}

std::vector<std::byte> encode_safetensors(std::span<const tensor_ref> tensors, const metadata& meta) {
  auto out = encode_header(tensors, meta);
  for (const tensor_ref* t : layout_order(tensors)) out.insert(out.end(), t->bytes.begin(), t->bytes.end());
  return out;
}

void write_safetensors(const std::filesystem::path& path, std::span<const tensor_ref> tensors, const metadata& meta,
                       const write_options& options) {
  const auto header = encode_header(tensors, meta);  // validates before touching the disk
  const std::size_t chunk = std::max<std::size_t>(options.chunk_bytes, 1);
  atomic_file file(path);
  std::uint64_t written = 0;
  auto put = [&](std::span<const std::byte> bytes) {
    for (std::size_t i = 0; i < bytes.size(); i += chunk) {
      auto part = bytes.subspan(i, std::min(chunk, bytes.size() - i));
      file.write(part);
      written += part.size();
      if (options.on_progress) options.on_progress(written);
    }
  };
  put(header);
  for (const tensor_ref* t : layout_order(tensors)) put(t->bytes);
  file.commit();
}

}  // namespace nerve::checkpoint

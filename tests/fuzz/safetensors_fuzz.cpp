// libFuzzer harness for the safetensors reader: any input must either parse or
// throw nerve::data::format_error. A file that parses must also survive
// conversion of every tensor and re-encode to a file that parses to the same
// tensors (names, dtypes, shapes, bytes) and metadata. Built and run by scripts/fuzz.

#include "layers/checkpoint/safetensors.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

using namespace nerve::checkpoint;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::byte> bytes(size);
  if (size) std::memcpy(bytes.data(), data, size);
  try {
    auto file = safetensors_file::parse(std::move(bytes), "fuzz-input");
    std::vector<tensor_ref> refs;
    for (const auto& t : file.tensors()) {
      if (t.end - t.begin != t.elements() * dtype_size(t.type)) std::abort();
      try {
        (void)file.to_float(t);
      } catch (const nerve::data::format_error&) {  // F8 has no float conversion
      }
      try {
        (void)file.to_int64(t);
      } catch (const nerve::data::format_error&) {  // floating types have no int64 conversion
      }
      refs.push_back(tensor_ref{t.name, t.type, t.shape, file.data(t)});
    }
    // Names and metadata came through the JSON parser, so they are valid UTF-8 and must write back.
    auto again = encode_safetensors(refs, file.metadata());
    auto back = safetensors_file::parse(std::move(again), "re-encoded");
    if (back.metadata() != file.metadata() || back.tensors().size() != file.tensors().size()) std::abort();
    for (const auto& t : file.tensors()) {
      const tensor_info* u = back.find(t.name);
      if (!u || u->type != t.type || u->shape != t.shape) std::abort();
      auto a = file.data(t), b = back.data(*u);
      if (!std::equal(a.begin(), a.end(), b.begin(), b.end())) std::abort();
    }
  } catch (const nerve::data::format_error&) {
  }
  return 0;
}

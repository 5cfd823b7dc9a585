// libFuzzer harness for the IDX reader (raw and gzip): any input must either
// parse or throw nerve::data::format_error. Anything else (a crash, a sanitizer
// report, std::bad_alloc from an unchecked size, another exception) is a finding.
// Built and run by scripts/fuzz.

#include "layers/data/idx.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <variant>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    auto array = nerve::data::parse_idx(std::as_bytes(std::span(data, size)), "fuzz-input");
    // The result must be self-consistent: the element count is the product of the shape.
    std::size_t n = 1;
    for (auto d : array.shape()) n *= d;
    if (n != array.size() || array.shape().empty()) std::abort();
    // Touch every element through the float conversion (reads all the storage).
    volatile float sink = 0;
    for (float x : array.to_float()) sink = sink + x;
  } catch (const nerve::data::format_error&) {
  }
  return 0;
}

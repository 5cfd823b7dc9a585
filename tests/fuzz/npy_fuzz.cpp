// libFuzzer harness for the .npy reader: any input must either parse or throw
// nerve::data::format_error. Anything else (a crash, a sanitizer report, std::bad_alloc
// from an unchecked size, another exception) is a finding. Built and run by scripts/fuzz.

#include "layers/data/npy.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const auto array = nerve::data::parse_npy(std::as_bytes(std::span(data, size)), "fuzz-input");
    // The result must be self-consistent: the data holds exactly the shape's elements.
    std::size_t n = 1;
    for (auto d : array.shape) n *= d;
    if (n != array.size()) std::abort();
    // Read every element through the accessor of its type.
    volatile double sink = 0;
    if (array.type == nerve::data::npy_type::f32) {
      for (float x : array.floats()) sink = sink + x;
    } else if (array.type == nerve::data::npy_type::u8) {
      for (auto b : array.bytes()) sink = sink + b;
    } else if (array.is_integer()) {
      for (std::size_t i = 0; i < n; ++i) sink = sink + double(array.integer(i));
    }
  } catch (const nerve::data::format_error&) {
  }
  return 0;
}

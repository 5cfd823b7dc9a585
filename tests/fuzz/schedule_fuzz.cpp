// libFuzzer harness for the schedule text form (layers/pipeline/schedule.cpp): any
// input must either parse or throw std::invalid_argument naming the line. A schedule
// that parses goes through `validate` (which may refuse it, with schedule_error); one
// that validates must simulate to finite times and survive `to_text` and
// `parse_schedule` unchanged. Built and run by scripts/fuzz.

#include "layers/pipeline/schedule.hpp"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string_view>

using namespace nerve::pipeline;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  schedule s;
  try {
    s = parse_schedule(text);
  } catch (const std::invalid_argument&) {
    return 0;
  }
  try {
    validate(s);
  } catch (const schedule_error&) {
    return 0;
  }
  const auto sim = simulate(s);
  if (!std::isfinite(sim.makespan) || sim.makespan < 0) std::abort();
  (void)to_table(s);
  (void)to_step_table(s);
  const schedule back = parse_schedule(to_text(s));
  if (back.stages != s.stages || back.micro_batches != s.micro_batches || back.chunks != s.chunks ||
      back.split_backward != s.split_backward || back.actions != s.actions)
    std::abort();
  return 0;
}

#pragma once
/// \file
/// Timing helpers of the GPU benchmarks (`nerve-bench gpu`, `nerve-bench conv`): the
/// device time of some work, read from its events on a `gpu::loop_thread`.
#include "gpu/device.hpp"
#include "gpu/loop_thread.hpp"
#include "gpu/stream.hpp"
#include "gpu/testing.hpp"

#include <chrono>
#include <functional>
#include <latch>

namespace nerve::bench {

using clock_type = std::chrono::steady_clock;

using gpu::loop_thread;

inline double us_between(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

/// Spins for `d` (a sleep would let the core idle and add its wake-up to what follows).
inline void busy_wait(std::chrono::microseconds d) {
  const auto until = clock_type::now() + d;
  while (clock_type::now() < until) {
  }
}

/// Time from opening a gate (everything `enqueue` put behind it) to its completion
/// handler on the loop: the device's time for that work, plus the completion's trip.
/// Work behind the gate must have run once before (CUDA loads kernels lazily:
/// gpu/kernels/launch.hpp).
inline double gated_us(gpu::device& dev, gpu::stream& s, loop_thread& loop, const std::function<void()>& enqueue) {
  gpu::testing::gate gate(dev);
  gate.enqueue(s);
  enqueue();
  std::latch done(1);
  clock_type::time_point t1;
  s.async_wait(loop.executor(), [&](std::error_code) {
    t1 = clock_type::now();
    done.count_down();
  });
  busy_wait(std::chrono::microseconds(200));  // let the queue settle
  const auto t0 = clock_type::now();
  gate.open();
  done.wait();
  return us_between(t0, t1);
}

}  // namespace nerve::bench

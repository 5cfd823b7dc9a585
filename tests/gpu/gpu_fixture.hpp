#pragma once
// Helpers of the device suites: a CUDA device and stream, uploads/downloads,
// fresh random inputs (seed printed), and the tolerance check.
#include "gpu/device.hpp"
#include "gpu/memory.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace nerve::gpu::test {

/// Unit roundoff of float32: 2^-24.
constexpr double unit_roundoff = 0x1p-24;

/// The device suites' device: CUDA; NERVE_GPU_TEST_STANDIN=1 runs them on the
/// stand-in instead (a dry run of the tests themselves where there is no GPU).
inline gpu::device_options cuda_options(gpu::wait_mode mode = gpu::wait_mode::poller) {
  gpu::device_options o;
  o.backend = std::getenv("NERVE_GPU_TEST_STANDIN") ? gpu::backend_kind::standin : gpu::backend_kind::cuda;
  o.waits = mode;
  return o;
}

/// The device of the suites compiled twice (layers_test.cpp, pipeline_test.cpp): the
/// CPU stand-in in gpu_test (NERVE_GPU_LAYERS_STANDIN), CUDA in gpu_device_test.
inline gpu::device_options layers_suite_options() {
#if NERVE_GPU_LAYERS_STANDIN
  gpu::device_options o;
  o.backend = gpu::backend_kind::standin;
  return o;
#else
  return cuda_options();
#endif
}

struct cuda_fixture {
  gpu::device dev{cuda_options()};
  gpu::stream s = dev.create_stream();
  std::mt19937_64 rng{[] {
    const std::uint64_t seed = std::random_device{}();
    MESSAGE("random seed " << seed);
    return seed;
  }()};

  std::vector<float> normal(std::size_t n, float scale = 1.0f) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
  }
  template <class T>
  gpu::device_buffer up(const std::vector<T>& v) {
    gpu::device_buffer b(s, std::max<std::size_t>(1, v.size()) * sizeof(T));
    gpu::copy_async(s, b.data(), v.data(), v.size() * sizeof(T));
    s.synchronize();  // the host vector may go
    return b;
  }
  template <class T>
  std::vector<T> down(const void* p, std::size_t n) {
    std::vector<T> v(n);
    gpu::copy_async(s, v.data(), p, n * sizeof(T));
    s.synchronize();
    return v;
  }
};

inline float* f(gpu::device_buffer& b) { return static_cast<float*>(b.data()); }
inline std::int32_t* i32(gpu::device_buffer& b) { return static_cast<std::int32_t*>(b.data()); }

/// Checks |got − want| ≤ tol[i] everywhere; reports the worst element.
inline void check_within(const std::string& what, const std::vector<float>& got, const std::vector<float>& want,
                         const std::vector<double>& tol) {
  REQUIRE(got.size() == want.size());
  double worst = 0.0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(double(got[i]) - double(want[i]));
    const double ratio = err == 0.0 ? 0.0 : err / std::max(tol[i], 1e-300);
    if (!(ratio <= worst)) {
      worst = ratio;
      at = i;
    }
  }
  INFO(what << ": worst error/tolerance " << worst << " at " << at << " (gpu " << got[at] << ", cpu "
            << want[at] << ", tol " << tol[at] << ")");
  CHECK(worst <= 1.0);
}

/// Bitwise equality (same operations in the same order on both sides).
template <class T>
void check_equal(const std::string& what, const std::vector<T>& got, const std::vector<T>& want) {
  REQUIRE(got.size() == want.size());
  std::size_t diff = 0, first = got.size();
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(got[i] == want[i])) {
      ++diff;
      if (first == got.size()) first = i;
    }
  INFO(what << ": " << diff << " elements differ, first at " << first);
  CHECK(diff == 0);
}

}  // namespace nerve::gpu::test

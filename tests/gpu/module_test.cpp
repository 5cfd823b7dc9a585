// The CUDA backend is a module opened when a CUDA device is first asked for
// (gpu/detail/cuda_module.hpp). Its own binary: the process must not have asked for
// CUDA before the test starts, which a suite sharing a process cannot promise.
// It needs no GPU: with none, asking still loads the module and says no_device.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "gpu/device.hpp"
#include "gpu/status.hpp"

#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>

namespace {

/// The first line of /proc/self/maps naming a file that contains `part`, or "".
std::string mapped(const std::string& part) {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);)
    if (line.find(part) != std::string::npos) return line;
  return {};
}

std::string any_cuda_mapped() {
  for (const char* lib : {"libcudart", "libcublas", "libcuda.so", "libnerve_gpu_cuda"})
    if (auto line = mapped(lib); !line.empty()) return line;
  return {};
}

}  // namespace

TEST_SUITE("gpu.module") {
  TEST_CASE("asking for a CUDA device loads the backend module, and not before") {
    CHECK_MESSAGE(any_cuda_mapped().empty(), "mapped before any CUDA device was asked for: " << any_cuda_mapped());

    // One past the last device: no_device with or without a GPU, or a module.
    const int n = nerve::gpu::device::cuda_device_count();
    nerve::gpu::device_options o;
    o.backend = nerve::gpu::backend_kind::cuda;
    o.ordinal = n;
    std::string what;
    try {
      nerve::gpu::device d(o);
      FAIL("opened CUDA device " << n << " of " << n);
    } catch (const nerve::gpu::error& e) {
      CHECK(e.code() == nerve::gpu::errc::no_device);
      what = e.what();
    }
    INFO("message: " << what);
    CHECK(what.find("no CUDA device " + std::to_string(n)) != std::string::npos);

    if (const char* override_path = std::getenv("NERVE_GPU_MODULE")) {
      // Pointed at a module that is not there: no device, and the message names the path.
      CHECK(n == 0);
      CHECK(what.find(override_path) != std::string::npos);
      CHECK(mapped("libnerve_gpu_cuda").empty());
    } else if (std::filesystem::exists(NERVE_GPU_CUDA_MODULE)) {
      CHECK_MESSAGE(!mapped("libnerve_gpu_cuda.so").empty(), "the module was not loaded: " << what);
      CHECK(!mapped("libcudart").empty());
    }
  }
}

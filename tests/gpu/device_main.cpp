// Main of the GPU suites: exit 77 (CTest: skipped) where no CUDA device can be opened.
#define DOCTEST_CONFIG_IMPLEMENT
#include "gpu/device.hpp"

#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  if (nerve::gpu::device::cuda_device_count() == 0 && !std::getenv("NERVE_GPU_TEST_STANDIN")) {
    std::puts("no CUDA device: skipped");
    return 77;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}

// Test-only kernels: a planted fault and a host-opened gate.
#include "gpu/kernels/launch.hpp"

namespace nerve::gpu::cuda_kernels {
namespace {

__global__ void fault_kernel(float* p) { *reinterpret_cast<volatile float*>(p) = 1.0f; }

__global__ void gate_kernel(volatile std::int32_t* flag) {
  while (*flag == 0) __nanosleep(200);
}

}  // namespace

void fault(cudaStream_t st) {
  // Far outside any allocation: cudaErrorIllegalAddress, sticky.
  fault_kernel<<<1, 1, 0, st>>>(reinterpret_cast<float*>(std::uintptr_t(0x10)));
}

void gate(cudaStream_t st, volatile std::int32_t* device_flag) { gate_kernel<<<1, 1, 0, st>>>(device_flag); }

}  // namespace nerve::gpu::cuda_kernels

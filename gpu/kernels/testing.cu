// Test-only kernels: planted faults and a host-opened gate.
#include "gpu/kernels/grid.cuh"
#include "gpu/kernels/launch.hpp"

namespace nerve::gpu::cuda_kernels {
namespace {

__global__ void global_fault_kernel(float* p) { *reinterpret_cast<volatile float*>(p) = 1.0f; }

// The offset comes in at run time so the compiler cannot prove (or drop) the store.
__global__ void shared_fault_kernel(std::size_t offset) {
  extern __shared__ float tile[];
  reinterpret_cast<volatile float*>(tile)[offset] = 1.0f;
}

__global__ void trap_kernel() { __trap(); }

__global__ void gate_kernel(volatile std::int32_t* flag) {
  while (*flag == 0) __nanosleep(200);
}

}  // namespace

void fault(cudaStream_t st, int kind) {
  switch (kind) {
    case 1: shared_fault_kernel<<<1, 1, 16, st>>>(std::size_t(1) << 26); break;  // 256 MiB past a 16-byte tile
    case 2: trap_kernel<<<1, 1, 0, st>>>(); break;
    default: global_fault_kernel<<<1, 1, 0, st>>>(reinterpret_cast<float*>(std::uintptr_t(0x10))); break;
  }
}

void gate(cudaStream_t st, volatile std::int32_t* device_flag) { gate_kernel<<<1, 1, 0, st>>>(device_flag); }

cudaError_t preload_testing() {
  return load_now({
      reinterpret_cast<const void*>(&global_fault_kernel), reinterpret_cast<const void*>(&shared_fault_kernel),
      reinterpret_cast<const void*>(&trap_kernel), reinterpret_cast<const void*>(&gate_kernel)});
}

}  // namespace nerve::gpu::cuda_kernels

#pragma once
// Launchers of the CUDA kernels (C++17: included by the .cu files and by the
// CUDA backend). Each only enqueues on `stream`; the backend checks the launch.
#include "gpu/kernels/ops.hpp"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace nerve::gpu::cuda_kernels {

/// `op` over elements [0, n) (gpu/kernels/ops.hpp), one thread per element.
void each(cudaStream_t st, std::size_t n, const ops::pointwise_op& op);
/// A window op over its `size()` elements, on 32-bit indices where every index fits.
void each(cudaStream_t st, const ops::window_op& op);

void column_sums(cudaStream_t st, const float* x, std::size_t rows, std::size_t cols, float* out, float beta);
/// `correct` is zeroed (cudaMemsetAsync) and counted with atomics.
void softmax_xent_forward(cudaStream_t st, const float* logits, const std::int32_t* labels, std::size_t rows,
                          std::size_t cols, float* probs, float* loss, float* correct);

/// Load every kernel of their file now; the CUDA backend calls them all when a device
/// opens. CUDA (12.2 on) loads a kernel lazily, at its first launch, and loading may
/// wait for the whole context to go idle: a kernel launched for the first time behind
/// one that spins until the host lets it go (the test gate) deadlocks (docs/gpu.md).
/// cuBLAS's kernels stay lazy: work behind a gate runs each product once before (a
/// warm-up), or the process sets CUDA_MODULE_LOADING=EAGER. Each returns the first error.
cudaError_t preload_elementwise();
cudaError_t preload_loss();
cudaError_t preload_window();
cudaError_t preload_testing();

/// Test-only: a one-thread kernel that faults: 0 stores to global address 0x10,
/// 1 stores far outside shared memory, 2 traps.
void fault(cudaStream_t st, int kind);
/// Test-only: a one-thread kernel spinning until *flag (mapped pinned memory) is non-zero.
void gate(cudaStream_t st, volatile std::int32_t* device_flag);

}  // namespace nerve::gpu::cuda_kernels

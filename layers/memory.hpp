#pragma once
/// \file
/// The heap policy for training: memory a step frees stays in the process for the next step.

namespace nerve::layers {

/// Keeps freed heap memory in the process instead of handing it back to the kernel.
///
/// A training step allocates and frees the same large blocks every time: activations
/// and gradients (1 MiB each for `deep-mlp` at batch 256) and Eigen's packed GEMM
/// panels (up to 3 MiB per product). glibc's defaults give such blocks back to the
/// kernel: blocks over the (moving) mmap threshold are unmapped when freed, and a heap
/// whose free top exceeds the trim threshold is shrunk. The next step then touches
/// fresh pages, and each page fault on the shared virtual machines costs microseconds,
/// on whichever thread's heap happened to be trimmed, which made the actor-vs-direct
/// comparison depend on the allocation history (docs/performance.md has the counts).
/// With this policy a step reuses the pages of the previous one; the process keeps its
/// high-water mark.
///
/// Sets glibc's `M_MMAP_THRESHOLD` to 32 MiB (the most it accepts on 64-bit; larger
/// blocks are still mapped and unmapped) and `M_TRIM_THRESHOLD` to 1 GiB, process-wide,
/// once; later calls do nothing. A no-op without glibc and under the sanitizers'
/// allocators. The direct executor and the network call it on construction.
/// Thread-safe.
void keep_freed_memory() noexcept;

}  // namespace nerve::layers

#pragma once
/// \file
/// The CPU twins of the GPU kernels: what the stand-in backend runs on its stream
/// workers, and the reference the GPU tests compare against. The pointwise and window
/// ops are gpu/kernels/ops.hpp's, run by `each`; gemm and the reductions are plain
/// loops that accumulate in double. Single-threaded, deterministic.

#include "gpu/blas.hpp"
#include "gpu/kernels.hpp"

#include <cstddef>
#include <cstdint>

namespace nerve::gpu::cpu {

/// `op(i)` for i = 0, 1, …, n − 1, in order.
template <class Op>
void each(std::size_t n, const Op& op) {
  for (std::size_t i = 0; i < n; ++i) op(i);
}

void gemm(transpose ta, transpose tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
          int ldb, float beta, float* c, int ldc);
void column_sums(const float* x, std::size_t rows, std::size_t cols, float* out, float beta);
void softmax_xent_forward(const float* logits, const std::int32_t* labels, std::size_t rows, std::size_t cols,
                          float* probs, float* loss, float* correct);

}  // namespace nerve::gpu::cpu

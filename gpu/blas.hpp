#pragma once
/// \file
/// Matrix products on a stream, row-major, through cuBLAS on a GPU (one handle and
/// workspace per stream, math mode set explicitly: fp32, TF32 only where the stream
/// was created with `stream_options::tf32`) and plain loops on the stand-in.
///
/// Row-major data meets column-major cuBLAS through the transpose identity: a
/// row-major C (m×n) is a column-major Cᵀ, and C = op(A)·op(B) is Cᵀ = op(B)ᵀ·op(A)ᵀ,
/// so we call `cublasSgemm(tb, ta, n, m, k, B, A, C)` with the same flags.
///
/// All pointers are device memory of the stream's device; the call only enqueues.
/// Any thread may call, one at a time per stream (a stream belongs to one loop).

#include <cstdint>

namespace nerve::gpu {

class stream;

/// Whether an operand is used as stored or transposed.
enum class transpose : bool { no = false, yes = true };

/// C = alpha·op(A)·op(B) + beta·C, all row-major. op(A) is m×k, op(B) is k×n, C is m×n.
/// Leading dimensions are row strides in elements: A stored m×k has lda ≥ k (k×m
/// when transposed: lda ≥ m). beta = 1 accumulates (gradients).
/// Forward y = x·Wᵀ: `gemm(s, no, yes, batch, out, in, 1, x, in, w, in, 0, y, out)`;
/// backward dX = dY·W: `(no, no, batch, in, out)`; dW += dYᵀ·X: `(yes, no, out, in, batch, beta=1)`.
void gemm(stream& s, transpose ta, transpose tb, int m, int n, int k, float alpha, const float* a, int lda,
          const float* b, int ldb, float beta, float* c, int ldc);

/// `gemm` with tight leading dimensions.
void gemm(stream& s, transpose ta, transpose tb, int m, int n, int k, float alpha, const float* a, const float* b,
          float beta, float* c);

/// `batch` independent products C_i = alpha·op(A_i)·op(B_i) + beta·C_i, where
/// X_i = X + i·stride_x (a stride of 0 reuses one operand, e.g. the conv weights).
/// The C_i must not overlap.
void gemm_strided_batched(stream& s, transpose ta, transpose tb, int m, int n, int k, float alpha, const float* a,
                          int lda, std::int64_t stride_a, const float* b, int ldb, std::int64_t stride_b, float beta,
                          float* c, int ldc, std::int64_t stride_c, int batch);

}  // namespace nerve::gpu

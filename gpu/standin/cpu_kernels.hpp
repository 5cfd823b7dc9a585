#pragma once
/// \file
/// Plain-loop twins of every GPU kernel and of gemm: what the stand-in backend
/// runs on its stream workers, and the reference the GPU tests compare against.
/// Single-threaded, deterministic; gemm and the reductions accumulate in double.

#include "gpu/blas.hpp"
#include "gpu/kernels.hpp"

#include <cstddef>
#include <cstdint>

namespace nerve::gpu::cpu {

void gemm(transpose ta, transpose tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
          int ldb, float beta, float* c, int ldc);
void activation_forward(activation f, const float* x, float* y, std::size_t n, float alpha);
void activation_backward(activation f, const float* x, const float* y, const float* dy, float* dx, std::size_t n,
                         float alpha);
void bias_add(const float* x, const float* bias, float* y, std::size_t rows, std::size_t cols, bool relu);
void column_sums(const float* x, std::size_t rows, std::size_t cols, float* out, float beta);
void softmax_xent_forward(const float* logits, const std::int32_t* labels, std::size_t rows, std::size_t cols,
                          float* probs, float* loss, std::int32_t* correct);
void softmax_xent_backward(const float* probs, const std::int32_t* labels, std::size_t rows, std::size_t cols,
                           float scale, float* dlogits);
void axpy(std::size_t n, float alpha, const float* x, float* y);
void scale(std::size_t n, float alpha, float* x);
void fill(std::size_t n, float value, float* x);
void sgd_update(float* w, const float* g, float* velocity, std::size_t n, const sgd_params& p);
void adam_update(float* w, const float* g, float* m, float* v, std::size_t n, const adam_params& p);
void im2col(const float* x, const window_geometry& g, float* col);
void col2im(const float* col, const window_geometry& g, float* dx);
void max_pool_forward(const float* x, const window_geometry& g, float* y, std::int32_t* argmax);
void max_pool_backward(const float* dy, const std::int32_t* argmax, const window_geometry& g, float* dx);
void avg_pool_forward(const float* x, const window_geometry& g, float* y);
void avg_pool_backward(const float* dy, const window_geometry& g, float* dx);

}  // namespace nerve::gpu::cpu

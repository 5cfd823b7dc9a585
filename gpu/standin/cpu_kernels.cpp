#include "gpu/standin/cpu_kernels.hpp"

#include "gpu/kernels/ops.hpp"

#include <cmath>

namespace nerve::gpu::cpu {

void gemm(transpose ta, transpose tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
          int ldb, float beta, float* c, int ldc) {
  const bool at = ta == transpose::yes, bt = tb == transpose::yes;
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double acc = 0.0;
      for (int p = 0; p < k; ++p) {
        const float av = at ? a[std::size_t(p) * lda + i] : a[std::size_t(i) * lda + p];
        const float bv = bt ? b[std::size_t(j) * ldb + p] : b[std::size_t(p) * ldb + j];
        acc += double(av) * double(bv);
      }
      float& cv = c[std::size_t(i) * ldc + j];
      // beta == 0 ignores C (it may hold garbage, as in BLAS).
      cv = beta == 0.0f ? float(alpha * acc) : float(alpha * acc + double(beta) * cv);
    }
}

namespace {
/// The stand-in's launch: every element in order.
template <class Op>
void each(std::size_t n, const Op& op) {
  for (std::size_t i = 0; i < n; ++i) op(i);
}
}  // namespace

void activation_forward(activation f, const float* x, float* y, std::size_t n, float alpha) {
  ops::with_activation(f, [&](auto k) { each(n, ops::activation_forward<k>{x, y, alpha}); });
}

void activation_backward(activation f, const float* x, const float* y, const float* dy, float* dx, std::size_t n,
                         float alpha) {
  ops::with_activation(f, [&](auto k) { each(n, ops::activation_backward<k>{x, y, dy, dx, alpha}); });
}

void bias_add(const float* x, const float* bias, float* y, std::size_t rows, std::size_t cols, bool relu) {
  each(rows * cols, ops::bias_add{x, bias, y, cols, relu});
}

void column_sums(const float* x, std::size_t rows, std::size_t cols, float* out, float beta) {
  for (std::size_t c = 0; c < cols; ++c) {
    double acc = 0.0;
    for (std::size_t r = 0; r < rows; ++r) acc += x[r * cols + c];
    out[c] = beta == 0.0f ? float(acc) : float(acc + double(beta) * out[c]);
  }
}

void softmax_xent_forward(const float* logits, const std::int32_t* labels, std::size_t rows, std::size_t cols,
                          float* probs, float* loss, std::int32_t* correct) {
  std::int32_t right = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    const float* z = logits + r * cols;
    std::size_t arg = 0;
    for (std::size_t c = 1; c < cols; ++c)
      if (z[c] > z[arg]) arg = c;
    const double mx = z[arg];
    double sum = 0.0;
    for (std::size_t c = 0; c < cols; ++c) sum += std::exp(double(z[c]) - mx);
    for (std::size_t c = 0; c < cols; ++c) probs[r * cols + c] = float(std::exp(double(z[c]) - mx) / sum);
    const auto label = std::size_t(labels[r]);
    loss[r] = float(mx + std::log(sum) - double(z[label]));
    right += arg == label ? 1 : 0;
  }
  *correct = right;
}

void softmax_xent_backward(const float* probs, const std::int32_t* labels, std::size_t rows, std::size_t cols,
                           float scale, float* dlogits) {
  each(rows * cols, ops::softmax_xent_backward{probs, labels, cols, scale, dlogits});
}

void axpy(std::size_t n, float alpha, const float* x, float* y) { each(n, ops::axpy{alpha, x, y}); }
void scale(std::size_t n, float alpha, float* x) { each(n, ops::scale{alpha, x}); }
void fill(std::size_t n, float value, float* x) { each(n, ops::fill{value, x}); }

void sgd_update(float* w, const float* g, float* velocity, std::size_t n, const sgd_params& p) {
  each(n, ops::sgd_update{w, g, velocity, p});
}

void adam_update(float* w, const float* g, float* m, float* v, std::size_t n, const adam_params& p) {
  const float c1 = ops::bias_correction(p.beta1, p.step), c2 = ops::bias_correction(p.beta2, p.step);
  each(n, ops::adam_update{w, g, m, v, p, c1, c2});
}

void im2col(const float* x, const window_geometry& g, float* col) {
  each(ops::patch_elements(g), ops::im2col{x, g, col});
}
void col2im(const float* col, const window_geometry& g, float* dx) { each(ops::inputs(g), ops::col2im{col, g, dx}); }
void max_pool_forward(const float* x, const window_geometry& g, float* y, std::int32_t* argmax) {
  each(ops::outputs(g), ops::pool_forward<true>{x, g, y, argmax});
}
void max_pool_backward(const float* dy, const std::int32_t* argmax, const window_geometry& g, float* dx) {
  each(ops::inputs(g), ops::pool_backward<true>{dy, argmax, g, dx});
}
void avg_pool_forward(const float* x, const window_geometry& g, float* y) {
  each(ops::outputs(g), ops::pool_forward<false>{x, g, y, nullptr});
}
void avg_pool_backward(const float* dy, const window_geometry& g, float* dx) {
  each(ops::inputs(g), ops::pool_backward<false>{dy, nullptr, g, dx});
}

}  // namespace nerve::gpu::cpu

#include "gpu/standin/cpu_kernels.hpp"

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

void column_sums(const float* x, std::size_t rows, std::size_t cols, float* out, float beta) {
  for (std::size_t c = 0; c < cols; ++c) {
    double acc = 0.0;
    for (std::size_t r = 0; r < rows; ++r) acc += x[r * cols + c];
    out[c] = beta == 0.0f ? float(acc) : float(acc + double(beta) * out[c]);
  }
}

void softmax_xent_forward(const float* logits, const std::int32_t* labels, std::size_t rows, std::size_t cols,
                          float* probs, float* loss, float* correct) {
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
  *correct = float(right);
}

}  // namespace nerve::gpu::cpu

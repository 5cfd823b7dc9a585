#include "gpu/blas.hpp"

#include "gpu/detail/device_core.hpp"
#include "gpu/status.hpp"
#include "gpu/stream.hpp"

namespace nerve::gpu {
namespace {

void check_gemm(transpose ta, transpose tb, int m, int n, int k, int lda, int ldb, int ldc, int batch) {
  const int a_cols = ta == transpose::no ? k : m;  // A stored row-major: m×k, or k×m when transposed
  const int b_cols = tb == transpose::no ? n : k;
  if (m < 0 || n < 0 || k < 0 || batch < 0 || lda < std::max(1, a_cols) || ldb < std::max(1, b_cols) ||
      ldc < std::max(1, n))
    throw error(errc::invalid_argument,
                "gemm: m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
                    " lda=" + std::to_string(lda) + " ldb=" + std::to_string(ldb) + " ldc=" + std::to_string(ldc));
}

}  // namespace

void gemm(stream& s, transpose ta, transpose tb, int m, int n, int k, float alpha, const float* a, int lda,
          const float* b, int ldb, float beta, float* c, int ldc) {
  gemm_strided_batched(s, ta, tb, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc, 0, 1);
}

void gemm(stream& s, transpose ta, transpose tb, int m, int n, int k, float alpha, const float* a, const float* b,
          float beta, float* c) {
  gemm(s, ta, tb, m, n, k, alpha, a, ta == transpose::no ? k : m, b, tb == transpose::no ? n : k, beta, c, n);
}

void gemm_strided_batched(stream& s, transpose ta, transpose tb, int m, int n, int k, float alpha, const float* a,
                          int lda, std::int64_t stride_a, const float* b, int ldb, std::int64_t stride_b, float beta,
                          float* c, int ldc, std::int64_t stride_c, int batch) {
  check_gemm(ta, tb, m, n, k, lda, ldb, ldc, batch);
  s.impl().core->impl->gemm_strided_batched(s.impl(), ta, tb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b,
                                            beta, c, ldc, stride_c, batch);
}

}  // namespace nerve::gpu

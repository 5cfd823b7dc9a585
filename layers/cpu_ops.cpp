// The CPU's op set: host memory in tensors, Eigen's array expressions, the product
// engine of gemm.hpp. The pointwise formulas are those of the CPU layers
// (layers/activation.hpp).
#include <Eigen/Core>
#include <algorithm>
#include <cmath>

#include "layers/ops.hpp"

namespace nerve::layers {

namespace {

template <class S>
using vec_map = Eigen::Map<Eigen::Array<S, Eigen::Dynamic, 1>>;
template <class S>
using const_vec_map = Eigen::Map<const Eigen::Array<S, Eigen::Dynamic, 1>>;

template <class S>
class cpu_ops final : public basic_op_set<S> {
 public:
  std::string_view name() const noexcept override { return "cpu"; }
  // Memory is a tensor's (Eigen's allocation, aligned to its widest packet): Eigen's
  // pointwise loops peel unaligned leading elements into a scalar path whose exp and
  // tanh round differently, so equal alignment is what makes equal inputs give equal bits.
  basic_array<S> alloc(std::vector<std::int64_t> dims) override {
    basic_array<S> a;
    a.dims = std::move(dims);
    const std::int64_t rows = a.rows();
    auto mem = std::make_shared<basic_tensor<S>>(rows, shape({rows ? a.size() / rows : 0}));
    a.data = mem->data();
    a.owner = std::move(mem);
    return a;
  }
  void gemm(trans ta, trans tb, std::int64_t m, std::int64_t n, std::int64_t k, S alpha, const S* a, std::int64_t lda,
            const S* b, std::int64_t ldb, S beta, S* c, std::int64_t ldc) override {
    layers::gemm<S>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  void unary(unary_fn f, const S* x, S* y, std::int64_t n, S alpha) override {
    const_vec_map<S> X(x, n);
    vec_map<S> Y(y, n);
    switch (f) {
      case unary_fn::relu: Y = X.max(S(0)); break;
      case unary_fn::leaky_relu: Y = (X > S(0)).select(X, alpha * X); break;
      case unary_fn::sigmoid: Y = S(1) / (S(1) + (-X).exp()); break;
      case unary_fn::tanh: Y = X.tanh(); break;
      case unary_fn::gelu:
        for (std::int64_t i = 0; i < n; ++i) y[i] = S(0.5) * x[i] * std::erfc(-x[i] * S(0.70710678118654752440));
        break;
    }
  }
  void unary_grad(unary_fn f, const S* x, const S* y, const S* dy, S* dx, std::int64_t n, S alpha) override {
    const_vec_map<S> G(dy, n);
    vec_map<S> DX(dx, n);
    switch (f) {
      case unary_fn::relu: DX = (const_vec_map<S>(x, n) > S(0)).select(G, S(0)); break;
      case unary_fn::leaky_relu: DX = (const_vec_map<S>(x, n) > S(0)).select(G, alpha * G); break;
      case unary_fn::sigmoid: {
        const_vec_map<S> Y(y, n);
        DX = G * Y * (S(1) - Y);
        break;
      }
      case unary_fn::tanh: {
        const_vec_map<S> Y(y, n);
        DX = G * (S(1) - Y * Y);
        break;
      }
      case unary_fn::gelu:
        for (std::int64_t i = 0; i < n; ++i) {
          const S v = x[i];
          const S cdf = S(0.5) * std::erfc(-v * S(0.70710678118654752440));
          const S pdf = S(0.39894228040143267794) * std::exp(S(-0.5) * v * v);
          dx[i] = dy[i] * (cdf + v * pdf);
        }
        break;
    }
  }
  void binary(binary_fn f, const S* a, const S* b, S* y, std::int64_t n) override {
    const_vec_map<S> A(a, n), B(b, n);
    vec_map<S> Y(y, n);
    switch (f) {
      case binary_fn::add: Y = A + B; break;
      case binary_fn::sub: Y = A - B; break;
      case binary_fn::mul: Y = A * B; break;
    }
  }
  void broadcast(binary_fn f, const S* x, const S* v, S* y, std::int64_t n, std::int64_t period) override {
    for (std::int64_t r = 0; r < n; r += period) {
      const_vec_map<S> X(x + r, period), V(v, period);
      vec_map<S> Y(y + r, period);
      switch (f) {
        case binary_fn::add: Y = X + V; break;
        case binary_fn::sub: Y = X - V; break;
        case binary_fn::mul: Y = X * V; break;
      }
    }
  }
  void column_sums(const S* x, std::int64_t rows, std::int64_t cols, S* out, S beta) override {
    vec_map<S> O(out, cols);
    if (beta == S(0))
      O.setZero();
    else if (beta != S(1))
      O *= beta;
    for (std::int64_t r = 0; r < rows; ++r) O += const_vec_map<S>(x + r * cols, cols);
  }
  void axpy(std::int64_t n, S alpha, const S* x, S* y) override {
    vec_map<S>(y, n) += alpha * const_vec_map<S>(x, n);
  }
  void scale(std::int64_t n, S alpha, S* x) override { vec_map<S>(x, n) *= alpha; }
  void fill(std::int64_t n, S value, S* x) override { vec_map<S>(x, n).setConstant(value); }
  void copy(std::int64_t n, const S* x, S* y) override { std::copy(x, x + n, y); }
};

}  // namespace

template <class S>
basic_op_set<S>& cpu_op_set() {
  static cpu_ops<S> set;  // stateless: one per scalar type serves every loop
  return set;
}

template basic_op_set<float>& cpu_op_set<float>();
template basic_op_set<double>& cpu_op_set<double>();

}  // namespace nerve::layers

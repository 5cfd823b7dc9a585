// The CPU's op set: host memory in tensors, Eigen's array expressions, the product
// engine of gemm.hpp. The pointwise formulas are those of the CPU layers
// (layers/activation.hpp). Convolution runs image by image (im2col, one product):
// one image's patch matrix stays in cache, where the whole batch's would not.
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>

#include "layers/ops.hpp"

namespace nerve::layers {

namespace {

template <class S>
using vec_map = Eigen::Map<Eigen::Array<S, Eigen::Dynamic, 1>>;
template <class S>
using const_vec_map = Eigen::Map<const Eigen::Array<S, Eigen::Dynamic, 1>>;

/// Writes the patch matrix of one image `x` (`(C·kh·kw) × (OH·OW)`, zero padding) into `col`.
template <class S>
void im2col(const window_geometry& g, const S* x, S* col) {
  const std::int64_t oh = g.out_h(), ow = g.out_w();
  for (std::int64_t c = 0; c < g.channels; ++c)
    for (std::int64_t i = 0; i < g.kernel_h; ++i)
      for (std::int64_t j = 0; j < g.kernel_w; ++j) {
        S* out = col + ((c * g.kernel_h + i) * g.kernel_w + j) * oh * ow;
        for (std::int64_t y = 0; y < oh; ++y) {
          const std::int64_t iy = y * g.stride_h - g.pad_h + i;
          S* o = out + y * ow;
          if (iy < 0 || iy >= g.height) {
            std::fill(o, o + ow, S(0));
            continue;
          }
          const S* row = x + (c * g.height + iy) * g.width;
          for (std::int64_t x0 = 0; x0 < ow; ++x0) {
            const std::int64_t ix = x0 * g.stride_w - g.pad_w + j;
            o[x0] = (ix >= 0 && ix < g.width) ? row[ix] : S(0);
          }
        }
      }
}

/// Adds the patch matrix `col` back into the image `dx` (which the caller zeroed).
template <class S>
void col2im(const window_geometry& g, const S* col, S* dx) {
  const std::int64_t oh = g.out_h(), ow = g.out_w();
  for (std::int64_t c = 0; c < g.channels; ++c)
    for (std::int64_t i = 0; i < g.kernel_h; ++i)
      for (std::int64_t j = 0; j < g.kernel_w; ++j) {
        const S* in = col + ((c * g.kernel_h + i) * g.kernel_w + j) * oh * ow;
        for (std::int64_t y = 0; y < oh; ++y) {
          const std::int64_t iy = y * g.stride_h - g.pad_h + i;
          if (iy < 0 || iy >= g.height) continue;
          S* row = dx + (c * g.height + iy) * g.width;
          const S* src = in + y * ow;
          for (std::int64_t x0 = 0; x0 < ow; ++x0) {
            const std::int64_t ix = x0 * g.stride_w - g.pad_w + j;
            if (ix >= 0 && ix < g.width) row[ix] += src[x0];
          }
        }
      }
}

/// The index in its plane of the maximum of window (oy, ox) of plane `x`: the first
/// maximum, or the last NaN (PyTorch's rule, NaN wins); the padding never wins.
template <class S>
std::int64_t window_max(const window_geometry& g, const S* x, std::int64_t oy, std::int64_t ox) {
  const std::int64_t y0 = oy * g.stride_h - g.pad_h, x0 = ox * g.stride_w - g.pad_w;
  S best = -std::numeric_limits<S>::infinity();
  std::int64_t best_i = -1;
  for (std::int64_t i = std::max<std::int64_t>(y0, 0); i < std::min(y0 + g.kernel_h, g.height); ++i)
    for (std::int64_t j = std::max<std::int64_t>(x0, 0); j < std::min(x0 + g.kernel_w, g.width); ++j) {
      const S v = x[i * g.width + j];
      if (best_i < 0 || v > best || std::isnan(v)) {
        best = v;
        best_i = i * g.width + j;
      }
    }
  return best_i;
}

/// An average window clipped to the image, and its divisor: the window clipped to the
/// padded image (PyTorch's, padding counted).
struct average_window {
  std::int64_t y0, y1, x0, x1, divisor;
};
inline average_window window_average(const window_geometry& g, std::int64_t oy, std::int64_t ox) {
  const std::int64_t y0 = oy * g.stride_h - g.pad_h, x0 = ox * g.stride_w - g.pad_w;
  const std::int64_t y1 = std::min(y0 + g.kernel_h, g.height + g.pad_h), x1 = std::min(x0 + g.kernel_w, g.width + g.pad_w);
  return {std::max<std::int64_t>(y0, 0), std::min(y1, g.height), std::max<std::int64_t>(x0, 0), std::min(x1, g.width),
          (y1 - y0) * (x1 - x0)};
}

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
  void gemm_bias(trans ta, trans tb, std::int64_t m, std::int64_t n, std::int64_t k, const S* a, std::int64_t lda,
                 const S* b, std::int64_t ldb, const S* bias, S* c, std::int64_t ldc) override {
    // C starts as the bias and the product accumulates onto it: one pass over C.
    for (std::int64_t r = 0; r < m; ++r) std::copy(bias, bias + n, c + r * ldc);
    layers::gemm<S>(ta, tb, m, n, k, S(1), a, lda, b, ldb, S(1), c, ldc);
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
  void copy2d(std::int64_t rows, std::int64_t cols, const S* x, std::int64_t ldx, S* y, std::int64_t ldy) override {
    for (std::int64_t r = 0; r < rows; ++r) std::copy(x + r * ldx, x + r * ldx + cols, y + r * ldy);
  }
  void dropout_mask(std::uint64_t key, double p, S scale, S* mask, std::int64_t n) override {
    for (std::int64_t i = 0; i < n; ++i) mask[i] = counter_uniform(key, std::uint64_t(i)) >= p ? scale : S(0);
  }
  void softmax_xent(const S* logits, const std::int32_t* labels, std::int64_t n, std::int64_t k, S* probs, S* loss,
                    S* correct) override {
    std::int64_t right = 0;
    for (std::int64_t s = 0; s < n; ++s) {
      const std::int32_t label = labels[s];
      const S* z = logits + s * k;
      S* p = probs + s * k;
      S zmax = z[0];
      std::int64_t argmax = 0;
      for (std::int64_t j = 1; j < k; ++j)
        if (z[j] > zmax) zmax = z[j], argmax = j;
      S sum = 0;
      for (std::int64_t j = 0; j < k; ++j) sum += (p[j] = std::exp(z[j] - zmax));
      const S inv = S(1) / sum;
      for (std::int64_t j = 0; j < k; ++j) p[j] *= inv;
      loss[s] = S(double(std::log(sum)) + double(zmax) - double(z[label]));
      right += argmax == label;
    }
    correct[0] = S(right);
  }
  void softmax_xent_grad(const S* probs, const std::int32_t* labels, std::int64_t n, std::int64_t k, S scale,
                         S* g) override {
    for (std::int64_t s = 0; s < n; ++s)
      for (std::int64_t j = 0; j < k; ++j) g[s * k + j] = (probs[s * k + j] - (j == labels[s] ? S(1) : S(0))) * scale;
  }
  // The updates are Eigen expressions over the whole parameter: one pass each, and no
  // temporary where PyTorch's arithmetic allows it.
  void sgd_update(const sgd_update_args& a, S* wp, const S* gp, S* bp, std::int64_t n) override {
    vec_map<S> w(wp, n);
    const_vec_map<S> g(gp, n);
    const S lr = S(-a.lr), wd = S(a.weight_decay), mu = S(a.momentum);
    if (a.momentum == 0) {
      if (a.weight_decay == 0)
        w += lr * g;
      else
        w += lr * (g + wd * w);
      return;
    }
    vec_map<S> b(bp, n);
    if (a.first) {  // b = d_p, a clone (torch.clone)
      if (a.weight_decay == 0)
        b = g;
      else
        b = g + wd * w;
    } else if (a.weight_decay == 0) {
      b = b * mu + S(1 - a.dampening) * g;
    } else {
      b = b * mu + S(1 - a.dampening) * (g + wd * w);
    }
    if (!a.nesterov)
      w += lr * b;
    else if (a.weight_decay == 0)
      w += lr * (g + mu * b);
    else
      w += lr * ((g + wd * w) + mu * b);
  }
  void adam_update(const adam_update_args& a, S* wp, const S* gp, S* mp, S* vp, std::int64_t n) override {
    vec_map<S> w(wp, n), m(mp, n), v(vp, n);
    const_vec_map<S> g(gp, n);
    if (a.decoupled) w *= S(1 - a.lr * a.weight_decay);
    const S b1 = S(a.beta1), b2 = S(a.beta2);
    if (!a.decoupled && a.weight_decay != 0) {
      const auto gd = (g + S(a.weight_decay) * w).eval();
      m = m * b1 + S(1 - a.beta1) * gd;
      v = v * b2 + S(1 - a.beta2) * gd * gd;
    } else {
      m = m * b1 + S(1 - a.beta1) * g;
      v = v * b2 + S(1 - a.beta2) * g * g;
    }
    const double bc1 = 1 - std::pow(a.beta1, double(a.t));
    const double bc2 = 1 - std::pow(a.beta2, double(a.t));
    const S step_size = S(a.lr / bc1);
    const S bc2_sqrt = S(std::sqrt(bc2));
    w += S(-1) * step_size * (m / (v.sqrt() / bc2_sqrt + S(a.eps)));
  }
  void read(const S* x, S* host, std::int64_t n) override { std::copy(x, x + n, host); }
  void write(const S* host, S* x, std::int64_t n) override { std::copy(host, host + n, x); }

  // Channel c of element (o, c, i) of a [outer, channels, inner] view is at (o·C + c)·inner + i:
  // each sum walks o then i, the order gpu/kernels/ops.hpp's kernels sum in.
  void normalize(const norm_geometry& g, const S* x, bool batch, S* mean, S* var, double eps, S* xhat,
                 S* rstd) override {
    const std::int64_t C = g.channels, in = g.inner;
    for (std::int64_t c = 0; c < C; ++c) {
      double v;
      if (batch) {
        double sum = 0;
        for (std::int64_t o = 0; o < g.outer; ++o)
          for (const S* p = x + (o * C + c) * in; p != x + (o * C + c + 1) * in; ++p) sum += double(*p);
        mean[c] = S(sum / double(g.count()));
        double sq = 0;
        for (std::int64_t o = 0; o < g.outer; ++o)
          for (const S* p = x + (o * C + c) * in; p != x + (o * C + c + 1) * in; ++p) {
            const double d = double(*p) - double(mean[c]);
            sq += d * d;
          }
        v = sq / double(g.count());
        var[c] = S(v);
      } else {
        v = double(var[c]);
      }
      rstd[c] = S(1.0 / std::sqrt(v + eps));
      const S m = mean[c], r = rstd[c];
      for (std::int64_t o = 0; o < g.outer; ++o) {
        const std::int64_t at = (o * C + c) * in;
        for (std::int64_t i = 0; i < in; ++i) xhat[at + i] = (x[at + i] - m) * r;
      }
    }
  }
  void normalize_grad(const norm_geometry& g, const S* xhat, const S* rstd, const S* dxhat, S* dx) override {
    const std::int64_t C = g.channels, in = g.inner;
    for (std::int64_t c = 0; c < C; ++c) {
      double sg = 0, sgx = 0;
      for (std::int64_t o = 0; o < g.outer; ++o)
        for (std::int64_t i = (o * C + c) * in, end = i + in; i < end; ++i) {
          sg += double(dxhat[i]);
          sgx += double(dxhat[i]) * double(xhat[i]);
        }
      const S mean_g = S(sg / double(g.count())), mean_gx = S(sgx / double(g.count())), r = rstd[c];
      for (std::int64_t o = 0; o < g.outer; ++o)
        for (std::int64_t i = (o * C + c) * in, end = i + in; i < end; ++i)
          dx[i] = r * (dxhat[i] - mean_g - xhat[i] * mean_gx);
    }
  }
  void channel_affine(const norm_geometry& g, const S* x, const S* scale, const S* shift, S* y) override {
    const std::int64_t C = g.channels, in = g.inner;
    if (in == 1) {  // a per-feature map over rows (LayerNorm's): Eigen over each row
      const_vec_map<S> A(scale, C);
      for (std::int64_t o = 0; o < g.outer; ++o) {
        vec_map<S> Y(y + o * C, C);
        if (shift)
          Y = const_vec_map<S>(x + o * C, C) * A + const_vec_map<S>(shift, C);
        else
          Y = const_vec_map<S>(x + o * C, C) * A;
      }
      return;
    }
    for (std::int64_t o = 0; o < g.outer; ++o)
      for (std::int64_t c = 0; c < C; ++c) {
        const std::int64_t at = (o * C + c) * in;
        const S a = scale[c];
        if (shift)
          vec_map<S>(y + at, in) = const_vec_map<S>(x + at, in) * a + shift[c];
        else
          vec_map<S>(y + at, in) = const_vec_map<S>(x + at, in) * a;
      }
  }
  void channel_sums(const norm_geometry& g, const S* x, const S* z, S* out) override {
    const std::int64_t C = g.channels, in = g.inner;
    for (std::int64_t c = 0; c < C; ++c) {
      double acc = 0;
      for (std::int64_t o = 0; o < g.outer; ++o)
        for (std::int64_t i = (o * C + c) * in, end = i + in; i < end; ++i)
          acc += z ? double(x[i]) * double(z[i]) : double(x[i]);
      out[c] += S(acc);
    }
  }

  void conv2d(const window_geometry& g, std::int64_t oc, const S* x, const S* w, const S* bias, S* y) override {
    const std::int64_t pr = g.patch_rows(), pc = g.patch_cols(), in = g.channels * g.height * g.width;
    Eigen::Matrix<S, Eigen::Dynamic, 1> col(pr * pc);
    for (std::int64_t s = 0; s < g.batch; ++s) {
      im2col(g, x + s * in, col.data());
      S* ys = y + s * oc * pc;
      if (bias)
        for (std::int64_t c = 0; c < oc; ++c) std::fill(ys + c * pc, ys + (c + 1) * pc, bias[c]);
      layers::gemm<S>(trans::no, trans::no, oc, pc, pr, S(1), w, pr, col.data(), pc, bias ? S(1) : S(0), ys, pc);
    }
  }
  void conv2d_grad_input(const window_geometry& g, std::int64_t oc, const S* w, const S* dy, S* dx) override {
    const std::int64_t pr = g.patch_rows(), pc = g.patch_cols(), in = g.channels * g.height * g.width;
    Eigen::Matrix<S, Eigen::Dynamic, 1> col(pr * pc);
    std::fill(dx, dx + g.batch * in, S(0));
    for (std::int64_t s = 0; s < g.batch; ++s) {
      layers::gemm<S>(trans::yes, trans::no, pr, pc, oc, S(1), w, pr, dy + s * oc * pc, pc, S(0), col.data(), pc);
      col2im(g, col.data(), dx + s * in);
    }
  }
  void conv2d_grad_weight(const window_geometry& g, std::int64_t oc, const S* x, const S* dy, S* dw,
                          S* dbias) override {
    const std::int64_t pr = g.patch_rows(), pc = g.patch_cols(), in = g.channels * g.height * g.width;
    Eigen::Matrix<S, Eigen::Dynamic, 1> col(pr * pc);
    for (std::int64_t s = 0; s < g.batch; ++s) {
      im2col(g, x + s * in, col.data());  // again: the patches are kh·kw times the image
      const S* d = dy + s * oc * pc;
      layers::gemm<S>(trans::no, trans::yes, oc, pr, pc, S(1), d, pc, col.data(), pc, S(1), dw, pr);
      if (dbias)
        for (std::int64_t c = 0; c < oc; ++c) {
          S acc = 0;
          for (std::int64_t i = 0; i < pc; ++i) acc += d[c * pc + i];
          dbias[c] += acc;
        }
    }
  }
  void pool2d(pool_fn f, const window_geometry& g, const S* x, S* y) override {
    const std::int64_t plane = g.height * g.width, oh = g.out_h(), ow = g.out_w();
    for (std::int64_t p = 0; p < g.batch * g.channels; ++p) {
      const S* xp = x + p * plane;
      for (std::int64_t oy = 0; oy < oh; ++oy)
        for (std::int64_t ox = 0; ox < ow; ++ox) {
          if (f == pool_fn::max) {
            *y++ = xp[window_max(g, xp, oy, ox)];
            continue;
          }
          const auto win = window_average(g, oy, ox);
          S acc = 0;
          for (std::int64_t i = win.y0; i < win.y1; ++i)
            for (std::int64_t j = win.x0; j < win.x1; ++j) acc += xp[i * g.width + j];
          *y++ = acc / S(win.divisor);
        }
    }
  }
  void pool2d_grad(pool_fn f, const window_geometry& g, const S* x, const S* dy, S* dx) override {
    const std::int64_t plane = g.height * g.width, oh = g.out_h(), ow = g.out_w();
    std::fill(dx, dx + g.batch * g.channels * plane, S(0));
    for (std::int64_t p = 0; p < g.batch * g.channels; ++p) {
      S* dxp = dx + p * plane;
      for (std::int64_t oy = 0; oy < oh; ++oy)
        for (std::int64_t ox = 0; ox < ow; ++ox) {
          const S d = *dy++;
          if (f == pool_fn::max) {
            dxp[window_max(g, x + p * plane, oy, ox)] += d;
            continue;
          }
          const auto win = window_average(g, oy, ox);
          const S v = d / S(win.divisor);
          for (std::int64_t i = win.y0; i < win.y1; ++i)
            for (std::int64_t j = win.x0; j < win.x1; ++j) dxp[i * g.width + j] += v;
        }
    }
  }
  void gemm_batched(trans ta, trans tb, std::int64_t m, std::int64_t n, std::int64_t k, S alpha, const S* a,
                    std::int64_t lda, std::int64_t stride_a, const S* b, std::int64_t ldb,
                    std::int64_t stride_b, S beta, S* c, std::int64_t ldc, std::int64_t stride_c,
                    std::int64_t batch) override {
    for (std::int64_t i = 0; i < batch; ++i)
      layers::gemm<S>(ta, tb, m, n, k, alpha, a + i * stride_a, lda, b + i * stride_b, ldb, beta, c + i * stride_c,
                      ldc);
  }
  // The row softmax and its derivative follow gpu/kernels/ops.hpp's formulas: the same
  // float exponentials, the same double sums in column order.
  void softmax_rows(const S* x, S* y, std::int64_t rows, std::int64_t cols, const causal_mask& mask) override {
    for (std::int64_t r = 0; r < rows; ++r) {
      const S* xr = x + r * cols;
      S* yr = y + r * cols;
      const std::int64_t last = mask.last_visible(r, cols);
      if (last < 0) {
        std::fill(yr, yr + cols, S(0));
        continue;
      }
      S top = xr[0];
      for (std::int64_t c = 1; c <= last; ++c) top = std::max(top, xr[c]);
      double sum = 0;
      for (std::int64_t c = 0; c <= last; ++c) sum += double(yr[c] = std::exp(xr[c] - top));
      for (std::int64_t c = 0; c <= last; ++c) yr[c] = S(double(yr[c]) / sum);
      std::fill(yr + last + 1, yr + cols, S(0));
    }
  }
  void softmax_rows_grad(const S* y, const S* dy, S* dx, std::int64_t rows, std::int64_t cols) override {
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t at = r * cols;
      double dot = 0;
      for (std::int64_t c = 0; c < cols; ++c) dot += double(dy[at + c]) * double(y[at + c]);
      const S d = S(dot);
      for (std::int64_t c = 0; c < cols; ++c) dx[at + c] = y[at + c] * (dy[at + c] - d);
    }
  }
  // Each head's row of D values is contiguous on both sides: one copy per (part, b, t, h).
  void split_heads(const head_geometry& g, const S* x, S* y) override {
    const std::int64_t D = g.head_dim, H = g.heads, T = g.tokens, P = g.parts;
    for (std::int64_t b = 0; b < g.batch; ++b)
      for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t p = 0; p < P; ++p)
          for (std::int64_t h = 0; h < H; ++h) {
            const S* from = x + (((b * T + t) * P + p) * H + h) * D;
            std::copy(from, from + D, y + (((p * g.batch + b) * H + h) * T + t) * D);
          }
  }
  void merge_heads(const head_geometry& g, const S* y, S* x) override {
    const std::int64_t D = g.head_dim, H = g.heads, T = g.tokens, P = g.parts;
    for (std::int64_t b = 0; b < g.batch; ++b)
      for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t p = 0; p < P; ++p)
          for (std::int64_t h = 0; h < H; ++h) {
            const S* from = y + (((p * g.batch + b) * H + h) * T + t) * D;
            std::copy(from, from + D, x + (((b * T + t) * P + p) * H + h) * D);
          }
  }

  void gather_rows(const S* table, std::int64_t rows, std::int64_t cols, const S* ids, std::int64_t n,
                   S* y) override {
    for (std::int64_t t = 0; t < n; ++t, y += cols) {
      const S id = ids[t];
      if (is_row(id, rows))
        std::copy(table + std::int64_t(id) * cols, table + (std::int64_t(id) + 1) * cols, y);
      else
        std::fill(y, y + cols, S(0));
    }
  }
  void scatter_add_rows(const S* dy, const S* ids, std::int64_t n, std::int64_t rows, std::int64_t cols,
                        S* table) override {
    for (std::int64_t t = 0; t < n; ++t)
      if (is_row(ids[t], rows)) vec_map<S>(table + std::int64_t(ids[t]) * cols, cols) += const_vec_map<S>(dy + t * cols, cols);
  }
  bad_id find_bad_id(const S* ids, std::int64_t n, std::int64_t rows) override {
    for (std::int64_t t = 0; t < n; ++t)
      if (!is_row(ids[t], rows)) return {t, double(ids[t])};
    return {};
  }
  void patchify(const window_geometry& g, const S* x, S* y) override {
    each_patch_value(g, [&](std::int64_t image, std::int64_t patch) { y[patch] = x[image]; });
  }
  void unpatchify(const window_geometry& g, const S* y, S* x) override {
    each_patch_value(g, [&](std::int64_t image, std::int64_t patch) { x[image] = y[patch]; });
  }

 private:
  /// Whether `id` names a row of a table of `rows`: an integer in [0, rows) (NaN is not).
  static bool is_row(S id, std::int64_t rows) noexcept {
    return id >= S(0) && id < S(rows) && id == std::floor(id);
  }
  /// Calls `f(i, j)` for every pixel: `i` its index in the images, `j` in the patches.
  template <class F>
  static void each_patch_value(const window_geometry& g, F&& f) {
    const std::int64_t p = g.kernel_h, q = g.kernel_w, pw = g.width / q, per_patch = g.channels * p * q;
    const std::int64_t patches = (g.height / p) * pw;
    for (std::int64_t n = 0; n < g.batch; ++n)
      for (std::int64_t c = 0; c < g.channels; ++c)
        for (std::int64_t h = 0; h < g.height; ++h)
          for (std::int64_t w = 0; w < g.width; ++w) {
            const std::int64_t patch = (h / p) * pw + w / q, within = (c * p + h % p) * q + w % q;
            f(((n * g.channels + c) * g.height + h) * g.width + w, (n * patches + patch) * per_patch + within);
          }
  }
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

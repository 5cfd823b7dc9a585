#include "gpu/standin/cpu_kernels.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

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
constexpr float inv_sqrt2 = 0.70710678118654752440f;
constexpr float inv_sqrt2pi = 0.39894228040143267794f;
}  // namespace

void activation_forward(activation f, const float* x, float* y, std::size_t n, float alpha) {
  for (std::size_t i = 0; i < n; ++i) {
    const float v = x[i];
    switch (f) {
      case activation::relu: y[i] = v > 0.0f ? v : 0.0f; break;
      case activation::leaky_relu: y[i] = v > 0.0f ? v : alpha * v; break;
      case activation::sigmoid: y[i] = 1.0f / (1.0f + std::exp(-v)); break;
      case activation::tanh: y[i] = std::tanh(v); break;
      case activation::gelu: y[i] = 0.5f * v * std::erfc(-v * inv_sqrt2); break;
    }
  }
}

void activation_backward(activation f, const float* x, const float* y, const float* dy, float* dx, std::size_t n,
                         float alpha) {
  for (std::size_t i = 0; i < n; ++i) {
    const float g = dy[i];
    switch (f) {
      case activation::relu: dx[i] = x[i] > 0.0f ? g : 0.0f; break;
      case activation::leaky_relu: dx[i] = x[i] > 0.0f ? g : alpha * g; break;
      case activation::sigmoid: dx[i] = g * y[i] * (1.0f - y[i]); break;
      case activation::tanh: dx[i] = g * (1.0f - y[i] * y[i]); break;
      case activation::gelu: {
        const float v = x[i];
        const float cdf = 0.5f * std::erfc(-v * inv_sqrt2);
        const float pdf = inv_sqrt2pi * std::exp(-0.5f * v * v);
        dx[i] = g * (cdf + v * pdf);
        break;
      }
    }
  }
}

void bias_add(const float* x, const float* bias, float* y, std::size_t rows, std::size_t cols, bool relu) {
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c) {
      const float v = x[r * cols + c] + bias[c];
      y[r * cols + c] = relu && !(v > 0.0f) ? 0.0f : v;
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
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c) {
      const float onehot = std::size_t(labels[r]) == c ? 1.0f : 0.0f;
      dlogits[r * cols + c] = scale * (probs[r * cols + c] - onehot);
    }
}

void axpy(std::size_t n, float alpha, const float* x, float* y) {
  for (std::size_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}
void scale(std::size_t n, float alpha, float* x) {
  for (std::size_t i = 0; i < n; ++i) x[i] *= alpha;
}
void fill(std::size_t n, float value, float* x) { std::fill(x, x + n, value); }

void sgd_update(float* w, const float* g, float* velocity, std::size_t n, const sgd_params& p) {
  for (std::size_t i = 0; i < n; ++i) {
    float d = g[i] + p.weight_decay * w[i];
    if (p.momentum != 0.0f) {
      const float v = p.momentum * velocity[i] + d;
      velocity[i] = v;
      d = p.nesterov ? d + p.momentum * v : v;
    }
    w[i] -= p.lr * d;
  }
}

void adam_update(float* w, const float* g, float* m, float* v, std::size_t n, const adam_params& p) {
  const float c1 = 1.0f - float(std::pow(double(p.beta1), double(p.step)));
  const float c2 = 1.0f - float(std::pow(double(p.beta2), double(p.step)));
  for (std::size_t i = 0; i < n; ++i) {
    float wi = w[i];
    float gi = g[i];
    if (p.decoupled)
      wi *= 1.0f - p.lr * p.weight_decay;
    else
      gi += p.weight_decay * wi;
    const float mi = p.beta1 * m[i] + (1.0f - p.beta1) * gi;
    const float vi = p.beta2 * v[i] + (1.0f - p.beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    w[i] = wi - p.lr * (mi / c1) / (std::sqrt(vi / c2) + p.eps);
  }
}

void im2col(const float* x, const window_geometry& g, float* col) {
  const int oh = g.out_h(), ow = g.out_w();
  const std::size_t plane = std::size_t(g.height) * g.width;
  const std::size_t per_image = g.patch_rows() * g.patch_cols();
  for (int n = 0; n < g.batch; ++n)
    for (int c = 0; c < g.channels; ++c)
      for (int i = 0; i < g.kernel_h; ++i)
        for (int j = 0; j < g.kernel_w; ++j) {
          const std::size_t row = (std::size_t(c) * g.kernel_h + i) * g.kernel_w + j;
          float* out = col + n * per_image + row * g.patch_cols();
          const float* img = x + (std::size_t(n) * g.channels + c) * plane;
          for (int y = 0; y < oh; ++y)
            for (int xo = 0; xo < ow; ++xo) {
              const int h = y * g.stride_h - g.pad_h + i, w = xo * g.stride_w - g.pad_w + j;
              out[std::size_t(y) * ow + xo] =
                  (h >= 0 && h < g.height && w >= 0 && w < g.width) ? img[std::size_t(h) * g.width + w] : 0.0f;
            }
        }
}

void col2im(const float* col, const window_geometry& g, float* dx) {
  const int oh = g.out_h(), ow = g.out_w();
  const std::size_t plane = std::size_t(g.height) * g.width;
  const std::size_t per_image = g.patch_rows() * g.patch_cols();
  // Gather per input pixel in the same (i, j) order as the GPU kernel, so the sums agree.
  for (int n = 0; n < g.batch; ++n)
    for (int c = 0; c < g.channels; ++c)
      for (int h = 0; h < g.height; ++h)
        for (int w = 0; w < g.width; ++w) {
          float acc = 0.0f;
          for (int i = 0; i < g.kernel_h; ++i) {
            const int ys = h + g.pad_h - i;
            if (ys < 0 || ys % g.stride_h) continue;
            const int y = ys / g.stride_h;
            if (y >= oh) continue;
            for (int j = 0; j < g.kernel_w; ++j) {
              const int xs = w + g.pad_w - j;
              if (xs < 0 || xs % g.stride_w) continue;
              const int xo = xs / g.stride_w;
              if (xo >= ow) continue;
              const std::size_t row = (std::size_t(c) * g.kernel_h + i) * g.kernel_w + j;
              acc += col[n * per_image + row * g.patch_cols() + std::size_t(y) * ow + xo];
            }
          }
          dx[(std::size_t(n) * g.channels + c) * plane + std::size_t(h) * g.width + w] = acc;
        }
}

void max_pool_forward(const float* x, const window_geometry& g, float* y, std::int32_t* argmax) {
  const int oh = g.out_h(), ow = g.out_w();
  const std::size_t plane = std::size_t(g.height) * g.width;
  for (int p = 0; p < g.batch * g.channels; ++p)
    for (int yo = 0; yo < oh; ++yo)
      for (int xo = 0; xo < ow; ++xo) {
        float best = -INFINITY;
        std::int32_t arg = -1;
        for (int i = 0; i < g.kernel_h; ++i)
          for (int j = 0; j < g.kernel_w; ++j) {
            const int h = yo * g.stride_h - g.pad_h + i, w = xo * g.stride_w - g.pad_w + j;
            if (h < 0 || h >= g.height || w < 0 || w >= g.width) continue;
            const float v = x[p * plane + std::size_t(h) * g.width + w];
            if (arg < 0 || v > best) {
              best = v;
              arg = h * g.width + w;
            }
          }
        const std::size_t o = (std::size_t(p) * oh + yo) * ow + xo;
        y[o] = best;
        argmax[o] = arg;
      }
}

void max_pool_backward(const float* dy, const std::int32_t* argmax, const window_geometry& g, float* dx) {
  const int oh = g.out_h(), ow = g.out_w();
  const std::size_t plane = std::size_t(g.height) * g.width;
  for (int p = 0; p < g.batch * g.channels; ++p)
    for (int h = 0; h < g.height; ++h)
      for (int w = 0; w < g.width; ++w) {
        float acc = 0.0f;
        const std::int32_t me = h * g.width + w;
        for (int i = 0; i < g.kernel_h; ++i) {
          const int ys = h + g.pad_h - i;
          if (ys < 0 || ys % g.stride_h || ys / g.stride_h >= oh) continue;
          for (int j = 0; j < g.kernel_w; ++j) {
            const int xs = w + g.pad_w - j;
            if (xs < 0 || xs % g.stride_w || xs / g.stride_w >= ow) continue;
            const std::size_t o = (std::size_t(p) * oh + ys / g.stride_h) * ow + xs / g.stride_w;
            if (argmax[o] == me) acc += dy[o];
          }
        }
        dx[p * plane + std::size_t(h) * g.width + w] = acc;
      }
}

void avg_pool_forward(const float* x, const window_geometry& g, float* y) {
  const int oh = g.out_h(), ow = g.out_w();
  const std::size_t plane = std::size_t(g.height) * g.width;
  const float inv = 1.0f / float(g.kernel_h * g.kernel_w);
  for (int p = 0; p < g.batch * g.channels; ++p)
    for (int yo = 0; yo < oh; ++yo)
      for (int xo = 0; xo < ow; ++xo) {
        float acc = 0.0f;
        for (int i = 0; i < g.kernel_h; ++i)
          for (int j = 0; j < g.kernel_w; ++j) {
            const int h = yo * g.stride_h - g.pad_h + i, w = xo * g.stride_w - g.pad_w + j;
            if (h >= 0 && h < g.height && w >= 0 && w < g.width) acc += x[p * plane + std::size_t(h) * g.width + w];
          }
        y[(std::size_t(p) * oh + yo) * ow + xo] = acc * inv;
      }
}

void avg_pool_backward(const float* dy, const window_geometry& g, float* dx) {
  const int oh = g.out_h(), ow = g.out_w();
  const std::size_t plane = std::size_t(g.height) * g.width;
  const float inv = 1.0f / float(g.kernel_h * g.kernel_w);
  for (int p = 0; p < g.batch * g.channels; ++p)
    for (int h = 0; h < g.height; ++h)
      for (int w = 0; w < g.width; ++w) {
        float acc = 0.0f;
        for (int i = 0; i < g.kernel_h; ++i) {
          const int ys = h + g.pad_h - i;
          if (ys < 0 || ys % g.stride_h || ys / g.stride_h >= oh) continue;
          for (int j = 0; j < g.kernel_w; ++j) {
            const int xs = w + g.pad_w - j;
            if (xs < 0 || xs % g.stride_w || xs / g.stride_w >= ow) continue;
            acc += dy[(std::size_t(p) * oh + ys / g.stride_h) * ow + xs / g.stride_w];
          }
        }
        dx[p * plane + std::size_t(h) * g.width + w] = acc * inv;
      }
}

}  // namespace nerve::gpu::cpu

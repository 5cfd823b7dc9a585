#pragma once
/// \file
/// The kernels that compute each output element on its own, as one function object
/// per kernel: `op(i)` computes element `i`. They are compiled twice, by nvcc into the
/// CUDA kernels (gpu/kernels/*.cu: one thread per element, grid-stride) and by the C++
/// compiler into the stand-in's loops (gpu/standin/cpu_kernels.cpp), so the GPU and
/// its CPU twin share every formula and every order of summation. C++17, no CUDA
/// headers. The window ops take any unsigned index type (kernels/window.cu says why).
///
/// The backward of pooling and col2im gathers per input pixel, in the same (i, j)
/// order everywhere: deterministic, no atomics.

#include "gpu/kernels.hpp"
#include "gpu/kernels/element.hpp"
#include "gpu/kernels/sequence_ops.hpp"

#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <variant>

namespace nerve::gpu::ops {

inline constexpr float inv_sqrt2 = 0.70710678118654752440f;
inline constexpr float inv_sqrt2pi = 0.39894228040143267794f;

/// Calls `fn(std::integral_constant<activation, f>{})`: one compiled kernel per activation.
template <class Fn>
void with_activation(activation f, Fn&& fn) {
  switch (f) {
    case activation::relu: return fn(std::integral_constant<activation, activation::relu>{});
    case activation::leaky_relu: return fn(std::integral_constant<activation, activation::leaky_relu>{});
    case activation::sigmoid: return fn(std::integral_constant<activation, activation::sigmoid>{});
    case activation::tanh: return fn(std::integral_constant<activation, activation::tanh>{});
    case activation::gelu: return fn(std::integral_constant<activation, activation::gelu>{});
  }
}

template <activation F>
struct activation_forward {
  const float* x;
  float* y;
  float alpha;
  NERVE_HOST_DEVICE void operator()(std::size_t i) const {
    const float v = read_only(x[i]);
    if constexpr (F == activation::relu) y[i] = v > 0.0f ? v : 0.0f;
    if constexpr (F == activation::leaky_relu) y[i] = v > 0.0f ? v : alpha * v;
    if constexpr (F == activation::sigmoid) y[i] = 1.0f / (1.0f + expf(-v));
    if constexpr (F == activation::tanh) y[i] = tanhf(v);
    if constexpr (F == activation::gelu) y[i] = 0.5f * v * erfcf(-v * inv_sqrt2);
  }
};

template <activation F>
struct activation_backward {
  const float *x, *y, *dy;
  float* dx;
  float alpha;
  NERVE_HOST_DEVICE void operator()(std::size_t i) const {
    const float g = dy[i];
    if constexpr (F == activation::relu) dx[i] = read_only(x[i]) > 0.0f ? g : 0.0f;
    if constexpr (F == activation::leaky_relu) dx[i] = read_only(x[i]) > 0.0f ? g : alpha * g;
    if constexpr (F == activation::sigmoid || F == activation::tanh) {
      const float v = read_only(y[i]);
      dx[i] = F == activation::sigmoid ? g * v * (1.0f - v) : g * (1.0f - v * v);
    }
    if constexpr (F == activation::gelu) {
      const float v = read_only(x[i]);
      const float cdf = 0.5f * erfcf(-v * inv_sqrt2);
      const float pdf = inv_sqrt2pi * expf(-0.5f * v * v);
      dx[i] = g * (cdf + v * pdf);
    }
  }
};

struct bias_add {
  const float *x, *bias;
  float* y;
  std::size_t cols;
  bool relu;
  NERVE_HOST_DEVICE void operator()(std::size_t i) const {
    const float v = x[i] + read_only(bias[i % cols]);
    y[i] = relu && !(v > 0.0f) ? 0.0f : v;
  }
};

struct softmax_xent_backward {
  const float* probs;
  const std::int32_t* labels;
  std::size_t cols;
  float scale;
  float* dlogits;
  NERVE_HOST_DEVICE void operator()(std::size_t i) const {
    const float onehot = std::size_t(read_only(labels[i / cols])) == i % cols ? 1.0f : 0.0f;
    dlogits[i] = scale * (read_only(probs[i]) - onehot);
  }
};

/// y = a ∘ b elementwise (`Op`: 0 add, 1 sub, 2 mul; layers::binary_fn's order).
template <int Op>
NERVE_HOST_DEVICE float combine(float a, float b) {
  if constexpr (Op == 0) return a + b;
  if constexpr (Op == 1) return a - b;
  return a * b;
}
template <int Op>
struct binary {
  const float *a, *b;
  float* y;
  NERVE_HOST_DEVICE void operator()(std::size_t i) const { y[i] = combine<Op>(read_only(a[i]), read_only(b[i])); }
};
/// y[i] = x[i] ∘ v[i % period]: a row vector (a scalar with period 1) over every row. y may be x.
template <int Op>
struct broadcast {
  const float *x, *v;
  float* y;
  std::size_t period;
  NERVE_HOST_DEVICE void operator()(std::size_t i) const { y[i] = combine<Op>(x[i], read_only(v[i % period])); }
};

/// Calls `fn(i)` for each element `i` of channel c of a [outer, channels, inner] view, in
/// element order (rows o, then positions): the order every per-channel sum here adds in,
/// the CPU's (layers/cpu_ops.cpp).
template <class Fn>
NERVE_HOST_DEVICE void for_each_in_channel(const channel_geometry& g, std::size_t c, Fn&& fn) {
  for (std::size_t o = 0; o < g.outer; ++o)
    for (std::size_t i = (o * g.channels + c) * g.inner, end = i + g.inner; i < end; ++i) fn(i);
}
/// A channel's statistics (element i is channel i; one thread per channel): with `batch`
/// its mean and biased variance, summed in double over rows then positions (the CPU's
/// order); then 1/√(var + eps).
struct channel_stats {
  const float* x;
  float* mean;
  float* var;
  float* rstd;
  channel_geometry g;
  double eps;
  bool batch;
  NERVE_HOST_DEVICE void operator()(std::size_t c) const {
    double v;
    if (batch) {
      double sum = 0;
      for_each_in_channel(g, c, [&](std::size_t i) { sum += double(read_only(x[i])); });
      const float m = float(sum / double(g.count()));
      double sq = 0;
      for_each_in_channel(g, c, [&](std::size_t i) {
        const double d = double(read_only(x[i])) - double(m);
        sq += d * d;
      });
      v = sq / double(g.count());
      mean[c] = m;
      var[c] = float(v);
    } else {
      v = double(var[c]);
    }
    rstd[c] = float(1.0 / sqrt(v + eps));
  }
};
/// xhat[i] = (x[i] − mean[c])·rstd[c].
struct normalize_apply {
  const float *x, *mean, *rstd;
  float* xhat;
  std::size_t channels, inner;
  NERVE_HOST_DEVICE void operator()(std::size_t i) const {
    const std::size_t c = (i / inner) % channels;
    xhat[i] = (read_only(x[i]) - read_only(mean[c])) * read_only(rstd[c]);
  }
};
/// The two means normalisation's backward needs, per channel (one thread each):
/// means[c] = mean(dxhat), means[channels + c] = mean(dxhat·xhat), summed in double.
struct normalize_grad_means {
  const float *xhat, *dxhat;
  float* means;
  channel_geometry g;
  NERVE_HOST_DEVICE void operator()(std::size_t c) const {
    double sg = 0, sgx = 0;
    for_each_in_channel(g, c, [&](std::size_t i) {
      const double d = double(read_only(dxhat[i]));
      sg += d;
      sgx += d * double(read_only(xhat[i]));
    });
    means[c] = float(sg / double(g.count()));
    means[g.channels + c] = float(sgx / double(g.count()));
  }
};
/// dx[i] = rstd[c]·(dxhat[i] − means[c] − xhat[i]·means[channels + c]).
struct normalize_grad_apply {
  const float *xhat, *rstd, *dxhat, *means;
  float* dx;
  std::size_t channels, inner;
  NERVE_HOST_DEVICE void operator()(std::size_t i) const {
    const std::size_t c = (i / inner) % channels;
    dx[i] = read_only(rstd[c]) *
            (read_only(dxhat[i]) - read_only(means[c]) - read_only(xhat[i]) * read_only(means[channels + c]));
  }
};
/// y[i] = x[i]·scale[c] + shift[c] (no shift when null). y may be x.
struct channel_affine {
  const float *x, *scale, *shift;
  float* y;
  std::size_t channels, inner;
  NERVE_HOST_DEVICE void operator()(std::size_t i) const {
    const std::size_t c = (i / inner) % channels;
    const float v = x[i] * read_only(scale[c]);
    y[i] = shift ? v + read_only(shift[c]) : v;
  }
};
/// out[c] += Σ x·z over channel c (z null: Σ x), in double; one thread per channel.
struct channel_sums {
  const float *x, *z;
  float* out;
  channel_geometry g;
  NERVE_HOST_DEVICE void operator()(std::size_t c) const {
    double acc = 0;
    for_each_in_channel(g, c, [&](std::size_t i) {
      acc += z ? double(read_only(x[i])) * double(read_only(z[i])) : double(read_only(x[i]));
    });
    out[c] += float(acc);
  }
};

struct axpy {
  float alpha;
  const float* x;
  float* y;
  NERVE_HOST_DEVICE void operator()(std::size_t i) const { y[i] += alpha * read_only(x[i]); }
};
struct scale {
  float alpha;
  float* x;
  NERVE_HOST_DEVICE void operator()(std::size_t i) const { x[i] *= alpha; }
};
struct fill {
  float value;
  float* x;
  NERVE_HOST_DEVICE void operator()(std::size_t i) const { x[i] = value; }
};

/// y[r·ldy + c] = x[r·ldx + c] over a rows × cols block (element i is (i / cols, i % cols)).
struct copy2d {
  const float* x;
  float* y;
  std::size_t cols, ldx, ldy;
  NERVE_HOST_DEVICE void operator()(std::size_t i) const {
    const std::size_t r = i / cols, c = i % cols;
    y[r * ldy + c] = read_only(x[r * ldx + c]);
  }
};
/// Inverted dropout's mask: scale where draw i of `key` is at least p, else 0. The draw is
/// layers/ops.hpp's `counter_uniform` (SplitMix64 of the counter key + (i + 1)·γ, its top
/// 53 bits), so a device draws the CPU's mask bit for bit.
struct dropout_mask {
  std::uint64_t key;
  double p;
  float scale;
  float* mask;
  NERVE_HOST_DEVICE void operator()(std::size_t i) const {
    std::uint64_t z = key + (std::uint64_t(i) + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    mask[i] = double(z >> 11) * 0x1.0p-53 >= p ? scale : 0.0f;
  }
};

/// One SGD step per element; `make` rounds the scalars as the CPU's op set does.
struct sgd_update {
  float* w;
  const float* g;
  float* velocity;
  float neg_lr, momentum, keep, weight_decay;  // keep: 1 − dampening
  bool nesterov, first;
  static sgd_update make(float* w, const float* g, float* velocity, const sgd_params& p) {
    return {w,
            g,
            velocity,
            float(-p.lr),
            float(p.momentum),
            float(1 - p.dampening),
            float(p.weight_decay),
            p.nesterov,
            p.first};
  }
  NERVE_HOST_DEVICE void operator()(std::size_t i) const {
    const float wi = w[i];
    const float gi = read_only(g[i]);
    const float d = weight_decay != 0.0f ? gi + weight_decay * wi : gi;
    float step = d;
    if (momentum != 0.0f) {
      const float v = first ? d : velocity[i] * momentum + keep * d;
      velocity[i] = v;
      step = nesterov ? d + momentum * v : v;
    }
    w[i] = wi + neg_lr * step;
  }
};

/// One Adam step per element; `make` computes the bias corrections in double and rounds
/// the scalars as the CPU's op set does.
struct adam_update {
  float* w;
  const float* g;
  float *m, *v;
  float decay, l2, beta1, keep1, beta2, keep2, neg_step, bc2_sqrt, eps;  // keep: 1 − beta
  bool decoupled;
  static adam_update make(float* w, const float* g, float* m, float* v, const adam_params& p) {
    const double bc1 = 1 - std::pow(p.beta1, double(p.step));
    const double bc2 = 1 - std::pow(p.beta2, double(p.step));
    return {w,
            g,
            m,
            v,
            float(1 - p.lr * p.weight_decay),
            p.decoupled ? 0.0f : float(p.weight_decay),
            float(p.beta1),
            float(1 - p.beta1),
            float(p.beta2),
            float(1 - p.beta2),
            -float(p.lr / bc1),
            float(std::sqrt(bc2)),
            float(p.eps),
            p.decoupled};
  }
  NERVE_HOST_DEVICE void operator()(std::size_t i) const {
    float wi = w[i];
    if (decoupled) wi *= decay;
    float gi = read_only(g[i]);
    if (l2 != 0.0f) gi = gi + l2 * wi;
    const float mi = m[i] * beta1 + keep1 * gi;
    const float vi = v[i] * beta2 + keep2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    w[i] = wi + neg_step * (mi / (sqrtf(vi) / bc2_sqrt + eps));
  }
};

// ---- sliding windows over NCHW images (window_geometry) ----------------------------

/// Elements of the patch matrices, of the inputs and of the outputs.
inline std::size_t patch_elements(const window_geometry& g) {
  return std::size_t(g.batch) * g.patch_rows() * g.patch_cols();
}
inline std::size_t inputs(const window_geometry& g) { return std::size_t(g.batch) * g.channels * g.height * g.width; }
inline std::size_t outputs(const window_geometry& g) {
  return std::size_t(g.batch) * g.channels * g.out_h() * g.out_w();
}

/// Calls `f(i, j, y, x)`, in (i, j) order, for every window (output y, x) that reads input
/// pixel (h, w) at kernel offset (i, j): the gather of col2im and of pooling's backward.
template <class F>
NERVE_HOST_DEVICE void windows_reading(const window_geometry& g, int h, int w, F&& f) {
  const int oh = g.out_h(), ow = g.out_w();
  for (int i = 0; i < g.kernel_h; ++i) {
    const int ys = h + g.pad_h - i;
    if (ys < 0 || ys % g.stride_h || ys / g.stride_h >= oh) continue;
    for (int j = 0; j < g.kernel_w; ++j) {
      const int xs = w + g.pad_w - j;
      if (xs < 0 || xs % g.stride_w || xs / g.stride_w >= ow) continue;
      f(i, j, ys / g.stride_h, xs / g.stride_w);
    }
  }
}

/// Element `idx` of the patch matrices (n, row (c, i, j), column (y, x)).
struct im2col {
  const float* x;
  window_geometry g;
  float* col;
  std::size_t size() const { return patch_elements(g); }
  template <class I>
  NERVE_HOST_DEVICE void operator()(I idx) const {
    const I oh = I(g.out_h()), ow = I(g.out_w()), kh = I(g.kernel_h), kw = I(g.kernel_w);
    const I pc = oh * ow, pr = I(g.channels) * kh * kw;
    const I n = idx / (pr * pc), rest = idx - n * (pr * pc);
    const I row = rest / pc, pix = rest - row * pc;
    const I c = row / (kh * kw), ij = row - c * (kh * kw);
    const I i = ij / kw, j = ij - i * kw;
    const I y = pix / ow, xo = pix - y * ow;
    const int h = int(y) * g.stride_h - g.pad_h + int(i), w = int(xo) * g.stride_w - g.pad_w + int(j);
    col[idx] = (h >= 0 && h < g.height && w >= 0 && w < g.width)
                   ? read_only(x[((n * I(g.channels) + c) * I(g.height) + I(h)) * I(g.width) + I(w)])
                   : 0.0f;
  }
};

/// Input pixel `idx`: the sum of the patch entries that read it.
struct col2im {
  const float* col;
  window_geometry g;
  float* dx;
  std::size_t size() const { return inputs(g); }
  template <class I>
  NERVE_HOST_DEVICE void operator()(I idx) const {
    const int ow = g.out_w();
    const I pc = I(g.out_h()) * I(ow), pr = I(g.channels) * I(g.kernel_h) * I(g.kernel_w);
    const I plane = I(g.width) * I(g.height);
    const I nc = idx / plane, hw = idx - nc * plane;
    const I n = nc / I(g.channels), c = nc - n * I(g.channels);
    const int h = int(hw / I(g.width)), w = int(hw - I(h) * I(g.width));
    float acc = 0.0f;
    windows_reading(g, h, w, [&](int i, int j, int y, int xo) {
      const I row = (c * I(g.kernel_h) + I(i)) * I(g.kernel_w) + I(j);
      acc += read_only(col[n * pr * pc + row * pc + I(y) * I(ow) + I(xo)]);
    });
    dx[idx] = acc;
  }
};

/// Output `o` of max pooling (the first maximum and its index in the plane; padding
/// never wins) or of average pooling (padding counted).
template <bool Max>
struct pool_forward {
  const float* x;
  window_geometry g;
  float* y;
  std::int32_t* argmax;  ///< max pooling only
  std::size_t size() const { return outputs(g); }
  template <class I>
  NERVE_HOST_DEVICE void operator()(I o) const {
    const int oh = g.out_h(), ow = g.out_w();
    const I plane = I(oh) * I(ow);
    const I p = o / plane, q = o - p * plane;
    const int yo = int(q / I(ow)), xo = int(q - I(yo) * I(ow));
    const float* img = x + p * I(g.height) * I(g.width);
    float acc = Max ? -FLT_MAX : 0.0f;  // the maximum so far, or the sum
    std::int32_t arg = -1;
    for (int i = 0; i < g.kernel_h; ++i)
      for (int j = 0; j < g.kernel_w; ++j) {
        const int h = yo * g.stride_h - g.pad_h + i, w = xo * g.stride_w - g.pad_w + j;
        if (h < 0 || h >= g.height || w < 0 || w >= g.width) continue;
        const float v = read_only(img[h * g.width + w]);
        if (!Max) {
          acc += v;
        } else if (arg < 0 || v > acc) {
          acc = v;
          arg = h * g.width + w;
        }
      }
    if constexpr (Max) argmax[o] = arg;
    y[o] = Max ? acc : acc * (1.0f / float(g.kernel_h * g.kernel_w));
  }
};

/// Input pixel `idx` of pooling's backward: the sum of dy over the windows whose argmax it
/// is (max), or over every window holding it divided by the window's size (average).
template <bool Max>
struct pool_backward {
  const float* dy;
  const std::int32_t* argmax;  ///< max pooling only
  window_geometry g;
  float* dx;
  std::size_t size() const { return inputs(g); }
  template <class I>
  NERVE_HOST_DEVICE void operator()(I idx) const {
    const int oh = g.out_h(), ow = g.out_w();
    const I plane = I(g.width) * I(g.height);
    const I p = idx / plane, hw = idx - p * plane;
    const int h = int(hw / I(g.width)), w = int(hw - I(h) * I(g.width));
    const std::int32_t me = h * g.width + w;
    float acc = 0.0f;
    windows_reading(g, h, w, [&](int, int, int y, int xo) {
      const I o = (p * I(oh) + I(y)) * I(ow) + I(xo);
      if (!Max || read_only(argmax[o]) == me) acc += read_only(dy[o]);
    });
    dx[idx] = Max ? acc : acc * (1.0f / float(g.kernel_h * g.kernel_w));
  }
};

/// Every pointwise op: what a backend runs over elements [0, n) (`backend::launch`).
using pointwise_op =
    std::variant<activation_forward<activation::relu>, activation_forward<activation::leaky_relu>,
                 activation_forward<activation::sigmoid>, activation_forward<activation::tanh>,
                 activation_forward<activation::gelu>, activation_backward<activation::relu>,
                 activation_backward<activation::leaky_relu>, activation_backward<activation::sigmoid>,
                 activation_backward<activation::tanh>, activation_backward<activation::gelu>, bias_add,
                 softmax_xent_backward, axpy, scale, fill, sgd_update, adam_update, binary<0>, binary<1>,
                 binary<2>, broadcast<0>, broadcast<1>, broadcast<2>, copy2d, dropout_mask, channel_stats,
                 normalize_apply, normalize_grad_means, normalize_grad_apply, channel_affine, channel_sums,
                 gather_rows, scatter_add_rows, patch_permute<true>, patch_permute<false>, softmax_rows,
                 softmax_rows_backward, permute_heads<true>, permute_heads<false>>;
/// Every window op (`backend::launch`, over its `size()` elements).
using window_op = std::variant<im2col, col2im, pool_forward<true>, pool_forward<false>, pool_backward<true>,
                               pool_backward<false>>;

}  // namespace nerve::gpu::ops

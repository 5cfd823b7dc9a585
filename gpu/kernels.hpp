#pragma once
/// \file
/// The float32 kernels a layer backend needs, as launchers on a stream. No CUDA
/// types: pointers are device memory of the stream's device (host memory on the
/// stand-in, where the same ops run as plain loops on the stream's worker, in
/// order). A call only enqueues; errors of the launch itself throw `gpu::error`,
/// errors of the work reach the stream's waiters.
///
/// Layouts: matrices row-major `rows × cols` (batch first); images NCHW.
/// Every kernel is deterministic: reductions run in a fixed order, backward of
/// pooling and col2im gather instead of scattering with atomics, so two runs give
/// the same bits. Any thread may call, one at a time per stream.

#include <cstddef>
#include <cstdint>

namespace nerve::gpu {

class stream;

/// Pointwise activations.
enum class activation {
  relu,
  leaky_relu,  ///< x > 0 ? x : alpha·x
  sigmoid,
  tanh,
  gelu,        ///< exact: x·Φ(x) = 0.5·x·erfc(−x/√2) (PyTorch's default; erfc: no cancellation for x ≪ 0)
};

/// y = f(x), n elements; y may equal x. `alpha` is the leaky slope.
void activation_forward(stream& s, activation f, const float* x, float* y, std::size_t n, float alpha = 0.01f);

/// dx = f'(x)·dy, n elements; dx may equal dy. Sigmoid and tanh read `y` (the
/// forward output), the others read `x` (the forward input); pass both.
void activation_backward(stream& s, activation f, const float* x, const float* y, const float* dy, float* dx,
                         std::size_t n, float alpha = 0.01f);

/// y[r][c] = x[r][c] + bias[c], then max(0, ·) when `relu`; y may equal x.
void bias_add(stream& s, const float* x, const float* bias, float* y, std::size_t rows, std::size_t cols,
              bool relu = false);

/// out[c] = beta·out[c] + Σ_r x[r][c] (the bias gradient; beta = 1 accumulates).
void column_sums(stream& s, const float* x, std::size_t rows, std::size_t cols, float* out, float beta = 0.0f);

/// Softmax cross-entropy forward, one row per sample: probs = softmax(logits),
/// loss[r] = logsumexp(logits[r]) − logits[r][label[r]], and *correct = the number
/// of rows whose first arg-max equals the label (set, not accumulated).
/// `probs` is kept for backward. Labels are int32 in [0, cols).
void softmax_xent_forward(stream& s, const float* logits, const std::int32_t* labels, std::size_t rows,
                          std::size_t cols, float* probs, float* loss, float* correct);

/// dlogits = scale·(probs − onehot(label)); scale is usually 1/batch.
void softmax_xent_backward(stream& s, const float* probs, const std::int32_t* labels, std::size_t rows,
                           std::size_t cols, float scale, float* dlogits);

/// y += alpha·x.
void axpy(stream& s, std::size_t n, float alpha, const float* x, float* y);
/// Elementwise functions of two arrays (layers::binary_fn's order).
enum class binary_op { add, sub, mul };
/// y = a ∘ b, n elements; y may be a or b.
void binary(stream& s, binary_op f, const float* a, const float* b, float* y, std::size_t n);
/// y[i] = x[i] ∘ v[i % period], n elements (n a multiple of period); y may be x.
void broadcast(stream& s, binary_op f, const float* x, const float* v, float* y, std::size_t n, std::size_t period);
/// x *= alpha.
void scale(stream& s, std::size_t n, float alpha, float* x);
/// x[i] = value.
void fill(stream& s, std::size_t n, float value, float* x);
/// `rows` rows of `cols` floats from `x` (rows `ldx` apart) to `y` (rows `ldy` apart).
void copy2d(stream& s, std::size_t rows, std::size_t cols, const float* x, std::size_t ldx, float* y,
            std::size_t ldy);
/// Inverted dropout's mask (layers/ops.hpp's `dropout_mask`, the same draws).
void dropout_mask(stream& s, std::uint64_t key, double p, float scale, float* mask, std::size_t n);

/// Data viewed as `[outer, channels, inner]` (layers::norm_geometry): a channel's values
/// are its outer·inner elements.
struct channel_geometry {
  std::size_t outer = 1, channels = 1, inner = 1;
  constexpr std::size_t count() const { return outer * inner; }
  constexpr std::size_t size() const { return outer * channels * inner; }
};
/// Per channel: with `batch`, mean and biased variance of its values (summed in double,
/// in element order) written to `mean` and `var`; without, read from them. Then
/// rstd = 1/√(var + eps) and xhat = (x − mean)·rstd (layers/ops.hpp's `normalize`).
void normalize(stream& s, const channel_geometry& g, const float* x, bool batch, float* mean, float* var, double eps,
               float* xhat, float* rstd);
/// dx = rstd·(dxhat − mean(dxhat) − xhat·mean(dxhat·xhat)) per channel; `scratch` holds
/// 2·channels floats (the two means).
void normalize_grad(stream& s, const channel_geometry& g, const float* xhat, const float* rstd, const float* dxhat,
                    float* dx, float* scratch);
/// y = x·scale[c] + shift[c] (`shift` null: none); y may be x.
void channel_affine(stream& s, const channel_geometry& g, const float* x, const float* scale, const float* shift,
                    float* y);
/// out[c] += Σ x·z over each channel (`z` null: Σ x), summed in double.
void channel_sums(stream& s, const channel_geometry& g, const float* x, const float* z, float* out);

/// SGD as PyTorch's (`layers::basic_sgd`): d = g + wd·w; with momentum, v = d on the
/// `first` step and v = momentum·v + (1 − dampening)·d after; step = nesterov ? d +
/// momentum·v : v (just d without momentum); w −= lr·step. `velocity` may be null when
/// momentum is 0. The scalars are rounded to float as the CPU's op set rounds them.
struct sgd_params {
  double lr = 0.01;
  double momentum = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  double dampening = 0.0;
  bool first = false;
};
void sgd_update(stream& s, float* w, const float* g, float* velocity, std::size_t n, const sgd_params& p);

/// Adam (decoupled = false: wd added to the gradient) and AdamW (decoupled = true:
/// w *= 1 − lr·wd first), PyTorch's formulas with bias correction at `step` (1-based),
/// computed in double and rounded as the CPU's op set does (`layers::basic_adam`).
struct adam_params {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decoupled = false;
  std::int64_t step = 1;
};
void adam_update(stream& s, float* w, const float* g, float* m, float* v, std::size_t n, const adam_params& p);

/// A sliding window over NCHW images (convolution patches and pooling).
struct window_geometry {
  int batch = 1, channels = 1, height = 1, width = 1;
  int kernel_h = 1, kernel_w = 1;
  int pad_h = 0, pad_w = 0;
  int stride_h = 1, stride_w = 1;
  constexpr int out_h() const { return (height + 2 * pad_h - kernel_h) / stride_h + 1; }
  constexpr int out_w() const { return (width + 2 * pad_w - kernel_w) / stride_w + 1; }
  /// Rows of one image's patch matrix: channels·kernel_h·kernel_w.
  constexpr std::size_t patch_rows() const { return std::size_t(channels) * kernel_h * kernel_w; }
  /// Columns of one image's patch matrix: out_h·out_w.
  constexpr std::size_t patch_cols() const { return std::size_t(out_h()) * out_w(); }
};

/// Patch matrices, one per image, stacked: col[n] is (C·kh·kw) × (oh·ow), row
/// (c, i, j), column (y, x), zeros in the padding. Convolution is then
/// Y_n = W(K × C·kh·kw) · col[n] (`gemm_strided_batched` with stride_a = 0).
void im2col(stream& s, const float* x, const window_geometry& g, float* col);
/// The adjoint of im2col: dx (overwritten) sums every patch entry that reads it.
void col2im(stream& s, const float* col, const window_geometry& g, float* dx);

/// Max pooling; argmax[n][c][y][x] is the index (h·W + w) in its input plane of
/// the first maximum (padding never wins).
void max_pool_forward(stream& s, const float* x, const window_geometry& g, float* y, std::int32_t* argmax);
/// dx (overwritten) = the sum of dy over the windows whose argmax is that input.
void max_pool_backward(stream& s, const float* dy, const std::int32_t* argmax, const window_geometry& g, float* dx);
/// Average pooling, dividing by kernel_h·kernel_w (padding counted, PyTorch's default).
void avg_pool_forward(stream& s, const float* x, const window_geometry& g, float* y);
/// dx (overwritten) = Σ over windows containing it of dy / (kernel_h·kernel_w).
void avg_pool_backward(stream& s, const float* dy, const window_geometry& g, float* dx);

/// y[t] = table[ids[t]] for `n` ids (floats holding integers), `cols` floats a row; a zero
/// row for an id that is not an integer in [0, rows) (no read outside the table).
void gather_rows(stream& s, const float* table, std::size_t rows, std::size_t cols, const float* ids, std::size_t n,
                 float* y);
/// table[ids[t]] += dy[t] for t = 0, 1, …, n − 1, each row's additions in that order (a
/// thread per row and chunk of columns scans the ids: no atomics); other ids add nothing.
void scatter_add_rows(stream& s, const float* dy, const float* ids, std::size_t n, std::size_t rows, std::size_t cols,
                      float* table);
/// Images `[N, C, H, W]` to patches `[N, (H/kh)·(W/kw), C·kh·kw]` (`g`: stride = kernel,
/// no padding, H and W multiples of the kernel; layers/ops.hpp's order).
void patchify(stream& s, const window_geometry& g, const float* x, float* y);
/// The inverse permutation: patches back into the images `x` (overwritten).
void unpatchify(stream& s, const window_geometry& g, const float* y, float* x);
/// The softmax of each of `rows` rows of `cols` floats (layers/ops.hpp's `softmax_rows`):
/// with `causal`, row i of each block of `block_rows` rows sees the columns ≤ i + offset,
/// the others are 0 (a row that sees none is all 0). The visible maximum is subtracted,
/// the exponentials summed in double in column order; one thread per row.
void softmax_rows(stream& s, const float* x, float* y, std::size_t rows, std::size_t cols, bool causal,
                  std::size_t block_rows, std::int64_t offset);
/// dx = y·(dy − Σ_c dy·y) per row (the sum in double, in column order); one thread per row.
void softmax_rows_backward(stream& s, const float* y, const float* dy, float* dx, std::size_t rows,
                           std::size_t cols);
/// Multi-head attention's layouts (layers::head_geometry): `[batch, tokens, parts, heads,
/// head_dim]` and `[parts, batch, heads, tokens, head_dim]`.
struct head_layout {
  std::size_t batch = 1, tokens = 1, parts = 1, heads = 1, head_dim = 1;
  constexpr std::size_t size() const { return batch * tokens * parts * heads * head_dim; }
};
/// `[B, T, parts, H, D]` → `[parts, B, H, T, D]` (y must not overlap x).
void split_heads(stream& s, const head_layout& g, const float* x, float* y);
/// `[parts, B, H, T, D]` → `[B, T, parts, H, D]` (x must not overlap y).
void merge_heads(stream& s, const head_layout& g, const float* y, float* x);

}  // namespace nerve::gpu

#pragma once
/// \file
/// Layers written once for every backend (ggml's shape: a backend fills a table of ops,
/// the layers call the table). Three pieces:
///
/// ```
///   basic_op_layer::compute(ops, inputs, params)      written once, by the layer
///        │  ops.matmul / add_row / unary / mul …      arrays in, arrays out; each call
///        ▼                                            recorded on the tape in training
///   basic_ops (+ basic_tape)                          backward for free: the tape replayed
///        │  gemm / unary / binary / column_sums …     pointers and counts, like BLAS
///        ▼
///   basic_op_set                                      what a backend implements:
///        cpu_op_set (Eigen, OpenBLAS)  ·  gpu's device_op_set (cuBLAS and kernels on a stream)
/// ```
/// An array's memory is the backend's (host memory on the CPU, device memory on a
/// device), so a layer never sees where it runs. A layer may leave its backward to the
/// tape (each op knows its derivative) or write it with the same ops (`custom_backward`),
/// where a hand-written one is faster or keeps less.
///
/// Thread safety: an op set, its arrays and a tape belong to one actor's loop at a time.

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "layers/gemm.hpp"
#include "layers/layer.hpp"

namespace nerve::layers {

/// What an op set may run (`basic_op_set::supports`).
enum class op_kind : std::uint8_t {
  gemm, gemm_bias, unary, unary_grad, binary, broadcast, column_sums, axpy, scale, fill, copy, copy2d, conv2d,
  pool2d, dropout_mask, norm, optimizer, host_copy, softmax_xent, gather_rows, patchify, gemm_batched, softmax_rows,
  heads
};
inline constexpr std::size_t op_kinds = 24;

// GCC 12 takes a scoped enumerator for a shadow of the layer aliases of the same name
// (layers/activation.hpp's `relu`, …), which it cannot be.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wshadow"
/// Pointwise functions of one input (PyTorch's: GELU is the exact erf form).
enum class unary_fn : std::uint8_t {
  relu,
  leaky_relu,  ///< x > 0 ? x : alpha·x
  sigmoid,
  tanh,
  gelu,
};
/// Pointwise functions of two inputs.
enum class binary_fn : std::uint8_t { add, sub, mul };
/// What a pooling window computes (PyTorch's `MaxPool2d`, and `AvgPool2d` with padding
/// counted in the divisor).
enum class pool_fn : std::uint8_t { max, average };
#pragma GCC diagnostic pop

/// A sliding window over `[N, C, H, W]` images: a convolution's patches or a pooling
/// window. Zero padding; the output is `[N, ·, out_h(), out_w()]`.
struct window_geometry {
  std::int64_t batch = 1, channels = 1, height = 1, width = 1;
  std::int64_t kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  constexpr std::int64_t out_h() const noexcept { return (height + 2 * pad_h - kernel_h) / stride_h + 1; }
  constexpr std::int64_t out_w() const noexcept { return (width + 2 * pad_w - kernel_w) / stride_w + 1; }
  /// Rows of one image's patch matrix: channels·kernel_h·kernel_w.
  constexpr std::int64_t patch_rows() const noexcept { return channels * kernel_h * kernel_w; }
  /// Its columns: out_h·out_w.
  constexpr std::int64_t patch_cols() const noexcept { return out_h() * out_w(); }
};

/// Data viewed as `[outer, channels, inner]`, row-major: what the normalisation and
/// per-channel ops work over. A channel's values are its `outer·inner` elements
/// (BatchNorm: `[N, C, H·W]`; LayerNorm's statistics: `[1, N, features]`, a channel per
/// sample; a per-feature affine map: `[N, features, 1]`).
struct norm_geometry {
  std::int64_t outer = 1, channels = 1, inner = 1;
  /// The values of one channel: outer·inner.
  constexpr std::int64_t count() const noexcept { return outer * inner; }
  constexpr std::int64_t size() const noexcept { return outer * channels * inner; }
};

/// Where `basic_op_set::find_bad_id` found an id that is not an integer in [0, rows):
/// its position among the ids and its value; `position` −1 when every id is one.
struct bad_id {
  std::int64_t position = -1;
  double value = 0;
  explicit operator bool() const noexcept { return position >= 0; }
};

/// A causal mask over `[T, T']` blocks of rows (`basic_op_set::softmax_rows`): row `i`
/// of each block of `block_rows` rows sees the columns `c ≤ i + offset` (offset 0: a
/// token attends to itself and those before it; a negative offset may mask whole rows).
struct causal_mask {
  bool on = false;
  std::int64_t block_rows = 1, offset = 0;
  /// The last column row `r` sees (all of them when off; below 0: none).
  constexpr std::int64_t last_visible(std::int64_t r, std::int64_t cols) const noexcept {
    if (!on) return cols - 1;
    const std::int64_t last = r % block_rows + offset;
    return last < cols - 1 ? last : cols - 1;
  }
};

/// Multi-head attention's layout: a `[batch, tokens, parts, heads, head_dim]` tensor (a
/// fused qkv projection's output: parts 3, q then k then v, each's heads contiguous) and
/// its per-head form `[parts, batch, heads, tokens, head_dim]` (each part a `[B, H, T,
/// D]` block, one after the other).
struct head_geometry {
  std::int64_t batch = 1, tokens = 1, parts = 1, heads = 1, head_dim = 1;
  constexpr std::int64_t size() const noexcept { return batch * tokens * parts * heads * head_dim; }
};

/// One SGD update (`basic_sgd`, PyTorch's rule) of a parameter: `d = g + weight_decay·w`;
/// with momentum, `b = d` on the first step (`first`) and `b = momentum·b + (1 −
/// dampening)·d` after, then `d = d + momentum·b` (Nesterov) or `d = b`; `w −= lr·d`.
/// The scalars are rounded to the parameter's type as PyTorch rounds them.
struct sgd_update_args {
  double lr = 0.01, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false, first = false;
};
/// One Adam or AdamW update (`basic_adam`, PyTorch's rule) at the parameter's step `t`
/// (1-based): AdamW scales `w` by `1 − lr·weight_decay` first, Adam adds
/// `weight_decay·w` to the gradient; `m = β₁m + (1−β₁)g`, `v = β₂v + (1−β₂)g²`,
/// `w −= (lr/(1−β₁ᵗ))·m / (√v/√(1−β₂ᵗ) + ε)`, the corrections computed in double.
struct adam_update_args {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  bool decoupled = false;
  std::int64_t t = 1;
};

/// Draw `i` of the uniform stream `key`, in [0, 1): SplitMix64's output for counter
/// `key + (i + 1)·γ` (γ = 0x9e3779b97f4a7c15), its top 53 bits. Counter-based, so every
/// element is drawn on its own and every backend (a GPU thread per element) draws the
/// same numbers; gpu/kernels/ops.hpp has the same formula.
constexpr double counter_uniform(std::uint64_t key, std::uint64_t i) noexcept {
  std::uint64_t z = key + (i + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return double(z >> 11) * 0x1.0p-53;
}

/// The window of `kernel` (height, width) over images of `dims` (`[N, C, H, W]`); throws
/// `std::invalid_argument` when the dims are not 4, the kernel or stride not positive, the
/// padding negative, or the padded image smaller than the kernel.
window_geometry window_over(std::span<const std::int64_t> dims, std::array<std::int64_t, 2> kernel,
                            std::array<std::int64_t, 2> stride, std::array<std::int64_t, 2> padding);

std::string_view to_string(unary_fn f) noexcept;
std::string_view to_string(op_kind k) noexcept;

/// A tensor in a backend's memory: `dims` batch first, row-major at `data`; `owner`
/// keeps the memory alive (null: borrowed from whoever made the array, who keeps it).
template <class S>
struct basic_array {
  std::vector<std::int64_t> dims;
  S* data = nullptr;
  std::shared_ptr<void> owner;
  /// Its slot on the tape that made it; -1: no gradient is wanted for it.
  int id = -1;

  std::int64_t size() const noexcept {
    std::int64_t n = 1;
    for (auto d : dims) n *= d;
    return n;
  }
  /// The first dimension (1 for a scalar): the rows of the 2-D view.
  std::int64_t rows() const noexcept { return dims.empty() ? 1 : dims[0]; }
  /// The rest: the columns of the 2-D view.
  std::int64_t cols() const noexcept { return rows() ? size() / rows() : 0; }
  bool empty() const noexcept { return data == nullptr; }
  std::string shape_string() const;
};

/// What a backend implements: pointers into its memory and counts, like BLAS. Every
/// call only enqueues on a device (the stream orders them) and runs at once on the CPU.
/// Results are the same on every call with the same inputs (fixed summation orders).
template <class S>
class basic_op_set {
 public:
  virtual ~basic_op_set() = default;
  /// `cpu`, `standin`, `cuda`.
  virtual std::string_view name() const noexcept = 0;
  virtual bool supports(op_kind) const noexcept { return true; }
  /// An array of `dims`, contents undefined.
  virtual basic_array<S> alloc(std::vector<std::int64_t> dims) = 0;
  /// `C = alpha·op(A)·op(B) + beta·C`, row-major (layers/gemm.hpp's contract).
  virtual void gemm(trans ta, trans tb, std::int64_t m, std::int64_t n, std::int64_t k, S alpha, const S* a,
                    std::int64_t lda, const S* b, std::int64_t ldb, S beta, S* c, std::int64_t ldc) = 0;
  /// `C = op(A)·op(B) + 1·biasᵀ`: the product with a bias of `n` elements added to every
  /// row (a backend fuses it where it can; the CPU starts C at the bias and accumulates).
  virtual void gemm_bias(trans ta, trans tb, std::int64_t m, std::int64_t n, std::int64_t k, const S* a,
                         std::int64_t lda, const S* b, std::int64_t ldb, const S* bias, S* c, std::int64_t ldc) = 0;
  /// `y = f(x)`; `alpha` is the leaky slope. y may be x.
  virtual void unary(unary_fn f, const S* x, S* y, std::int64_t n, S alpha) = 0;
  /// `dx = df(x)·dy`, df the derivative of f: sigmoid and tanh read `y` (the output), the others `x`.
  virtual void unary_grad(unary_fn f, const S* x, const S* y, const S* dy, S* dx, std::int64_t n, S alpha) = 0;
  /// `y = f(a, b)` elementwise.
  virtual void binary(binary_fn f, const S* a, const S* b, S* y, std::int64_t n) = 0;
  /// `y[i] = f(x[i], v[i % period])`: a row vector (or a scalar, period 1) over every row.
  virtual void broadcast(binary_fn f, const S* x, const S* v, S* y, std::int64_t n, std::int64_t period) = 0;
  /// `out[c] = beta·out[c] + Σ_r x[r][c]`, the rows added in order.
  virtual void column_sums(const S* x, std::int64_t rows, std::int64_t cols, S* out, S beta) = 0;
  /// `y += alpha·x`.
  virtual void axpy(std::int64_t n, S alpha, const S* x, S* y) = 0;
  virtual void scale(std::int64_t n, S alpha, S* x) = 0;
  virtual void fill(std::int64_t n, S value, S* x) = 0;
  virtual void copy(std::int64_t n, const S* x, S* y) = 0;
  /// `rows` rows of `cols` elements from `x` (rows `ldx` apart) to `y` (rows `ldy` apart).
  virtual void copy2d(std::int64_t rows, std::int64_t cols, const S* x, std::int64_t ldx, S* y, std::int64_t ldy) = 0;
  /// Inverted dropout's mask: `mask[i] = scale` where `counter_uniform(key, i) ≥ p`, else 0.
  virtual void dropout_mask(std::uint64_t key, double p, S scale, S* mask, std::int64_t n) = 0;

  /// Softmax cross-entropy of `rows` rows of `cols` logits against `labels` (class
  /// indices in this set's memory, each in [0, cols): the caller checks them): `probs`
  /// the rows' softmax, shifted by the row's maximum; `loss[r] = log Σ exp(z − max) + max
  /// − z[label]`; `correct[0]` the rows whose first maximum is their label.
  virtual void softmax_xent(const S* logits, const std::int32_t* labels, std::int64_t rows, std::int64_t cols,
                            S* probs, S* loss, S* correct) = 0;
  /// `dlogits = scale·(probs − onehot(label))` per row.
  virtual void softmax_xent_grad(const S* probs, const std::int32_t* labels, std::int64_t rows, std::int64_t cols,
                                 S scale, S* dlogits) = 0;

  /// The optimizers' updates of `n` parameters `w` from their gradients `g`, with their
  /// state (`b`: the momentum buffer, null without momentum; `m`, `v`: Adam's moments).
  virtual void sgd_update(const sgd_update_args& a, S* w, const S* g, S* b, std::int64_t n) = 0;
  virtual void adam_update(const adam_update_args& a, S* w, const S* g, S* m, S* v, std::int64_t n) = 0;
  /// `n` values of this set's memory to the host, and from the host into it, done when
  /// they return (a device waits for its stream): checkpoints, off the loops.
  virtual void read(const S* x, S* host, std::int64_t n) = 0;
  virtual void write(const S* host, S* x, std::int64_t n) = 0;

  /// Normalises each channel of `x` (`g`): with `batch`, the channel's mean and biased
  /// variance are computed (summed in double, in element order) and written to `mean`
  /// and `var`; without, they are read from there (running statistics). Then
  /// `rstd[c] = 1/√(var[c] + eps)` and `xhat = (x − mean[c])·rstd[c]`.
  virtual void normalize(const norm_geometry& g, const S* x, bool batch, S* mean, S* var, double eps, S* xhat,
                         S* rstd) = 0;
  /// The input's gradient of a normalisation with batch statistics, from x̂'s `dxhat`:
  /// `dx = rstd[c]·(dxhat − mean_c(dxhat) − xhat·mean_c(dxhat·xhat))`, the means summed
  /// in double.
  virtual void normalize_grad(const norm_geometry& g, const S* xhat, const S* rstd, const S* dxhat, S* dx) = 0;
  /// `y = x·scale[c] + shift[c]` per channel (`shift` null: none). y may be x.
  virtual void channel_affine(const norm_geometry& g, const S* x, const S* scale, const S* shift, S* y) = 0;
  /// `out[c] += Σ x·z` over each channel's values (`z` null: `Σ x`), summed in double.
  virtual void channel_sums(const norm_geometry& g, const S* x, const S* z, S* out) = 0;

  /// Convolution (cross-correlation) of the images `x` (`g`) with `w`
  /// (`[out_channels, channels, kernel_h, kernel_w]`) plus `bias` (`[out_channels]`, or
  /// null): `y` is `[batch, out_channels, out_h, out_w]`.
  virtual void conv2d(const window_geometry& g, std::int64_t out_channels, const S* x, const S* w, const S* bias,
                      S* y) = 0;
  /// The input's gradient (overwritten) from the output's, `dy`.
  virtual void conv2d_grad_input(const window_geometry& g, std::int64_t out_channels, const S* w, const S* dy,
                                 S* dx) = 0;
  /// The filter's gradient added into `dw`, and the bias's into `dbias` (null: none).
  virtual void conv2d_grad_weight(const window_geometry& g, std::int64_t out_channels, const S* x, const S* dy,
                                  S* dw, S* dbias) = 0;
  /// Pooling of `x` (`g`; stride and padding as given): `y` is `[batch, channels, out_h,
  /// out_w]`. A max window takes its first maximum (a NaN wins: PyTorch's rule) and
  /// ignores the padding.
  virtual void pool2d(pool_fn f, const window_geometry& g, const S* x, S* y) = 0;
  /// The input's gradient (overwritten) from `dy`. Max reads `x` to find each window's
  /// maximum again (as cuDNN's backward does), so nothing but the input is kept.
  virtual void pool2d_grad(pool_fn f, const window_geometry& g, const S* x, const S* dy, S* dx) = 0;

  /// `y[t] = table[ids[t]]`: row `ids[t]` of a `rows × cols` table for each of `n` ids
  /// (`nn.Embedding`'s lookup). The ids are values of S that must be integers in
  /// [0, rows): the caller checks them (`find_bad_id`); for any other a device writes a
  /// zero row, never reading outside the table.
  virtual void gather_rows(const S* table, std::int64_t rows, std::int64_t cols, const S* ids, std::int64_t n,
                           S* y) = 0;
  /// The gather's derivative, added into the table's gradient: `table[ids[t]] += dy[t]`
  /// for t = 0, 1, …, n − 1, each row's additions in that order on every backend (no
  /// atomics: the same bits every run). Ids outside [0, rows) add nothing.
  virtual void scatter_add_rows(const S* dy, const S* ids, std::int64_t n, std::int64_t rows, std::int64_t cols,
                                S* table) = 0;
  /// The first of `n` ids that is not an integer in [0, rows), once the work before it
  /// is done. A set that would stall its queue to read them back (CUDA) returns none and
  /// relies on the gather's guard.
  virtual bad_id find_bad_id(const S* ids, std::int64_t n, std::int64_t rows) = 0;
  /// Images `x` (`g`: a window whose stride is its kernel, the patch, with no padding and
  /// H, W multiples of it) as patches `y`, `[N, out_h·out_w, C·kernel_h·kernel_w]`:
  /// patches in row-major order, a patch's values by channel, then row-major (the order
  /// of a Conv2d filter's `[C, kh, kw]`). A permutation: every pixel in one patch.
  virtual void patchify(const window_geometry& g, const S* x, S* y) = 0;
  /// Its inverse, which is also its derivative: patches `y` back into images `x` (overwritten).
  virtual void unpatchify(const window_geometry& g, const S* y, S* x) = 0;
  /// `batch` products `C_i = alpha·op(A_i)·op(B_i) + beta·C_i` with `X_i = X + i·stride_x`
  /// (a stride of 0 shares one operand), each `gemm`'s contract; the C_i must not overlap.
  virtual void gemm_batched(trans ta, trans tb, std::int64_t m, std::int64_t n, std::int64_t k, S alpha,
                            const S* a, std::int64_t lda, std::int64_t stride_a, const S* b, std::int64_t ldb,
                            std::int64_t stride_b, S beta, S* c, std::int64_t ldc, std::int64_t stride_c,
                            std::int64_t batch) = 0;
  /// The softmax of each of `rows` rows of `cols` values, columns past the row's
  /// `mask.last_visible` taken as −∞: the row's visible maximum subtracted, the
  /// exponentials summed in double in column order. A row with no visible column is zeros.
  virtual void softmax_rows(const S* x, S* y, std::int64_t rows, std::int64_t cols, const causal_mask& mask) = 0;
  /// Its derivative from the output `y`: `dx = y·(dy − Σ_c dy·y)` per row, the sum in
  /// double in column order (a masked column has y = 0, so its dx is 0).
  virtual void softmax_rows_grad(const S* y, const S* dy, S* dx, std::int64_t rows, std::int64_t cols) = 0;
  /// `[B, T, parts, H, D]` → `[parts, B, H, T, D]` (`g`): every part's heads apart.
  virtual void split_heads(const head_geometry& g, const S* x, S* y) = 0;
  /// The inverse permutation, `[parts, B, H, T, D]` → `[B, T, parts, H, D]`: the heads of
  /// each token side by side again (and `split_heads`' derivative, as it is this one's).
  virtual void merge_heads(const head_geometry& g, const S* y, S* x) = 0;
};

/// The CPU's op set: Eigen, and the product engine of layers/gemm.hpp.
template <class S>
basic_op_set<S>& cpu_op_set();

/// What a forward recorded for backward: each op's derivative, in order.
template <class S>
class basic_tape {
 public:
  using array = basic_array<S>;
  /// How an op hands its inputs' gradients back (`ops` is the op set's, `dy` its output's).
  using backward_fn = std::function<void(basic_tape&, const array& dy)>;

  /// A new slot for an input or a parameter whose gradient is wanted.
  int leaf();
  /// Records an op whose output is a new slot (returned); `back` runs in backward when
  /// the output got a gradient.
  int record(backward_fn back);
  /// Adds `g` to slot `id`'s gradient. `owned`: `g` is fresh memory the tape may add to;
  /// otherwise (a gradient passed through, such as `add`'s) it is copied before anything
  /// is added to it.
  void accumulate(int id, array g, bool owned);
  /// Runs the ops' derivatives backward from slot `out` with gradient `dy` (borrowed).
  /// Once only.
  void backward(int out, const array& dy);
  bool done() const noexcept { return done_; }
  /// Slot `id`'s gradient after backward (empty: none reached it); `owned` as given.
  array& grad(int id) { return slots_.at(std::size_t(id)).grad; }
  bool owned(int id) const { return slots_.at(std::size_t(id)).owned; }
  basic_op_set<S>& set() noexcept { return *set_; }

  explicit basic_tape(basic_op_set<S>& set) : set_(&set) {}

 private:
  struct slot {
    array grad;
    bool owned = false;
    backward_fn back;  // empty for a leaf
  };
  basic_op_set<S>* set_;
  std::vector<slot> slots_;
  bool done_ = false;
};

/// The ops a layer is written with: arrays in, arrays out, on one op set, recorded on a
/// tape when one is given and an input wants a gradient.
template <class S>
class basic_ops {
 public:
  using array = basic_array<S>;
  /// `train`: a training forward (dropout draws a mask; evaluation passes through).
  explicit basic_ops(basic_op_set<S>& set, basic_tape<S>* tape = nullptr, bool train = false)
      : set_(set), tape_(tape), train_(train) {}
  basic_op_set<S>& set() noexcept { return set_; }
  basic_tape<S>* tape() noexcept { return tape_; }
  bool training() const noexcept { return train_; }

  array empty(std::vector<std::int64_t> dims) { return set_.alloc(std::move(dims)); }
  array zeros(std::vector<std::int64_t> dims);
  /// A deep copy (no gradient link).
  array clone(const array& x);

  array add(const array& a, const array& b) { return binary(binary_fn::add, a, b); }
  array sub(const array& a, const array& b) { return binary(binary_fn::sub, a, b); }
  array mul(const array& a, const array& b) { return binary(binary_fn::mul, a, b); }
  /// `x[r][c] + v[c]` over every row `r` of x's 2-D view; `v` has `cols` elements, or one.
  array add_row(const array& x, const array& v) { return broadcast(binary_fn::add, x, v); }
  /// `x[r][c] · v[c]`, as `add_row`.
  array mul_row(const array& x, const array& v) { return broadcast(binary_fn::mul, x, v); }
  /// `alpha · x`.
  array scale(const array& x, S alpha);
  array unary(unary_fn f, const array& x, S alpha = S(0.01));
  array relu(const array& x) { return unary(unary_fn::relu, x); }
  array sigmoid(const array& x) { return unary(unary_fn::sigmoid, x); }
  array tanh(const array& x) { return unary(unary_fn::tanh, x); }
  array gelu(const array& x) { return unary(unary_fn::gelu, x); }
  /// `op(a)·op(b)` over the 2-D views (rows × cols): `[m, n]`.
  array matmul(const array& a, const array& b, trans ta = trans::no, trans tb = trans::no);
  /// `x·wᵀ + b`, PyTorch's `Linear` (`w` is `[out, in]`, `b` `[out]` or empty); one
  /// product with the bias fused.
  array linear(const array& x, const array& w, const array& b);
  /// Convolution of `x` (`[N, C, H, W]`) with `w` (`[K, C, kh, kw]`) plus `b` (`[K]` or
  /// empty), stride and padding as (height, width): `[N, K, OH, OW]`.
  array conv2d(const array& x, const array& w, const array& b, std::array<std::int64_t, 2> stride,
               std::array<std::int64_t, 2> padding);
  /// Pooling of `x` (`[N, C, H, W]`) with a square window.
  array pool2d(pool_fn f, const array& x, std::int64_t kernel, std::int64_t stride, std::int64_t padding);
  /// The sums of x's columns over its rows: `[cols]`.
  array sum_rows(const array& x);
  /// The same memory under other dims (the same number of elements).
  array reshape(const array& x, std::vector<std::int64_t> dims);
  /// The inputs side by side along their columns (the 2-D views, the same rows):
  /// `torch.cat(dim=1)` of flattened samples; `dims` is the result's.
  array concat_cols(std::span<const array> in, std::vector<std::int64_t> dims);
  /// Rows `ids` of `table` (`[rows, cols]`): `ids.dims` followed by `cols`. The ids get
  /// no gradient (they are indices); the table's is the rows' scatter-add. Checking the
  /// ids is the caller's (`basic_op_set::find_bad_id`).
  array gather_rows(const array& table, const array& ids);
  /// The patches of images `x` (`[N, C, H, W]`, H and W multiples of `patch`):
  /// `[N, (H/patch)·(W/patch), C·patch²]` (`basic_op_set::patchify`'s order).
  array patchify(const array& x, std::int64_t patch);
  /// Columns [first, first + count) of x's 2-D view, under `dims` (rows·count elements);
  /// the gradient goes back into those columns, zeros elsewhere.
  array slice_cols(const array& x, std::int64_t first, std::int64_t count, std::vector<std::int64_t> dims);

  /// `alpha·op(a_i)·op(b_i)` for each matrix `i` of the batch: `a` and `b` are `[…, r,
  /// c]` with the same leading dimensions (their product the batch); the result is
  /// `[…, m, n]` (`torch.matmul` of 3-D and higher tensors).
  array batched_matmul(const array& a, const array& b, trans ta = trans::no, trans tb = trans::no, S alpha = S(1));
  /// The softmax over the last dimension, numerically stable; `causal`: in each `[T,
  /// T']` block of the last two dimensions, row `i` sees the columns `≤ i + offset` (a
  /// row that sees none is zeros, never NaN).
  array softmax(const array& x, bool causal = false, std::int64_t offset = 0);
  /// `x` (`[B, T, parts·heads·D]`) as `[parts, B, heads, T, D]`: a fused qkv projection's
  /// output (parts 3) split into per-head q, k and v (`part` takes each).
  array split_heads(const array& x, std::int64_t heads, std::int64_t parts);
  /// `x` (`[parts, B, heads, T, D]`, or `[B, heads, T, D]` for one part) as `[B, T,
  /// parts·heads·D]`: the heads side by side again.
  array merge_heads(const array& x);
  /// Entry `i` of `x`'s first dimension, `x.dims` without it: a view of the same memory.
  array part(const array& x, std::int64_t i);

 private:
  array binary(binary_fn f, const array& a, const array& b);
  array broadcast(binary_fn f, const array& x, const array& v);
  bool recording(std::initializer_list<const array*> in) const noexcept;
  basic_op_set<S>& set_;
  basic_tape<S>* tape_;
  bool train_;
};

/// A layer written once with ops: it runs on the CPU through `basic_layer`'s calls (the
/// CPU's op set) and on any backend that runs op layers (gpu's device backend) with the
/// same `compute`. Parameters are the layer's host tensors (`parameters()`), then its
/// buffers (`buffers()`, BatchNorm's running statistics); a backend passes them as
/// arrays in that order, mirrored where it keeps them. `compute` may change a buffer
/// (in training); only parameters get gradients.
template <class S>
class basic_op_layer : public basic_layer<S> {
 public:
  using array = basic_array<S>;
  using typename basic_layer<S>::tensor_type;
  using typename basic_layer<S>::stash_type;
  using typename basic_layer<S>::forward_result;

  /// Forward, written once: `inputs` and `params` (`parameters()`, then `buffers()`) are
  /// arrays on `o`'s backend. Without a hand-written backward the tape records the ops in
  /// training; with one, `keep` gets what `backward` needs.
  virtual array compute(basic_ops<S>& o, std::span<const array> inputs, std::span<const array> params,
                        std::vector<array>& keep, const forward_context& context) = 0;
  basic_op_layer<S>* as_op_layer() noexcept final { return this; }
  /// True when `grad_input` and `grad_weight` are written by hand (else the tape
  /// derives them).
  virtual bool custom_backward() const noexcept { return false; }
  /// Hand-written B: the wanted inputs' gradients (others left empty, fresh memory),
  /// from `keep` as `compute` left it and the output gradient `dy` (read only).
  virtual std::vector<array> grad_input(basic_ops<S>& o, std::span<const array> keep, std::span<const array> params,
                                        const array& dy, input_mask wanted) {
    (void)o, (void)keep, (void)params, (void)dy, (void)wanted;
    return {};
  }
  /// Hand-written W: this micro-batch's parameter gradients added into `grads` (in
  /// `parameters()` order; `params` as `compute` had them).
  virtual void grad_weight(basic_ops<S>& o, std::span<const array> keep, std::span<const array> params,
                           const array& dy, std::span<const array> grads) {
    (void)o, (void)keep, (void)params, (void)dy, (void)grads;
  }

 protected:
  using basic_layer<S>::basic_layer;
  forward_result do_forward(std::vector<tensor_type>& inputs, const forward_context& context) override;
  std::vector<tensor_type> do_backward_input(const stash_type& saved, const tensor_type& dy,
                                             input_mask wanted) override;
  void do_backward_weight(const stash_type& saved, const tensor_type& dy) override;
};

/// One micro-batch of an op layer between forward and backward, on any op set: runs
/// `compute` (recording in training), then backward as B (input gradients, wanted ones)
/// and W (parameter gradients added to `grads`). What the CPU's `basic_op_layer` calls
/// and what a device backend's kernels keep per micro-batch.
template <class S>
class basic_op_run {
 public:
  using array = basic_array<S>;
  /// Forward of `l` on `set` with `inputs`, `params` (the parameters, then the buffers:
  /// `parameters` of them are parameters); records when `train`.
  basic_op_run(basic_op_layer<S>& l, basic_op_set<S>& set, std::vector<array> inputs, std::vector<array> params,
               std::size_t parameters, bool train, const forward_context& context);
  /// The output; the caller may move it out (the run keeps its dims and tape slot).
  array& output() noexcept { return out_; }
  /// B: the wanted inputs' gradients (fresh memory, empty where not wanted).
  std::vector<array> backward_input(const array& dy, input_mask wanted);
  /// W: this micro-batch's parameter gradients added into `grads` (in `parameters()`
  /// order, on the same op set). From the tape, B and W share one pass: the first of
  /// them runs it and keeps the other's results.
  void backward_weight(const array& dy, std::span<const array> grads);
  /// Bytes held for backward (the arrays kept or recorded, as far as they are known).
  std::size_t kept_bytes() const noexcept { return kept_bytes_; }

 private:
  void run_tape(const array& dy);
  basic_op_layer<S>& layer_;
  basic_op_set<S>& set_;
  std::vector<array> inputs_, params_, keep_;
  std::size_t parameters_;  // params_' leading parameters (the rest: buffers)
  std::vector<std::vector<std::int64_t>> in_dims_;
  array out_;
  int out_id_ = -1;
  std::vector<std::int64_t> out_dims_;
  std::unique_ptr<basic_tape<S>> tape_;
  std::vector<array> in_grads_, param_grads_;
  bool ran_ = false;
  std::size_t kept_bytes_ = 0;
};

using array = basic_array<float>;
using ops = basic_ops<float>;
using op_layer = basic_op_layer<float>;
using op_set = basic_op_set<float>;

}  // namespace nerve::layers

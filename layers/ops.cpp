// The tape and the ops' derivatives (one micro-batch of an op layer: op_run.cpp; the CPU's
// op set: cpu_ops.cpp).
#include "layers/ops.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "layers/detail/ops_require.hpp"
#include "layers/detail/vector_state.hpp"

namespace nerve::layers {

std::string_view to_string(unary_fn f) noexcept {
  switch (f) {
    case unary_fn::relu: return "relu";
    case unary_fn::leaky_relu: return "leaky_relu";
    case unary_fn::sigmoid: return "sigmoid";
    case unary_fn::tanh: return "tanh";
    case unary_fn::gelu: return "gelu";
  }
  return "?";
}

std::string_view to_string(op_kind k) noexcept {
  static constexpr std::string_view names[op_kinds] = {
      "gemm", "gemm_bias", "unary",  "unary_grad", "binary", "broadcast",   "column_sums", "axpy",
      "scale", "fill",    "copy",   "copy2d",     "conv2d", "pool2d",      "dropout_mask", "norm",
      "optimizer", "host_copy", "softmax_xent", "gather_rows", "patchify", "gemm_batched", "softmax_rows", "heads"};
  return std::size_t(k) < op_kinds ? names[std::size_t(k)] : "?";
}

window_geometry window_over(std::span<const std::int64_t> dims, std::array<std::int64_t, 2> kernel,
                            std::array<std::int64_t, 2> stride, std::array<std::int64_t, 2> padding) {
  auto text = [&] {
    std::string t = "[";
    for (std::size_t i = 0; i < dims.size(); ++i) t += (i ? ", " : "") + std::to_string(dims[i]);
    return t + "]";
  };
  if (dims.size() != 4) throw std::invalid_argument("ops: a window over " + text() + ", not [N, C, H, W]");
  if (kernel[0] <= 0 || kernel[1] <= 0 || stride[0] <= 0 || stride[1] <= 0 || padding[0] < 0 || padding[1] < 0)
    throw std::invalid_argument("ops: a window needs a positive kernel and stride and no negative padding");
  window_geometry g{dims[0], dims[1], dims[2], dims[3], kernel[0], kernel[1],
                    stride[0], stride[1], padding[0], padding[1]};
  if (g.height + 2 * g.pad_h < g.kernel_h || g.width + 2 * g.pad_w < g.kernel_w)
    throw std::invalid_argument("ops: a " + std::to_string(g.kernel_h) + "×" + std::to_string(g.kernel_w) +
                                " window over images of " + text() + " with padding " + std::to_string(g.pad_h) +
                                "×" + std::to_string(g.pad_w));
  return g;
}

template <class S>
std::string basic_array<S>::shape_string() const {
  std::string s = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

// ---- the tape ---------------------------------------------------------------------

template <class S>
int basic_tape<S>::leaf() {
  slots_.emplace_back();
  return int(slots_.size() - 1);
}

template <class S>
int basic_tape<S>::record(backward_fn back) {
  slots_.push_back(slot{{}, false, std::move(back)});
  return int(slots_.size() - 1);
}

template <class S>
void basic_tape<S>::accumulate(int id, array g, bool owned) {
  if (id < 0) return;
  auto& s = slots_.at(std::size_t(id));
  if (s.grad.empty()) {
    s.grad = std::move(g);
    s.owned = owned;
    return;
  }
  if (!s.owned) {  // a borrowed gradient is never written: add into a copy of it
    auto c = set_->alloc(s.grad.dims);
    set_->copy(c.size(), s.grad.data, c.data);
    s.grad = std::move(c);
    s.owned = true;
  }
  detail::ops_require(g.size() == s.grad.size(), "a gradient of " + g.shape_string() + " for " + s.grad.shape_string());
  set_->axpy(s.grad.size(), S(1), g.data, s.grad.data);
}

template <class S>
void basic_tape<S>::backward(int out, const array& dy) {
  if (done_) throw std::logic_error("tape: backward ran twice");
  done_ = true;
  if (out < 0) return;
  accumulate(out, dy, false);  // borrowed: the caller's
  for (int i = out; i >= 0; --i) {
    auto& s = slots_[std::size_t(i)];
    if (!s.back || s.grad.empty()) continue;
    const array g = s.grad;  // the op's output gradient, complete: every consumer came later
    detail::enter_user_code();  // a user's layer may record derivatives of its own
    s.back(*this, g);
    if (s.owned) s.grad = {};  // an intermediate's gradient is not needed again
  }
}

// ---- ops and their derivatives -------------------------------------------------------

template <class S>
bool basic_ops<S>::recording(std::initializer_list<const array*> in) const noexcept {
  if (!tape_) return false;
  for (auto* a : in)
    if (a->id >= 0) return true;
  return false;
}

template <class S>
auto basic_ops<S>::zeros(std::vector<std::int64_t> dims) -> array {
  auto a = set_.alloc(std::move(dims));
  set_.fill(a.size(), S(0), a.data);
  return a;
}

template <class S>
auto basic_ops<S>::clone(const array& x) -> array {
  auto a = set_.alloc(x.dims);
  set_.copy(x.size(), x.data, a.data);
  return a;
}

template <class S>
auto basic_ops<S>::binary(binary_fn f, const array& a, const array& b) -> array {
  detail::ops_require(a.size() == b.size(), std::string(f == binary_fn::mul ? "mul" : f == binary_fn::add ? "add" : "sub") +
                                       " of " + a.shape_string() + " and " + b.shape_string());
  auto y = set_.alloc(a.dims);
  set_.binary(f, a.data, b.data, y.data, y.size());
  if (recording({&a, &b})) {
    y.id = tape_->record([f, a, b](basic_tape<S>& t, const array& dy) {
      auto& set = t.set();
      if (f == binary_fn::mul) {
        if (a.id >= 0) {
          auto g = set.alloc(a.dims);
          set.binary(binary_fn::mul, dy.data, b.data, g.data, g.size());
          t.accumulate(a.id, std::move(g), true);
        }
        if (b.id >= 0) {
          auto g = set.alloc(b.dims);
          set.binary(binary_fn::mul, dy.data, a.data, g.data, g.size());
          t.accumulate(b.id, std::move(g), true);
        }
        return;
      }
      auto as = [](const array& g, const std::vector<std::int64_t>& dims) {
        array r = g;
        r.dims = dims;
        r.id = -1;
        return r;
      };
      t.accumulate(a.id, as(dy, a.dims), false);
      if (b.id < 0) return;
      if (f == binary_fn::add) return t.accumulate(b.id, as(dy, b.dims), false);
      auto g = set.alloc(b.dims);  // sub: −dy
      set.copy(g.size(), dy.data, g.data);
      set.scale(g.size(), S(-1), g.data);
      t.accumulate(b.id, std::move(g), true);
    });
  }
  return y;
}

template <class S>
auto basic_ops<S>::broadcast(binary_fn f, const array& x, const array& v) -> array {
  const std::int64_t period = v.size();
  detail::ops_require(period > 0 && x.size() % period == 0 && (period == 1 || period == x.cols()),
             "a row vector of " + v.shape_string() + " over " + x.shape_string() + " (it needs " +
                 std::to_string(x.cols()) + " elements or 1)");
  auto y = set_.alloc(x.dims);
  set_.broadcast(f, x.data, v.data, y.data, y.size(), period);
  if (recording({&x, &v})) {
    y.id = tape_->record([f, x, v, period](basic_tape<S>& t, const array& dy) {
      auto& set = t.set();
      const std::int64_t rows = dy.size() / period;
      if (f == binary_fn::mul) {
        if (x.id >= 0) {
          auto g = set.alloc(x.dims);
          set.broadcast(binary_fn::mul, dy.data, v.data, g.data, g.size(), period);
          t.accumulate(x.id, std::move(g), true);
        }
        if (v.id >= 0) {
          auto p = set.alloc(x.dims);
          set.binary(binary_fn::mul, dy.data, x.data, p.data, p.size());
          auto g = set.alloc(v.dims);
          set.column_sums(p.data, rows, period, g.data, S(0));
          t.accumulate(v.id, std::move(g), true);
        }
        return;
      }
      if (x.id >= 0) {
        array g = dy;
        g.dims = x.dims;
        t.accumulate(x.id, std::move(g), false);
      }
      if (v.id >= 0) {
        auto g = set.alloc(v.dims);
        set.column_sums(dy.data, rows, period, g.data, S(0));
        if (f == binary_fn::sub) set.scale(g.size(), S(-1), g.data);
        t.accumulate(v.id, std::move(g), true);
      }
    });
  }
  return y;
}

template <class S>
auto basic_ops<S>::scale(const array& x, S alpha) -> array {
  auto y = clone(x);
  set_.scale(y.size(), alpha, y.data);
  if (recording({&x})) {
    y.id = tape_->record([x, alpha](basic_tape<S>& t, const array& dy) {
      auto g = t.set().alloc(x.dims);
      t.set().copy(g.size(), dy.data, g.data);
      t.set().scale(g.size(), alpha, g.data);
      t.accumulate(x.id, std::move(g), true);
    });
  }
  return y;
}

template <class S>
auto basic_ops<S>::unary(unary_fn f, const array& x, S alpha) -> array {
  auto y = set_.alloc(x.dims);
  set_.unary(f, x.data, y.data, y.size(), alpha);
  if (recording({&x})) {
    array out;  // sigmoid and tanh differentiate through their output; the others hold none
    if (f == unary_fn::sigmoid || f == unary_fn::tanh) out = y;
    out.id = -1;
    y.id = tape_->record([f, x, out, alpha](basic_tape<S>& t, const array& dy) {
      auto g = t.set().alloc(x.dims);
      t.set().unary_grad(f, x.data, out.data, dy.data, g.data, g.size(), alpha);
      t.accumulate(x.id, std::move(g), true);
    });
  }
  return y;
}

template <class S>
auto basic_ops<S>::matmul(const array& a, const array& b, trans ta, trans tb) -> array {
  const bool at = ta == trans::yes, bt = tb == trans::yes;
  const std::int64_t m = at ? a.cols() : a.rows(), k = at ? a.rows() : a.cols();
  const std::int64_t kb = bt ? b.cols() : b.rows(), n = bt ? b.rows() : b.cols();
  detail::ops_require(k == kb, "matmul of " + a.shape_string() + (at ? "ᵀ" : "") + " and " + b.shape_string() +
                          (bt ? "ᵀ" : "") + ": inner dimensions " + std::to_string(k) + " and " + std::to_string(kb));
  auto c = set_.alloc({m, n});
  set_.gemm(ta, tb, m, n, k, S(1), a.data, a.cols(), b.data, b.cols(), S(0), c.data, n);
  if (recording({&a, &b})) {
    c.id = tape_->record([a, b, at, bt, m, n, k](basic_tape<S>& t, const array& dc) {
      auto& set = t.set();
      // C = op(A)·op(B): d op(A) = dC·op(B)ᵀ, d op(B) = op(A)ᵀ·dC, transposed back
      // where the operand was used transposed.
      if (a.id >= 0) {
        auto g = set.alloc(a.dims);
        if (!at)  // dA (m×k) = dC·op(B)ᵀ
          set.gemm(trans::no, bt ? trans::no : trans::yes, m, k, n, S(1), dc.data, n, b.data, b.cols(), S(0),
                   g.data, k);
        else  // dA (k×m) = op(B)·dCᵀ
          set.gemm(bt ? trans::yes : trans::no, trans::yes, k, m, n, S(1), b.data, b.cols(), dc.data, n, S(0),
                   g.data, m);
        t.accumulate(a.id, std::move(g), true);
      }
      if (b.id >= 0) {
        auto g = set.alloc(b.dims);
        if (!bt)  // dB (k×n) = op(A)ᵀ·dC
          set.gemm(at ? trans::no : trans::yes, trans::no, k, n, m, S(1), a.data, a.cols(), dc.data, n, S(0),
                   g.data, n);
        else  // dB (n×k) = dCᵀ·op(A)
          set.gemm(trans::yes, at ? trans::yes : trans::no, n, k, m, S(1), dc.data, n, a.data, a.cols(), S(0),
                   g.data, k);
        t.accumulate(b.id, std::move(g), true);
      }
    });
  }
  return c;
}

template <class S>
auto basic_ops<S>::linear(const array& x, const array& w, const array& b) -> array {
  if (b.empty()) return matmul(x, w, trans::no, trans::yes);
  const std::int64_t n = x.rows(), in = x.cols(), out = w.rows();
  detail::ops_require(w.cols() == in && b.size() == out, "linear of " + x.shape_string() + " with a weight of " +
                                                    w.shape_string() + " and a bias of " + b.shape_string());
  auto y = set_.alloc({n, out});
  set_.gemm_bias(trans::no, trans::yes, n, out, in, x.data, in, w.data, in, b.data, y.data, out);
  if (recording({&x, &w, &b})) {
    y.id = tape_->record([x, w, b, n, in, out](basic_tape<S>& t, const array& dy) {
      auto& set = t.set();
      if (x.id >= 0) {  // dx = dy·W
        auto g = set.alloc(x.dims);
        set.gemm(trans::no, trans::no, n, in, out, S(1), dy.data, out, w.data, in, S(0), g.data, in);
        t.accumulate(x.id, std::move(g), true);
      }
      if (w.id >= 0) {  // dW = dyᵀ·x
        auto g = set.alloc(w.dims);
        set.gemm(trans::yes, trans::no, out, in, n, S(1), dy.data, out, x.data, in, S(0), g.data, in);
        t.accumulate(w.id, std::move(g), true);
      }
      if (b.id >= 0) {  // db = Σ dy over the rows
        auto g = set.alloc(b.dims);
        set.column_sums(dy.data, n, out, g.data, S(0));
        t.accumulate(b.id, std::move(g), true);
      }
    });
  }
  return y;
}

template <class S>
auto basic_ops<S>::conv2d(const array& x, const array& w, const array& b, std::array<std::int64_t, 2> stride,
                          std::array<std::int64_t, 2> padding) -> array {
  detail::ops_require(w.dims.size() == 4 && x.dims.size() == 4 && w.dims[1] == x.dims[1] &&
                 (b.empty() || b.size() == w.dims[0]),
             "conv2d of " + x.shape_string() + " with a filter of " + w.shape_string() + " and a bias of " +
                 b.shape_string() + " (it needs [N, C, H, W], [K, C, kh, kw] and [K] or none)");
  const auto g = window_over(x.dims, {w.dims[2], w.dims[3]}, stride, padding);
  const std::int64_t k = w.dims[0];
  auto y = set_.alloc({g.batch, k, g.out_h(), g.out_w()});
  set_.conv2d(g, k, x.data, w.data, b.empty() ? nullptr : b.data, y.data);
  if (recording({&x, &w, &b})) {
    y.id = tape_->record([x, w, b, g, k](basic_tape<S>& t, const array& dy) {
      auto& set = t.set();
      if (x.id >= 0) {
        auto gx = set.alloc(x.dims);
        set.conv2d_grad_input(g, k, w.data, dy.data, gx.data);
        t.accumulate(x.id, std::move(gx), true);
      }
      if (w.id < 0 && b.id < 0) return;
      auto gw = set.alloc(w.dims);
      set.fill(gw.size(), S(0), gw.data);
      array gb;
      if (!b.empty()) {
        gb = set.alloc(b.dims);
        set.fill(gb.size(), S(0), gb.data);
      }
      set.conv2d_grad_weight(g, k, x.data, dy.data, gw.data, gb.empty() ? nullptr : gb.data);
      if (w.id >= 0) t.accumulate(w.id, std::move(gw), true);
      if (b.id >= 0) t.accumulate(b.id, std::move(gb), true);
    });
  }
  return y;
}

template <class S>
auto basic_ops<S>::pool2d(pool_fn f, const array& x, std::int64_t kernel, std::int64_t stride, std::int64_t padding)
    -> array {
  detail::ops_require(2 * padding <= kernel, "pool2d: padding " + std::to_string(padding) + " over half the kernel " +
                                        std::to_string(kernel));
  const auto g = window_over(x.dims, {kernel, kernel}, {stride, stride}, {padding, padding});
  auto y = set_.alloc({g.batch, g.channels, g.out_h(), g.out_w()});
  set_.pool2d(f, g, x.data, y.data);
  if (recording({&x})) {
    array in = x;  // the average's gradient needs only the shape
    if (f == pool_fn::average) in.data = nullptr, in.owner = nullptr;
    y.id = tape_->record([f, in, g](basic_tape<S>& t, const array& dy) {
      auto gx = t.set().alloc(in.dims);
      t.set().pool2d_grad(f, g, in.data, dy.data, gx.data);
      t.accumulate(in.id, std::move(gx), true);
    });
  }
  return y;
}

template <class S>
auto basic_ops<S>::sum_rows(const array& x) -> array {
  auto y = set_.alloc({x.cols()});
  set_.column_sums(x.data, x.rows(), x.cols(), y.data, S(0));
  if (recording({&x})) {
    y.id = tape_->record([x](basic_tape<S>& t, const array& dy) {
      auto g = t.set().alloc(x.dims);
      t.set().fill(g.size(), S(0), g.data);
      t.set().broadcast(binary_fn::add, g.data, dy.data, g.data, g.size(), dy.size());
      t.accumulate(x.id, std::move(g), true);
    });
  }
  return y;
}

template <class S>
auto basic_ops<S>::reshape(const array& x, std::vector<std::int64_t> dims) -> array {
  array y = x;
  y.dims = std::move(dims);
  detail::ops_require(y.size() == x.size(), "reshape of " + x.shape_string() + " to " + y.shape_string());
  if (recording({&x})) {
    y.id = tape_->record([x](basic_tape<S>& t, const array& dy) {
      array g = dy;
      g.dims = x.dims;
      t.accumulate(x.id, std::move(g), false);
    });
  } else {
    y.id = -1;
  }
  return y;
}

template <class S>
auto basic_ops<S>::concat_cols(std::span<const array> in, std::vector<std::int64_t> dims) -> array {
  const std::int64_t rows = in.empty() ? 0 : in[0].rows();
  std::int64_t cols = 0;
  for (const auto& a : in) {
    detail::ops_require(a.rows() == rows, "concat of " + in[0].shape_string() + " and " + a.shape_string() + ": rows differ");
    cols += a.cols();
  }
  auto y = set_.alloc(std::move(dims));
  detail::ops_require(y.size() == rows * cols, "concat to " + y.shape_string() + " of " + std::to_string(rows * cols) +
                                          " elements");
  std::int64_t at = 0;
  for (const auto& a : in) {
    set_.copy2d(rows, a.cols(), a.data, a.cols(), y.data + at, cols);
    at += a.cols();
  }
  std::vector<array> parts;  // the inputs' shapes and slots: backward needs no data
  bool any = false;
  for (const auto& a : in) {
    parts.push_back({a.dims, nullptr, nullptr, a.id});
    any = any || a.id >= 0;
  }
  if (tape_ && any) {
    y.id = tape_->record([parts, rows, cols](basic_tape<S>& t, const array& dy) {
      std::int64_t first = 0;  // the input's first column in the output
      for (const auto& a : parts) {
        if (a.id >= 0) {
          auto g = t.set().alloc(a.dims);
          t.set().copy2d(rows, a.cols(), dy.data + first, cols, g.data, a.cols());
          t.accumulate(a.id, std::move(g), true);
        }
        first += a.cols();
      }
    });
  }
  return y;
}

// ---- attention's ops: batched products, the row softmax, the head permutations --------

namespace {

std::int64_t product(const std::vector<std::int64_t>& dims, std::size_t from, std::size_t to) {
  std::int64_t n = 1;
  for (std::size_t i = from; i < to; ++i) n *= dims[i];
  return n;
}

}  // namespace

template <class S>
auto basic_ops<S>::batched_matmul(const array& a, const array& b, trans ta, trans tb, S alpha) -> array {
  const std::size_t ra = a.dims.size(), rb = b.dims.size();
  const bool at = ta == trans::yes, bt = tb == trans::yes;
  detail::ops_require(ra >= 2 && ra == rb && std::equal(a.dims.begin(), a.dims.end() - 2, b.dims.begin()),
                      "batched matmul of " + a.shape_string() + " and " + b.shape_string() +
                          ": they need the same leading dimensions and two more");
  const std::int64_t batch = product(a.dims, 0, ra - 2);
  const std::int64_t ar = a.dims[ra - 2], ac = a.dims[ra - 1], br = b.dims[rb - 2], bc = b.dims[rb - 1];
  const std::int64_t m = at ? ac : ar, k = at ? ar : ac, kb = bt ? bc : br, n = bt ? br : bc;
  detail::ops_require(k == kb, "batched matmul of " + a.shape_string() + (at ? "ᵀ" : "") + " and " +
                                   b.shape_string() + (bt ? "ᵀ" : "") + ": inner dimensions " + std::to_string(k) +
                                   " and " + std::to_string(kb));
  std::vector<std::int64_t> dims(a.dims.begin(), a.dims.end() - 2);
  dims.push_back(m);
  dims.push_back(n);
  auto c = set_.alloc(std::move(dims));
  set_.gemm_batched(ta, tb, m, n, k, alpha, a.data, ac, ar * ac, b.data, bc, br * bc, S(0), c.data, n, m * n,
                    batch);
  if (recording({&a, &b})) {
    c.id = tape_->record([a, b, at, bt, m, n, k, ar, ac, br, bc, batch, alpha](basic_tape<S>& t, const array& dc) {
      auto& set = t.set();
      // Per matrix, as matmul's derivative: d op(A) = alpha·dC·op(B)ᵀ, d op(B) = alpha·op(A)ᵀ·dC.
      if (a.id >= 0) {
        auto g = set.alloc(a.dims);
        if (!at)  // dA (m×k) = dC·op(B)ᵀ
          set.gemm_batched(trans::no, bt ? trans::no : trans::yes, m, k, n, alpha, dc.data, n, m * n, b.data,
                           bc, br * bc, S(0), g.data, k, ar * ac, batch);
        else  // dA (k×m) = op(B)·dCᵀ
          set.gemm_batched(bt ? trans::yes : trans::no, trans::yes, k, m, n, alpha, b.data, bc, br * bc,
                           dc.data, n, m * n, S(0), g.data, m, ar * ac, batch);
        t.accumulate(a.id, std::move(g), true);
      }
      if (b.id >= 0) {
        auto g = set.alloc(b.dims);
        if (!bt)  // dB (k×n) = op(A)ᵀ·dC
          set.gemm_batched(at ? trans::no : trans::yes, trans::no, k, n, m, alpha, a.data, ac, ar * ac,
                           dc.data, n, m * n, S(0), g.data, n, br * bc, batch);
        else  // dB (n×k) = dCᵀ·op(A)
          set.gemm_batched(trans::yes, at ? trans::yes : trans::no, n, k, m, alpha, dc.data, n, m * n, a.data,
                           ac, ar * ac, S(0), g.data, k, br * bc, batch);
        t.accumulate(b.id, std::move(g), true);
      }
    });
  }
  return c;
}

template <class S>
auto basic_ops<S>::softmax(const array& x, bool causal, std::int64_t offset) -> array {
  const std::int64_t cols = x.dims.empty() ? 1 : x.dims.back();
  detail::ops_require(cols > 0, "softmax of " + x.shape_string() + ": no columns");
  const std::int64_t rows = x.size() / cols;
  const causal_mask mask{causal, x.dims.size() >= 2 ? x.dims[x.dims.size() - 2] : 1, offset};
  auto y = set_.alloc(x.dims);
  set_.softmax_rows(x.data, y.data, rows, cols, mask);
  if (recording({&x})) {
    array out = y;  // the derivative reads the output only
    out.id = -1;
    y.id = tape_->record([x, out, rows, cols](basic_tape<S>& t, const array& dy) {
      auto g = t.set().alloc(x.dims);
      t.set().softmax_rows_grad(out.data, dy.data, g.data, rows, cols);
      t.accumulate(x.id, std::move(g), true);
    });
  }
  return y;
}

template <class S>
auto basic_ops<S>::split_heads(const array& x, std::int64_t heads, std::int64_t parts) -> array {
  detail::ops_require(x.dims.size() == 3 && heads > 0 && parts > 0 && x.dims[2] % (heads * parts) == 0,
                      "split of " + x.shape_string() + " into " + std::to_string(parts) + " parts of " +
                          std::to_string(heads) + " heads (it needs [B, T, parts·heads·D])");
  const head_geometry g{x.dims[0], x.dims[1], parts, heads, x.dims[2] / (heads * parts)};
  auto y = set_.alloc({parts, g.batch, heads, g.tokens, g.head_dim});
  set_.split_heads(g, x.data, y.data);
  if (recording({&x})) {
    y.id = tape_->record([id = x.id, dims = x.dims, g](basic_tape<S>& t, const array& dy) {
      auto gx = t.set().alloc(dims);
      t.set().merge_heads(g, dy.data, gx.data);
      t.accumulate(id, std::move(gx), true);
    });
  }
  return y;
}

template <class S>
auto basic_ops<S>::merge_heads(const array& x) -> array {
  const auto& d = x.dims;
  detail::ops_require(d.size() == 4 || d.size() == 5,
                      "merge of heads " + x.shape_string() + " (it needs [parts, B, H, T, D] or [B, H, T, D])");
  const std::size_t o = d.size() - 4;  // the first of B, H, T, D
  const head_geometry g{d[o], d[o + 2], o ? d[0] : 1, d[o + 1], d[o + 3]};
  auto y = set_.alloc({g.batch, g.tokens, g.parts * g.heads * g.head_dim});
  set_.merge_heads(g, x.data, y.data);
  if (recording({&x})) {
    y.id = tape_->record([id = x.id, dims = x.dims, g](basic_tape<S>& t, const array& dy) {
      auto gx = t.set().alloc(dims);
      t.set().split_heads(g, dy.data, gx.data);
      t.accumulate(id, std::move(gx), true);
    });
  }
  return y;
}

template <class S>
auto basic_ops<S>::part(const array& x, std::int64_t i) -> array {
  detail::ops_require(!x.dims.empty() && i >= 0 && i < x.dims[0],
                      "part " + std::to_string(i) + " of " + x.shape_string());
  array y = x;
  y.dims.erase(y.dims.begin());
  const std::int64_t stride = y.size();
  y.data = x.data + i * stride;
  y.id = -1;
  if (recording({&x})) {
    y.id = tape_->record([id = x.id, dims = x.dims, i, stride](basic_tape<S>& t, const array& dy) {
      // The other parts' gradients come from their own views: zeros here.
      auto gx = t.set().alloc(dims);
      t.set().fill(gx.size(), S(0), gx.data);
      t.set().copy(stride, dy.data, gx.data + i * stride);
      t.accumulate(id, std::move(gx), true);
    });
  }
  return y;
}

template struct basic_array<float>;
template struct basic_array<double>;
template class basic_tape<float>;
template class basic_tape<double>;
template class basic_ops<float>;
template class basic_ops<double>;

}  // namespace nerve::layers

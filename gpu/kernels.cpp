// The launchers: argument checks, then the backend's table (the pointwise and window ops of
// gpu/kernels/ops.hpp, column sums, softmax cross-entropy forward).
#include "gpu/kernels.hpp"

#include "gpu/detail/device_core.hpp"
#include "gpu/kernels/ops.hpp"
#include "gpu/status.hpp"
#include "gpu/stream.hpp"

#include <string>
#include <variant>

namespace nerve::gpu {
namespace {

detail::backend& of(stream& s) { return *s.impl().core->impl; }

/// Checks the op's window (`what` names the call), then enqueues it.
void launch_window(stream& s, const char* what, const ops::window_op& op) {
  const auto& g = std::visit([](const auto& o) -> const window_geometry& { return o.g; }, op);
  if (g.batch < 0 || g.channels < 1 || g.height < 1 || g.width < 1 || g.kernel_h < 1 || g.kernel_w < 1 ||
      g.stride_h < 1 || g.stride_w < 1 || g.pad_h < 0 || g.pad_w < 0 || g.out_h() < 1 || g.out_w() < 1)
    throw error(errc::invalid_argument, std::string(what) + ": bad window geometry");
  if (std::holds_alternative<ops::pool_forward<true>>(op) && (g.pad_h >= g.kernel_h || g.pad_w >= g.kernel_w))
    throw error(errc::invalid_argument, std::string(what) + ": padding must be smaller than the window");
  if (g.batch) of(s).launch(s.impl(), op);
}

}  // namespace

void activation_forward(stream& s, activation f, const float* x, float* y, std::size_t n, float alpha) {
  if (n) ops::with_activation(f, [&](auto k) { of(s).launch(s.impl(), n, ops::activation_forward<k>{x, y, alpha}); });
}
void activation_backward(stream& s, activation f, const float* x, const float* y, const float* dy, float* dx,
                         std::size_t n, float alpha) {
  if (n)
    ops::with_activation(f, [&](auto k) {
      of(s).launch(s.impl(), n, ops::activation_backward<k>{x, y, dy, dx, alpha});
    });
}
void bias_add(stream& s, const float* x, const float* bias, float* y, std::size_t rows, std::size_t cols, bool relu) {
  if (rows && cols) of(s).launch(s.impl(), rows * cols, ops::bias_add{x, bias, y, cols, relu});
}
void column_sums(stream& s, const float* x, std::size_t rows, std::size_t cols, float* out, float beta) {
  if (cols) of(s).column_sums(s.impl(), x, rows, cols, out, beta);
}
void softmax_xent_forward(stream& s, const float* logits, const std::int32_t* labels, std::size_t rows,
                          std::size_t cols, float* probs, float* loss, float* correct) {
  if (cols == 0) throw error(errc::invalid_argument, "softmax_xent_forward: no classes");
  of(s).softmax_xent_forward(s.impl(), logits, labels, rows, cols, probs, loss, correct);
}
void softmax_xent_backward(stream& s, const float* probs, const std::int32_t* labels, std::size_t rows,
                           std::size_t cols, float scale, float* dlogits) {
  if (rows && cols)
    of(s).launch(s.impl(), rows * cols, ops::softmax_xent_backward{probs, labels, cols, scale, dlogits});
}
void axpy(stream& s, std::size_t n, float alpha, const float* x, float* y) {
  if (n) of(s).launch(s.impl(), n, ops::axpy{alpha, x, y});
}
void binary(stream& s, binary_op f, const float* a, const float* b, float* y, std::size_t n) {
  if (!n) return;
  switch (f) {
    case binary_op::add: return of(s).launch(s.impl(), n, ops::binary<0>{a, b, y});
    case binary_op::sub: return of(s).launch(s.impl(), n, ops::binary<1>{a, b, y});
    case binary_op::mul: return of(s).launch(s.impl(), n, ops::binary<2>{a, b, y});
  }
}
void broadcast(stream& s, binary_op f, const float* x, const float* v, float* y, std::size_t n, std::size_t period) {
  if (!n) return;
  if (period == 0 || n % period)
    throw error(errc::invalid_argument, "broadcast: " + std::to_string(n) + " elements are not rows of " +
                                            std::to_string(period));
  switch (f) {
    case binary_op::add: return of(s).launch(s.impl(), n, ops::broadcast<0>{x, v, y, period});
    case binary_op::sub: return of(s).launch(s.impl(), n, ops::broadcast<1>{x, v, y, period});
    case binary_op::mul: return of(s).launch(s.impl(), n, ops::broadcast<2>{x, v, y, period});
  }
}
void normalize(stream& s, const channel_geometry& g, const float* x, bool batch, float* mean, float* var, double eps,
               float* xhat, float* rstd) {
  if (!g.channels) return;
  if (batch && !g.count()) throw error(errc::invalid_argument, "normalize: a channel without values");
  of(s).launch(s.impl(), g.channels, ops::channel_stats{x, mean, var, rstd, g, eps, batch});
  if (g.size()) of(s).launch(s.impl(), g.size(), ops::normalize_apply{x, mean, rstd, xhat, g.channels, g.inner});
}
void normalize_grad(stream& s, const channel_geometry& g, const float* xhat, const float* rstd, const float* dxhat,
                    float* dx, float* scratch) {
  if (!g.size()) return;
  of(s).launch(s.impl(), g.channels, ops::normalize_grad_means{xhat, dxhat, scratch, g});
  of(s).launch(s.impl(), g.size(), ops::normalize_grad_apply{xhat, rstd, dxhat, scratch, dx, g.channels, g.inner});
}
void channel_affine(stream& s, const channel_geometry& g, const float* x, const float* scale, const float* shift,
                    float* y) {
  if (g.size()) of(s).launch(s.impl(), g.size(), ops::channel_affine{x, scale, shift, y, g.channels, g.inner});
}
void channel_sums(stream& s, const channel_geometry& g, const float* x, const float* z, float* out) {
  if (g.channels) of(s).launch(s.impl(), g.channels, ops::channel_sums{x, z, out, g});
}
void scale(stream& s, std::size_t n, float alpha, float* x) {
  if (n) of(s).launch(s.impl(), n, ops::scale{alpha, x});
}
void copy2d(stream& s, std::size_t rows, std::size_t cols, const float* x, std::size_t ldx, float* y,
            std::size_t ldy) {
  if (rows && cols) of(s).launch(s.impl(), rows * cols, ops::copy2d{x, y, cols, ldx, ldy});
}
void dropout_mask(stream& s, std::uint64_t key, double p, float scale, float* mask, std::size_t n) {
  if (n) of(s).launch(s.impl(), n, ops::dropout_mask{key, p, scale, mask});
}
void fill(stream& s, std::size_t n, float value, float* x) {
  if (n) of(s).launch(s.impl(), n, ops::fill{value, x});
}
void sgd_update(stream& s, float* w, const float* g, float* velocity, std::size_t n, const sgd_params& p) {
  if (p.momentum != 0 && !velocity) throw error(errc::invalid_argument, "sgd_update: momentum needs a velocity");
  if (n) of(s).launch(s.impl(), n, ops::sgd_update::make(w, g, velocity, p));
}
void adam_update(stream& s, float* w, const float* g, float* m, float* v, std::size_t n, const adam_params& p) {
  if (p.step < 1) throw error(errc::invalid_argument, "adam_update: step is 1-based");
  if (n) of(s).launch(s.impl(), n, ops::adam_update::make(w, g, m, v, p));
}
void im2col(stream& s, const float* x, const window_geometry& g, float* col) {
  launch_window(s, "im2col", ops::im2col{x, g, col});
}
void col2im(stream& s, const float* col, const window_geometry& g, float* dx) {
  launch_window(s, "col2im", ops::col2im{col, g, dx});
}
void max_pool_forward(stream& s, const float* x, const window_geometry& g, float* y, std::int32_t* argmax) {
  launch_window(s, "max_pool_forward", ops::pool_forward<true>{x, g, y, argmax});
}
void max_pool_backward(stream& s, const float* dy, const std::int32_t* argmax, const window_geometry& g, float* dx) {
  launch_window(s, "max_pool_backward", ops::pool_backward<true>{dy, argmax, g, dx});
}
void avg_pool_forward(stream& s, const float* x, const window_geometry& g, float* y) {
  launch_window(s, "avg_pool_forward", ops::pool_forward<false>{x, g, y, nullptr});
}
void avg_pool_backward(stream& s, const float* dy, const window_geometry& g, float* dx) {
  launch_window(s, "avg_pool_backward", ops::pool_backward<false>{dy, nullptr, g, dx});
}
void softmax_rows(stream& s, const float* x, float* y, std::size_t rows, std::size_t cols, bool causal,
                  std::size_t block_rows, std::int64_t offset) {
  if (causal && block_rows == 0) throw error(errc::invalid_argument, "softmax_rows: a causal mask of blocks of 0 rows");
  if (rows && cols) of(s).launch(s.impl(), rows, ops::softmax_rows{x, y, cols, causal, block_rows, offset});
}
void softmax_rows_backward(stream& s, const float* y, const float* dy, float* dx, std::size_t rows,
                           std::size_t cols) {
  if (rows && cols) of(s).launch(s.impl(), rows, ops::softmax_rows_backward{y, dy, dx, cols});
}
void split_heads(stream& s, const head_layout& g, const float* x, float* y) {
  if (g.size()) of(s).launch(s.impl(), g.size(), ops::permute_heads<true>{x, y, g});
}
void merge_heads(stream& s, const head_layout& g, const float* y, float* x) {
  if (g.size()) of(s).launch(s.impl(), g.size(), ops::permute_heads<false>{y, x, g});
}


void gather_rows(stream& s, const float* table, std::size_t rows, std::size_t cols, const float* ids, std::size_t n,
                 float* y) {
  if (n && cols) of(s).launch(s.impl(), n * cols, ops::gather_rows{table, ids, y, rows, cols});
}
void scatter_add_rows(stream& s, const float* dy, const float* ids, std::size_t n, std::size_t rows, std::size_t cols,
                      float* table) {
  const std::size_t chunks = (cols + ops::scatter_chunk - 1) / ops::scatter_chunk;
  if (n && rows && cols) of(s).launch(s.impl(), rows * chunks, ops::scatter_add_rows{dy, ids, table, n, cols, chunks});
}

namespace {
/// The image elements of a patchify window, after its checks (`what` names the call).
std::size_t patch_elements(const window_geometry& g, const char* what) {
  if (g.batch < 0 || g.channels < 1 || g.kernel_h < 1 || g.kernel_w < 1 || g.height % g.kernel_h ||
      g.width % g.kernel_w || g.stride_h != g.kernel_h || g.stride_w != g.kernel_w || g.pad_h || g.pad_w)
    throw error(errc::invalid_argument, std::string(what) + ": not a tiling of the images by patches");
  return ops::inputs(g);
}
}  // namespace

void patchify(stream& s, const window_geometry& g, const float* x, float* y) {
  if (const auto n = patch_elements(g, "patchify")) of(s).launch(s.impl(), n, ops::patch_permute<true>{x, y, g});
}
void unpatchify(stream& s, const window_geometry& g, const float* y, float* x) {
  if (const auto n = patch_elements(g, "unpatchify")) of(s).launch(s.impl(), n, ops::patch_permute<false>{y, x, g});
}

}  // namespace nerve::gpu

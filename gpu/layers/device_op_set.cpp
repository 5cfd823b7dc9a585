#include "gpu/layers/device_op_set.hpp"

#include "gpu/blas.hpp"
#include "gpu/detail/device_core.hpp"
#include "gpu/device.hpp"
#include "gpu/kernels.hpp"
#include "gpu/kernels/ops.hpp"
#include "gpu/status.hpp"

#include <algorithm>
#include <vector>

namespace nerve::gpu {
namespace {

shape_t device_shape(const std::vector<std::int64_t>& dims) {
  shape_t s;
  for (auto d : dims) s.push_back(std::size_t(d));
  return s;
}
transpose to_transpose(layers::trans t) { return t == layers::trans::yes ? transpose::yes : transpose::no; }
activation to_activation(layers::unary_fn f) {
  switch (f) {
    case layers::unary_fn::relu: return activation::relu;
    case layers::unary_fn::leaky_relu: return activation::leaky_relu;
    case layers::unary_fn::sigmoid: return activation::sigmoid;
    case layers::unary_fn::tanh: return activation::tanh;
    case layers::unary_fn::gelu: return activation::gelu;
  }
  return activation::relu;
}
/// The kernels' window (int fields) of an op's.
window_geometry kernel_window(const layers::window_geometry& g) {
  return {int(g.batch),    int(g.channels), int(g.height), int(g.width),    int(g.kernel_h),
          int(g.kernel_w), int(g.pad_h),    int(g.pad_w),  int(g.stride_h), int(g.stride_w)};
}
channel_geometry kernel_channels(const layers::norm_geometry& g) {
  return {std::size_t(g.outer), std::size_t(g.channels), std::size_t(g.inner)};
}
head_layout kernel_heads(const layers::head_geometry& g) {
  return {std::size_t(g.batch), std::size_t(g.tokens), std::size_t(g.parts), std::size_t(g.heads),
          std::size_t(g.head_dim)};
}
binary_op to_binary(layers::binary_fn f) {
  switch (f) {
    case layers::binary_fn::add: return binary_op::add;
    case layers::binary_fn::sub: return binary_op::sub;
    case layers::binary_fn::mul: return binary_op::mul;
  }
  return binary_op::add;
}

}  // namespace

layers::array device_op_set::array_of(std::shared_ptr<device_tensor> t) {
  layers::array a;
  for (auto d : t->shape()) a.dims.push_back(std::int64_t(d));
  a.data = t->data();
  a.owner = std::move(t);
  return a;
}

layers::array device_op_set::alloc(std::vector<std::int64_t> dims) {
  auto a = array_of(std::make_shared<device_tensor>(s_, device_shape(dims)));
  a.dims = std::move(dims);
  return a;
}

std::shared_ptr<device_tensor> device_op_set::tensor_of(const layers::array& a) {
  // Every owner an array of this op set has is a device tensor (alloc, array_of); a
  // parameter's array owns nothing.
  auto own = std::static_pointer_cast<device_tensor>(a.owner);
  if (own && own->data() == a.data && own->shape() == device_shape(a.dims)) return own;
  auto t = std::make_shared<device_tensor>(s_, device_shape(a.dims));
  copy_async(s_, t->data(), a.data, t->bytes());
  return t;
}

void device_op_set::gemm(layers::trans ta, layers::trans tb, std::int64_t m, std::int64_t n, std::int64_t k,
                         float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta,
                         float* c, std::int64_t ldc) {
  gpu::gemm(s_, to_transpose(ta), to_transpose(tb), int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c,
            int(ldc));
}
void device_op_set::softmax_xent(const float* logits, const std::int32_t* labels, std::int64_t rows,
                                 std::int64_t cols, float* probs, float* loss, float* correct) {
  softmax_xent_forward(s_, logits, labels, std::size_t(rows), std::size_t(cols), probs, loss, correct);
}
void device_op_set::softmax_xent_grad(const float* probs, const std::int32_t* labels, std::int64_t rows,
                                      std::int64_t cols, float scale, float* dlogits) {
  softmax_xent_backward(s_, probs, labels, std::size_t(rows), std::size_t(cols), scale, dlogits);
}
void device_op_set::sgd_update(const layers::sgd_update_args& a, float* w, const float* g, float* b, std::int64_t n) {
  gpu::sgd_update(s_, w, g, b, std::size_t(n),
                  sgd_params{a.lr, a.momentum, a.weight_decay, a.nesterov, a.dampening, a.first});
}
void device_op_set::adam_update(const layers::adam_update_args& a, float* w, const float* g, float* m, float* v,
                                std::int64_t n) {
  gpu::adam_update(s_, w, g, m, v, std::size_t(n),
                   adam_params{a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.decoupled, a.t});
}
void device_op_set::read(const float* x, float* host, std::int64_t n) {
  copy_async(s_, host, x, std::size_t(n) * sizeof(float));
  s_.synchronize();
}
void device_op_set::write(const float* host, float* x, std::int64_t n) {
  copy_async(s_, x, host, std::size_t(n) * sizeof(float));
  s_.synchronize();  // the host memory may go once this returns
}
void device_op_set::unary(layers::unary_fn f, const float* x, float* y, std::int64_t n, float alpha) {
  activation_forward(s_, to_activation(f), x, y, std::size_t(n), alpha);
}
void device_op_set::unary_grad(layers::unary_fn f, const float* x, const float* y, const float* dy, float* dx,
                               std::int64_t n, float alpha) {
  activation_backward(s_, to_activation(f), x, y, dy, dx, std::size_t(n), alpha);
}
void device_op_set::binary(layers::binary_fn f, const float* a, const float* b, float* y, std::int64_t n) {
  gpu::binary(s_, to_binary(f), a, b, y, std::size_t(n));
}
void device_op_set::broadcast(layers::binary_fn f, const float* x, const float* v, float* y, std::int64_t n,
                              std::int64_t period) {
  gpu::broadcast(s_, to_binary(f), x, v, y, std::size_t(n), std::size_t(period));
}
void device_op_set::column_sums(const float* x, std::int64_t rows, std::int64_t cols, float* out, float beta) {
  gpu::column_sums(s_, x, std::size_t(rows), std::size_t(cols), out, beta);
}
void device_op_set::axpy(std::int64_t n, float alpha, const float* x, float* y) {
  gpu::axpy(s_, std::size_t(n), alpha, x, y);
}
void device_op_set::scale(std::int64_t n, float alpha, float* x) { gpu::scale(s_, std::size_t(n), alpha, x); }
void device_op_set::fill(std::int64_t n, float value, float* x) { gpu::fill(s_, std::size_t(n), value, x); }
void device_op_set::copy(std::int64_t n, const float* x, float* y) {
  if (n) copy_async(s_, y, x, std::size_t(n) * sizeof(float));
}

void device_op_set::copy2d(std::int64_t rows, std::int64_t cols, const float* x, std::int64_t ldx, float* y,
                           std::int64_t ldy) {
  gpu::copy2d(s_, std::size_t(rows), std::size_t(cols), x, std::size_t(ldx), y, std::size_t(ldy));
}
void device_op_set::dropout_mask(std::uint64_t key, double p, float scale, float* mask, std::int64_t n) {
  gpu::dropout_mask(s_, key, p, scale, mask, std::size_t(n));
}

void device_op_set::gemm_bias(layers::trans ta, layers::trans tb, std::int64_t m, std::int64_t n, std::int64_t k,
                              const float* a, std::int64_t lda, const float* b, std::int64_t ldb, const float* bias,
                              float* c, std::int64_t ldc) {
  if (ldc != n) throw error(errc::invalid_argument, "device gemm_bias: C must be tight (ldc = n)");
  gemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
  bias_add(s_, c, bias, c, std::size_t(m), std::size_t(n));
}

const float* device_op_set::ones(std::size_t n) {
  if (ones_.size() < n) {
    ones_ = device_tensor(s_, {n});
    gpu::fill(s_, n, 1.0f, ones_.data());
  }
  return ones_.data();
}

// Convolution as im2col and one strided-batched product over the images: Y_n = W·col_n.
void device_op_set::conv2d(const layers::window_geometry& lg, std::int64_t k, const float* x, const float* w,
                           const float* bias, float* y) {
  const auto g = kernel_window(lg);
  const std::int64_t pr = lg.patch_rows(), pc = lg.patch_cols();
  device_tensor col(s_, {std::size_t(g.batch), std::size_t(pr), std::size_t(pc)});
  im2col(s_, x, g, col.data());
  gemm_strided_batched(s_, transpose::no, transpose::no, int(k), int(pc), int(pr), 1.0f, w, int(pr), 0, col.data(),
                       int(pc), pr * pc, 0.0f, y, int(pc), k * pc, g.batch);
  if (bias)  // Y_n += b·1ᵀ: the bias over the pixels as a rank-1 product
    gemm_strided_batched(s_, transpose::no, transpose::no, int(k), int(pc), 1, 1.0f, bias, 1, 0, ones(std::size_t(pc)),
                         int(pc), 0, 1.0f, y, int(pc), k * pc, g.batch);
}

void device_op_set::conv2d_grad_input(const layers::window_geometry& lg, std::int64_t k, const float* w,
                                      const float* dy, float* dx) {
  const auto g = kernel_window(lg);
  const std::int64_t pr = lg.patch_rows(), pc = lg.patch_cols();
  device_tensor dcol(s_, {std::size_t(g.batch), std::size_t(pr), std::size_t(pc)});
  // dcol_n = Wᵀ·dY_n, then col2im gathers every patch entry back onto its pixel.
  gemm_strided_batched(s_, transpose::yes, transpose::no, int(pr), int(pc), int(k), 1.0f, w, int(pr), 0, dy, int(pc),
                       k * pc, 0.0f, dcol.data(), int(pc), pr * pc, g.batch);
  col2im(s_, dcol.data(), g, dx);
}

void device_op_set::conv2d_grad_weight(const layers::window_geometry& lg, std::int64_t k, const float* x,
                                       const float* dy, float* dw, float* dbias) {
  const auto g = kernel_window(lg);
  const std::int64_t pr = lg.patch_rows(), pc = lg.patch_cols();
  device_tensor col(s_, {std::size_t(g.batch), std::size_t(pr), std::size_t(pc)});
  im2col(s_, x, g, col.data());  // again: the patches are kh·kw times the images
  // Per image dW_n = dY_n·col_nᵀ, then a fixed-order sum over the images (no atomics:
  // the same bits every run).
  device_tensor per_image(s_, {std::size_t(g.batch), std::size_t(k * pr)});
  gemm_strided_batched(s_, transpose::no, transpose::yes, int(k), int(pr), int(pc), 1.0f, dy, int(pc), k * pc,
                       col.data(), int(pc), pr * pc, 0.0f, per_image.data(), int(pr), k * pr, g.batch);
  gpu::column_sums(s_, per_image.data(), std::size_t(g.batch), std::size_t(k * pr), dw, 1.0f);
  if (!dbias) return;
  device_tensor pixel_sums(s_, {std::size_t(k * pc)});
  gpu::column_sums(s_, dy, std::size_t(g.batch), std::size_t(k * pc), pixel_sums.data(), 0.0f);
  gpu::gemm(s_, transpose::no, transpose::no, int(k), 1, int(pc), 1.0f, pixel_sums.data(), int(pc),
            ones(std::size_t(pc)), 1, 1.0f, dbias, 1);
}

void device_op_set::normalize(const layers::norm_geometry& g, const float* x, bool batch, float* mean, float* var,
                              double eps, float* xhat, float* rstd) {
  gpu::normalize(s_, kernel_channels(g), x, batch, mean, var, eps, xhat, rstd);
}

void device_op_set::normalize_grad(const layers::norm_geometry& g, const float* xhat, const float* rstd,
                                   const float* dxhat, float* dx) {
  device_tensor means(s_, {2, std::max<std::size_t>(1, std::size_t(g.channels))});  // freed in stream order
  gpu::normalize_grad(s_, kernel_channels(g), xhat, rstd, dxhat, dx, means.data());
}

void device_op_set::channel_affine(const layers::norm_geometry& g, const float* x, const float* scale,
                                   const float* shift, float* y) {
  gpu::channel_affine(s_, kernel_channels(g), x, scale, shift, y);
}

void device_op_set::channel_sums(const layers::norm_geometry& g, const float* x, const float* z, float* out) {
  gpu::channel_sums(s_, kernel_channels(g), x, z, out);
}

void device_op_set::pool2d(layers::pool_fn f, const layers::window_geometry& lg, const float* x, float* y) {
  const auto g = kernel_window(lg);
  if (f == layers::pool_fn::average) return avg_pool_forward(s_, x, g, y);
  const std::size_t outputs = std::size_t(lg.batch * lg.channels * lg.patch_cols());
  device_buffer argmax(s_, std::max<std::size_t>(1, outputs) * sizeof(std::int32_t));  // freed in stream order
  max_pool_forward(s_, x, g, y, static_cast<std::int32_t*>(argmax.data()));
}

void device_op_set::pool2d_grad(layers::pool_fn f, const layers::window_geometry& lg, const float* x,
                                const float* dy, float* dx) {
  const auto g = kernel_window(lg);
  if (f == layers::pool_fn::average) return avg_pool_backward(s_, dy, g, dx);
  // Each window's maximum found again (the forward's rule, so the same one), then the
  // gather of dy onto it.
  const std::size_t outputs = std::size_t(lg.batch * lg.channels * lg.patch_cols());
  device_tensor y(s_, {std::max<std::size_t>(1, outputs)});
  device_buffer argmax(s_, std::max<std::size_t>(1, outputs) * sizeof(std::int32_t));
  max_pool_forward(s_, x, g, y.data(), static_cast<std::int32_t*>(argmax.data()));
  max_pool_backward(s_, dy, static_cast<const std::int32_t*>(argmax.data()), g, dx);
}

void device_op_set::gather_rows(const float* table, std::int64_t rows, std::int64_t cols, const float* ids,
                                std::int64_t n, float* y) {
  gpu::gather_rows(s_, table, std::size_t(rows), std::size_t(cols), ids, std::size_t(n), y);
}

void device_op_set::scatter_add_rows(const float* dy, const float* ids, std::int64_t n, std::int64_t rows,
                                     std::int64_t cols, float* table) {
  gpu::scatter_add_rows(s_, dy, ids, std::size_t(n), std::size_t(rows), std::size_t(cols), table);
}

layers::bad_id device_op_set::find_bad_id(const float* ids, std::int64_t n, std::int64_t rows) {
  if (n <= 0 || s_.impl().core->impl->kind() != backend_kind::standin) return {};
  std::vector<float> host(static_cast<std::size_t>(n));
  read(ids, host.data(), n);
  for (std::int64_t t = 0; t < n; ++t)
    if (!ops::is_row(host[std::size_t(t)], std::size_t(rows))) return {t, double(host[std::size_t(t)])};
  return {};
}

void device_op_set::patchify(const layers::window_geometry& g, const float* x, float* y) {
  gpu::patchify(s_, kernel_window(g), x, y);
}

void device_op_set::unpatchify(const layers::window_geometry& g, const float* y, float* x) {
  gpu::unpatchify(s_, kernel_window(g), y, x);
}

void device_op_set::gemm_batched(layers::trans ta, layers::trans tb, std::int64_t m, std::int64_t n,
                                 std::int64_t k, float alpha, const float* a, std::int64_t lda,
                                 std::int64_t stride_a, const float* b, std::int64_t ldb,
                                 std::int64_t stride_b, float beta, float* c, std::int64_t ldc,
                                 std::int64_t stride_c, std::int64_t batch) {
  if (batch <= 0) return;
  gpu::gemm_strided_batched(s_, to_transpose(ta), to_transpose(tb), int(m), int(n), int(k), alpha, a, int(lda),
                            stride_a, b, int(ldb), stride_b, beta, c, int(ldc), stride_c, int(batch));
}

void device_op_set::softmax_rows(const float* x, float* y, std::int64_t rows, std::int64_t cols,
                                 const layers::causal_mask& mask) {
  gpu::softmax_rows(s_, x, y, std::size_t(rows), std::size_t(cols), mask.on, std::size_t(mask.block_rows),
                    mask.offset);
}

void device_op_set::softmax_rows_grad(const float* y, const float* dy, float* dx, std::int64_t rows,
                                      std::int64_t cols) {
  gpu::softmax_rows_backward(s_, y, dy, dx, std::size_t(rows), std::size_t(cols));
}

void device_op_set::split_heads(const layers::head_geometry& g, const float* x, float* y) {
  gpu::split_heads(s_, kernel_heads(g), x, y);
}

void device_op_set::merge_heads(const layers::head_geometry& g, const float* y, float* x) {
  gpu::merge_heads(s_, kernel_heads(g), y, x);
}

}  // namespace nerve::gpu

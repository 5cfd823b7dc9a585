#pragma once
/// \file
/// `device_op_set`: the ops of layers/ops.hpp on one stream of a device (the stand-in or
/// CUDA): cuBLAS products and the kernels of gpu/kernels.hpp. Every call only enqueues;
/// an array's memory is a `device_tensor` freed in the stream's order. What a device
/// backend runs op layers with (layers written once, gpu/layers/device_backend.hpp).

#include "gpu/memory.hpp"
#include "layers/ops.hpp"

#include <string>

namespace nerve::gpu {

class device_op_set final : public layers::op_set {
 public:
  /// `s` must outlive the op set; `name` is the backend's (`standin`, `cuda`).
  device_op_set(stream& s, std::string name) : s_(s), name_(std::move(name)) {}
  std::string_view name() const noexcept override { return name_; }
  layers::array alloc(std::vector<std::int64_t> dims) override;
  void gemm(layers::trans ta, layers::trans tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
            const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
            std::int64_t ldc) override;
  void unary(layers::unary_fn f, const float* x, float* y, std::int64_t n, float alpha) override;
  void unary_grad(layers::unary_fn f, const float* x, const float* y, const float* dy, float* dx, std::int64_t n,
                  float alpha) override;
  void binary(layers::binary_fn f, const float* a, const float* b, float* y, std::int64_t n) override;
  void broadcast(layers::binary_fn f, const float* x, const float* v, float* y, std::int64_t n,
                 std::int64_t period) override;
  void column_sums(const float* x, std::int64_t rows, std::int64_t cols, float* out, float beta) override;
  void axpy(std::int64_t n, float alpha, const float* x, float* y) override;
  void scale(std::int64_t n, float alpha, float* x) override;
  void fill(std::int64_t n, float value, float* x) override;
  void copy(std::int64_t n, const float* x, float* y) override;
  void copy2d(std::int64_t rows, std::int64_t cols, const float* x, std::int64_t ldx, float* y,
              std::int64_t ldy) override;
  void dropout_mask(std::uint64_t key, double p, float scale, float* mask, std::int64_t n) override;
  void softmax_xent(const float* logits, const std::int32_t* labels, std::int64_t rows, std::int64_t cols,
                    float* probs, float* loss, float* correct) override;
  void softmax_xent_grad(const float* probs, const std::int32_t* labels, std::int64_t rows, std::int64_t cols,
                         float scale, float* dlogits) override;
  void sgd_update(const layers::sgd_update_args& a, float* w, const float* g, float* b, std::int64_t n) override;
  void adam_update(const layers::adam_update_args& a, float* w, const float* g, float* m, float* v,
                   std::int64_t n) override;
  /// Copies through the stream and waits for it (checkpoints, off the loops).
  void read(const float* x, float* host, std::int64_t n) override;
  void write(const float* host, float* x, std::int64_t n) override;
  void gemm_bias(layers::trans ta, layers::trans tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                 std::int64_t lda, const float* b, std::int64_t ldb, const float* bias, float* c,
                 std::int64_t ldc) override;
  void conv2d(const layers::window_geometry& g, std::int64_t out_channels, const float* x, const float* w,
              const float* bias, float* y) override;
  void conv2d_grad_input(const layers::window_geometry& g, std::int64_t out_channels, const float* w, const float* dy,
                         float* dx) override;
  void conv2d_grad_weight(const layers::window_geometry& g, std::int64_t out_channels, const float* x,
                          const float* dy, float* dw, float* dbias) override;
  void normalize(const layers::norm_geometry& g, const float* x, bool batch, float* mean, float* var, double eps,
                 float* xhat, float* rstd) override;
  void normalize_grad(const layers::norm_geometry& g, const float* xhat, const float* rstd, const float* dxhat,
                      float* dx) override;
  void channel_affine(const layers::norm_geometry& g, const float* x, const float* scale, const float* shift,
                      float* y) override;
  void channel_sums(const layers::norm_geometry& g, const float* x, const float* z, float* out) override;
  void pool2d(layers::pool_fn f, const layers::window_geometry& g, const float* x, float* y) override;
  void pool2d_grad(layers::pool_fn f, const layers::window_geometry& g, const float* x, const float* dy,
                   float* dx) override;
  void gather_rows(const float* table, std::int64_t rows, std::int64_t cols, const float* ids, std::int64_t n,
                   float* y) override;
  void scatter_add_rows(const float* dy, const float* ids, std::int64_t n, std::int64_t rows, std::int64_t cols,
                        float* table) override;
  /// On the stand-in, reads the ids back (waiting for the stream: its memory is the
  /// host's, and a test machine's loop may wait) and scans them; on CUDA none, without a
  /// wait: the gather's guard writes a zero row for a bad id instead of reading outside.
  layers::bad_id find_bad_id(const float* ids, std::int64_t n, std::int64_t rows) override;
  void patchify(const layers::window_geometry& g, const float* x, float* y) override;
  void unpatchify(const layers::window_geometry& g, const float* y, float* x) override;
  void gemm_batched(layers::trans ta, layers::trans tb, std::int64_t m, std::int64_t n, std::int64_t k,
                    float alpha, const float* a, std::int64_t lda, std::int64_t stride_a, const float* b,
                    std::int64_t ldb, std::int64_t stride_b, float beta, float* c, std::int64_t ldc,
                    std::int64_t stride_c, std::int64_t batch) override;
  void softmax_rows(const float* x, float* y, std::int64_t rows, std::int64_t cols,
                    const layers::causal_mask& mask) override;
  void softmax_rows_grad(const float* y, const float* dy, float* dx, std::int64_t rows, std::int64_t cols) override;
  void split_heads(const layers::head_geometry& g, const float* x, float* y) override;
  void merge_heads(const layers::head_geometry& g, const float* y, float* x) override;

  /// `t` as an array that keeps it alive.
  static layers::array array_of(std::shared_ptr<device_tensor> t);
  /// The device tensor holding `a` with `a`'s dims: the array's own when it is one
  /// whole tensor of this op set of those dims, else a copy on the stream.
  std::shared_ptr<device_tensor> tensor_of(const layers::array& a);

 private:
  /// At least `n` ones (a bias broadcast over pixels as a rank-1 product), kept.
  const float* ones(std::size_t n);
  stream& s_;
  std::string name_;
  device_tensor ones_;
};

}  // namespace nerve::gpu

#include "gpu/layers/device_op_set.hpp"

#include "gpu/blas.hpp"
#include "gpu/kernels.hpp"

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

}  // namespace nerve::gpu

#include "layers/attention.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

#include "layers/init.hpp"

namespace nerve::layers {

template <class Scalar>
basic_multihead_attention<Scalar>::basic_multihead_attention(std::int64_t dim, std::int64_t heads, bool causal)
    : dim_(dim), heads_(heads), causal_(causal) {
  if (dim <= 0 || heads <= 0)
    throw std::invalid_argument("MultiheadAttention: dim and heads must be positive, got dim=" + std::to_string(dim) +
                                " heads=" + std::to_string(heads));
  if (dim % heads != 0)
    throw std::invalid_argument("MultiheadAttention: dim " + std::to_string(dim) + " is not divisible by heads " +
                                std::to_string(heads) + " (each head takes dim / heads features)");
  qkv_w_ = tensor_type::zeros(3 * dim, {dim});
  qkv_w_grad_ = tensor_type::zeros(3 * dim, {dim});
  qkv_b_ = tensor_type::zeros(1, {3 * dim});
  qkv_b_grad_ = tensor_type::zeros(1, {3 * dim});
  proj_w_ = tensor_type::zeros(dim, {dim});
  proj_w_grad_ = tensor_type::zeros(dim, {dim});
  proj_b_ = tensor_type::zeros(1, {dim});
  proj_b_grad_ = tensor_type::zeros(1, {dim});
}

template <class Scalar>
auto basic_multihead_attention<Scalar>::parameters() -> std::vector<parameter_ref> {
  return {{"qkv.weight", &qkv_w_, &qkv_w_grad_, {3 * dim_, dim_}},
          {"qkv.bias", &qkv_b_, &qkv_b_grad_, {3 * dim_}},
          {"proj.weight", &proj_w_, &proj_w_grad_, {dim_, dim_}},
          {"proj.bias", &proj_b_, &proj_b_grad_, {dim_}}};
}

template <class Scalar>
void basic_multihead_attention<Scalar>::reset_parameters(std::mt19937_64& rng) {
  default_init(qkv_w_, &qkv_b_, dim_, rng);
  default_init(proj_w_, &proj_b_, dim_, rng);
}

template <class Scalar>
shape basic_multihead_attention<Scalar>::infer_shape(std::span<const shape> inputs) const {
  const shape& in = inputs[0];
  if (in.rank() != 2 || in[1] != dim_) throw this->mismatch(0, in, "[T, " + std::to_string(dim_) + "]");
  return in;
}

template <class Scalar>
auto basic_multihead_attention<Scalar>::compute(basic_ops<Scalar>& o, std::span<const array> in,
                                                std::span<const array> params, std::vector<array>&,
                                                const forward_context&) -> array {
  const array& x = in[0];
  const std::int64_t c = dim_, t = x.dims.size() == 3 ? x.dims[1] : 1, b = x.size() / (t * c);
  const auto qkv = o.linear(o.reshape(x, {b * t, c}), params[0], params[1]);  // [B·T, 3C]
  const auto heads = o.split_heads(o.reshape(qkv, {b, t, 3 * c}), heads_, 3);  // [3, B, H, T, D]
  const auto q = o.part(heads, 0), k = o.part(heads, 1), v = o.part(heads, 2);
  const auto scores = o.batched_matmul(q, k, trans::no, trans::yes, Scalar(1 / std::sqrt(double(head_dim()))));
  const auto weights = o.softmax(scores, causal_);                              // [B, H, T, T]
  const auto mixed = o.merge_heads(o.batched_matmul(weights, v));               // [B, T, C]
  const auto y = o.linear(o.reshape(mixed, {b * t, c}), params[2], params[3]);  // [B·T, C]
  return o.reshape(y, x.dims);
}

template class basic_multihead_attention<float>;
template class basic_multihead_attention<double>;

}  // namespace nerve::layers

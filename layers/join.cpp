#include "layers/join.hpp"

#include <cstring>

namespace nerve::layers {

template <class Scalar>
shape basic_add<Scalar>::infer_shape(std::span<const shape> inputs) const {
  for (std::size_t i = 1; i < inputs.size(); ++i)
    if (inputs[i] != inputs[0])
      throw this->mismatch(i, inputs[i], inputs[0].to_string() + " (the shape of input 0)");
  return inputs[0];
}

template <class Scalar>
auto basic_add<Scalar>::compute(basic_ops<Scalar>& o, std::span<const array> in, std::span<const array>,
                                std::vector<array>&, const forward_context&) -> array {
  array y = o.add(in[0], in[1]);
  for (std::size_t i = 2; i < in.size(); ++i) y = o.add(y, in[i]);
  return y;
}

template <class Scalar>
shape basic_concat<Scalar>::infer_shape(std::span<const shape> inputs) const {
  std::vector<std::int64_t> out = inputs[0].dims();
  if (out.empty()) throw this->mismatch(0, inputs[0], "a shape of rank ≥ 1");
  for (std::size_t i = 1; i < inputs.size(); ++i) {
    const auto& d = inputs[i].dims();
    bool ok = d.size() == out.size();
    for (std::size_t k = 1; ok && k < d.size(); ++k) ok = d[k] == out[k];
    if (!ok) {
      std::string want = "[*";
      for (std::size_t k = 1; k < out.size(); ++k) want += ", " + std::to_string(out[k]);
      throw this->mismatch(i, inputs[i], want + "] (input 0 is " + inputs[0].to_string() + ")");
    }
    out[0] += d[0];
  }
  return shape(std::move(out));
}

template <class Scalar>
auto basic_concat<Scalar>::do_forward(std::vector<tensor_type>& inputs, const forward_context&) -> forward_result {
  std::vector<shape> shapes;
  for (const auto& t : inputs) shapes.push_back(t.sample_shape());
  const std::int64_t n = inputs[0].batch();
  tensor_type y(n, infer_shape(shapes));
  std::int64_t offset = 0;
  for (const auto& t : inputs) {
    y.matrix().middleCols(offset, t.features()) = t.matrix();
    offset += t.features();
  }
  return {std::move(y), {}};
}

template <class Scalar>
auto basic_concat<Scalar>::do_backward_input(const stash_type& saved, const tensor_type& dy, input_mask wanted)
    -> std::vector<tensor_type> {
  std::vector<tensor_type> g(saved.input_shapes.size());
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const std::int64_t f = saved.input_shapes[i].numel();
    if (wanted & (input_mask{1} << i))
      g[i] = tensor_type(typename tensor_type::matrix_type(dy.matrix().middleCols(offset, f)), saved.input_shapes[i]);
    offset += f;
  }
  return g;
}

template class basic_add<float>;
template class basic_add<double>;
template class basic_concat<float>;
template class basic_concat<double>;

}  // namespace nerve::layers

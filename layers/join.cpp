#include "layers/join.hpp"


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
auto basic_concat<Scalar>::compute(basic_ops<Scalar>& o, std::span<const array> in, std::span<const array>,
                                   std::vector<array>& keep, const forward_context&) -> array {
  std::vector<std::int64_t> dims = in[0].dims;  // [N, C₀, …]: the samples' first dimensions add up
  for (std::size_t i = 1; i < in.size(); ++i) dims.at(1) += in[i].dims.at(1);
  for (const auto& a : in) keep.push_back({a.dims, nullptr, nullptr, -1});
  return o.concat_cols(in, std::move(dims));
}

template <class Scalar>
auto basic_concat<Scalar>::grad_input(basic_ops<Scalar>& o, std::span<const array> keep, std::span<const array>,
                                      const array& dy, input_mask wanted) -> std::vector<array> {
  std::vector<array> g(keep.size());
  std::int64_t at = 0;
  for (std::size_t i = 0; i < keep.size(); ++i) {
    const std::int64_t cols = keep[i].cols();
    if (wanted & (input_mask{1} << i)) {
      g[i] = o.empty(keep[i].dims);
      o.set().copy2d(dy.rows(), cols, dy.data + at, dy.cols(), g[i].data, cols);
    }
    at += cols;
  }
  return g;
}

template class basic_add<float>;
template class basic_add<double>;
template class basic_concat<float>;
template class basic_concat<double>;

}  // namespace nerve::layers

#include "layers/class_token.hpp"

#include <array>
#include <stdexcept>

namespace nerve::layers {

// ---- ClassToken ------------------------------------------------------------------------

namespace {
/// `dim`, once it is positive (before the token is made).
std::int64_t checked_dim(std::int64_t dim) {
  if (dim <= 0) throw std::invalid_argument("ClassToken: dim must be positive, got " + std::to_string(dim));
  return dim;
}
}  // namespace

template <class Scalar>
basic_class_token<Scalar>::basic_class_token(std::int64_t dim)
    : dim_(checked_dim(dim)), weight_(tensor_type::zeros(1, {1, dim})), weight_grad_(tensor_type::zeros(1, {1, dim})) {}

template <class Scalar>
auto basic_class_token<Scalar>::parameters() -> std::vector<parameter_ref> {
  return {{"weight", &weight_, &weight_grad_, {1, 1, dim_}}};
}

template <class Scalar>
void basic_class_token<Scalar>::reset_parameters(std::mt19937_64&) {
  weight_.set_zero();
}

template <class Scalar>
shape basic_class_token<Scalar>::infer_shape(std::span<const shape> inputs) const {
  const shape& in = inputs[0];
  if (in.rank() != 2 || in[1] != dim_) throw this->mismatch(0, in, "[T, " + std::to_string(dim_) + "]");
  return shape{in[0] + 1, dim_};
}

template <class Scalar>
auto basic_class_token<Scalar>::compute(basic_ops<Scalar>& o, std::span<const array> in, std::span<const array> params,
                                        std::vector<array>&, const forward_context&) -> array {
  const array& x = in[0];
  const std::int64_t batch = x.rows(), tokens = x.cols() / dim_;
  const std::array<array, 2> parts{o.add_row(o.zeros({batch, dim_}), params[0]), x};
  return o.concat_cols(parts, {batch, tokens + 1, dim_});
}

// ---- SelectToken -----------------------------------------------------------------------

template <class Scalar>
basic_select_token<Scalar>::basic_select_token(std::int64_t index) : index_(index) {
  if (index < 0) throw std::invalid_argument("SelectToken: index must not be negative, got " + std::to_string(index));
}

template <class Scalar>
shape basic_select_token<Scalar>::infer_shape(std::span<const shape> inputs) const {
  const shape& in = inputs[0];
  if (in.rank() != 2 || in[0] <= index_)
    throw this->mismatch(0, in, "[T, C] with T > " + std::to_string(index_) + " (token " + std::to_string(index_) +
                                    ")");
  return shape{in[1]};
}

template <class Scalar>
auto basic_select_token<Scalar>::compute(basic_ops<Scalar>& o, std::span<const array> in, std::span<const array>,
                                         std::vector<array>&, const forward_context&) -> array {
  const array& x = in[0];
  const std::int64_t batch = x.rows(), c = x.dims.back();
  return o.slice_cols(x, index_ * c, c, {batch, c});
}

template class basic_class_token<float>;
template class basic_class_token<double>;
template class basic_select_token<float>;
template class basic_select_token<double>;

}  // namespace nerve::layers

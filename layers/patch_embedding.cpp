#include "layers/patch_embedding.hpp"

#include <stdexcept>

#include "layers/init.hpp"

namespace nerve::layers {

namespace {
/// `patch`, once all three are positive (before the weight is made).
std::int64_t checked_patch(std::int64_t patch, std::int64_t dim, std::int64_t channels) {
  if (patch <= 0 || dim <= 0 || channels <= 0)
    throw std::invalid_argument("PatchEmbedding: patch, dim and channels must be positive, got patch=" +
                                std::to_string(patch) + " dim=" + std::to_string(dim) +
                                " channels=" + std::to_string(channels));
  return patch;
}
}  // namespace

template <class Scalar>
basic_patch_embedding<Scalar>::basic_patch_embedding(std::int64_t patch, std::int64_t dim, std::int64_t channels)
    : patch_(checked_patch(patch, dim, channels)), dim_(dim), channels_(channels),
      weight_(tensor_type::zeros(dim, {channels * patch * patch})),
      weight_grad_(tensor_type::zeros(dim, {channels * patch * patch})), b_(tensor_type::zeros(1, {dim})),
      b_grad_(tensor_type::zeros(1, {dim})) {}

template <class Scalar>
auto basic_patch_embedding<Scalar>::parameters() -> std::vector<parameter_ref> {
  return {{"weight", &weight_, &weight_grad_, {dim_, channels_ * patch_ * patch_}}, {"bias", &b_, &b_grad_, {dim_}}};
}

template <class Scalar>
void basic_patch_embedding<Scalar>::reset_parameters(std::mt19937_64& rng) {
  default_init(weight_, &b_, channels_ * patch_ * patch_, rng);
}

template <class Scalar>
shape basic_patch_embedding<Scalar>::infer_shape(std::span<const shape> inputs) const {
  const shape& in = inputs[0];
  if (in.rank() != 3 || in[0] != channels_ || in[1] % patch_ || in[2] % patch_)
    throw this->mismatch(0, in, "[" + std::to_string(channels_) + ", H, W] with H and W multiples of the patch " +
                                    std::to_string(patch_));
  return shape{(in[1] / patch_) * (in[2] / patch_), dim_};
}

template <class Scalar>
auto basic_patch_embedding<Scalar>::compute(basic_ops<Scalar>& o, std::span<const array> in,
                                            std::span<const array> params, std::vector<array>&,
                                            const forward_context&) -> array {
  const array patches = o.patchify(in[0], patch_);  // [N, P, C·p²]
  const std::int64_t batch = patches.dims[0], count = patches.dims[1];
  const auto rows = o.reshape(patches, {batch * count, patches.dims[2]});
  return o.reshape(o.linear(rows, params[0], params[1]), {batch, count, dim_});
}

template class basic_patch_embedding<float>;
template class basic_patch_embedding<double>;

}  // namespace nerve::layers

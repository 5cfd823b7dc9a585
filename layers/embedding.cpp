#include "layers/embedding.hpp"

#include <cstdio>
#include <stdexcept>

#include "layers/init.hpp"

namespace nerve::layers {

namespace {

/// Every integer up to this is exact in a float: the largest vocabulary ids can name.
constexpr std::int64_t exact_ids = std::int64_t(1) << 24;

std::string id_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}


/// `vocab`, once the sizes are known to be ones an Embedding takes (before its table is made).
std::int64_t checked_vocab(std::int64_t vocab, std::int64_t dim) {
  if (vocab <= 0 || dim <= 0)
    throw std::invalid_argument("Embedding: vocab and dim must be positive, got vocab=" + std::to_string(vocab) +
                                " dim=" + std::to_string(dim));
  if (vocab > exact_ids)
    throw std::invalid_argument("Embedding: vocab " + std::to_string(vocab) +
                                " is over 16777216 (2^24): ids travel as floats, exact only up to there");
  return vocab;
}

/// `tokens`, once both are positive.
std::int64_t checked_tokens(std::int64_t tokens, std::int64_t dim) {
  if (tokens <= 0 || dim <= 0)
    throw std::invalid_argument("PositionalEmbedding: tokens and dim must be positive, got tokens=" +
                                std::to_string(tokens) + " dim=" + std::to_string(dim));
  return tokens;
}

}  // namespace

// ---- Embedding -----------------------------------------------------------------------

template <class Scalar>
basic_embedding<Scalar>::basic_embedding(std::int64_t vocab, std::int64_t dim, double init_std)
    : vocab_(checked_vocab(vocab, dim)), dim_(dim), init_std_(init_std), weight_(tensor_type::zeros(vocab, {dim})),
      weight_grad_(tensor_type::zeros(vocab, {dim})) {}

template <class Scalar>
auto basic_embedding<Scalar>::parameters() -> std::vector<parameter_ref> {
  return {{"weight", &weight_, &weight_grad_, {vocab_, dim_}}};
}

template <class Scalar>
void basic_embedding<Scalar>::reset_parameters(std::mt19937_64& rng) {
  normal_fill(weight_, init_std_, rng);
}

template <class Scalar>
shape basic_embedding<Scalar>::infer_shape(std::span<const shape> inputs) const {
  auto dims = inputs[0].dims();
  dims.push_back(dim_);
  return shape(std::move(dims));
}

template <class Scalar>
auto basic_embedding<Scalar>::compute(basic_ops<Scalar>& o, std::span<const array> in, std::span<const array> params,
                                      std::vector<array>&, const forward_context&) -> array {
  const array& ids = in[0];
  if (const auto bad = o.set().find_bad_id(ids.data, ids.size(), vocab_)) {
    const std::int64_t per_sample = ids.rows() ? ids.size() / ids.rows() : 1;
    throw std::invalid_argument(this->label() + ": id " + id_text(bad.value) + " at sample " +
                                std::to_string(bad.position / per_sample) + ", position " +
                                std::to_string(bad.position % per_sample) + " is not an integer in [0, " +
                                std::to_string(vocab_) + ")");
  }
  return o.gather_rows(params[0], ids);
}

// ---- PositionalEmbedding ---------------------------------------------------------------

template <class Scalar>
basic_positional_embedding<Scalar>::basic_positional_embedding(std::int64_t tokens, std::int64_t dim)
    : tokens_(checked_tokens(tokens, dim)), dim_(dim), weight_(tensor_type::zeros(1, {tokens, dim})),
      weight_grad_(tensor_type::zeros(1, {tokens, dim})) {}

template <class Scalar>
auto basic_positional_embedding<Scalar>::parameters() -> std::vector<parameter_ref> {
  return {{"weight", &weight_, &weight_grad_, {1, tokens_, dim_}}};
}

template <class Scalar>
void basic_positional_embedding<Scalar>::reset_parameters(std::mt19937_64& rng) {
  normal_fill(weight_, 0.02, rng);
}

template <class Scalar>
shape basic_positional_embedding<Scalar>::infer_shape(std::span<const shape> inputs) const {
  const shape want{tokens_, dim_};
  if (inputs[0] != want) throw this->mismatch(0, inputs[0], want.to_string());
  return inputs[0];
}

template <class Scalar>
auto basic_positional_embedding<Scalar>::compute(basic_ops<Scalar>& o, std::span<const array> in,
                                                 std::span<const array> params, std::vector<array>&,
                                                 const forward_context&) -> array {
  return o.add_row(in[0], params[0]);
}

template class basic_embedding<float>;
template class basic_embedding<double>;
template class basic_positional_embedding<float>;
template class basic_positional_embedding<double>;

}  // namespace nerve::layers

#pragma once
// Finite-difference gradient checks in double precision, shared by the layers tests.

#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

#include "layers/layer.hpp"

namespace nerve::layers::testing {

/// A tensor of `batch` samples of `s` with values uniform in [lo, hi), from `seed`.
inline tensor_d random_tensor(std::int64_t batch, shape s, std::uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937_64 rng(seed);
  tensor_d t(batch, std::move(s));
  for (std::int64_t i = 0; i < t.size(); ++i) t.data()[i] = lo + (hi - lo) * (double(rng() >> 11) * 0x1.0p-53);
  return t;
}

inline std::vector<tensor_d> clones(const std::vector<tensor_d>& v) {
  std::vector<tensor_d> out;
  for (const auto& t : v) out.push_back(t.clone());
  return out;
}

/// True when `a` and `b` agree to `rel` relative to max(1, |a|, |b|).
inline bool close(double a, double b, double rel) {
  return std::abs(a - b) <= rel * std::max({1.0, std::abs(a), std::abs(b)});
}

/// Checks every input and parameter gradient of `l` against central differences
/// of L = Σ r ⊙ forward(inputs), r random. Also checks that B + W split equals
/// the full backward, and that a second backward accumulates (doubles) the
/// parameter gradients. Returns the number of scalars checked.
inline std::size_t gradcheck(basic_layer<double>& l, const std::vector<tensor_d>& inputs, std::uint64_t seed = 99,
                             double h = 1e-6, double tol = 1e-7) {
  const forward_context ctx{3, 5};
  auto first = l.forward(clones(inputs), ctx);
  const tensor_d r = random_tensor(first.output.batch(), first.output.sample_shape(), seed);
  auto objective = [&] {
    auto o = l.forward(clones(inputs), ctx).output;
    return (o.matrix().array() * r.matrix().array()).sum();
  };
  auto params = l.parameters();

  // B and W separately, then the full backward: identical results.
  l.zero_grad();
  auto split_in = l.backward_input(first.stash, r);
  l.backward_weight(first.stash, r);
  std::vector<tensor_d> split_params;
  for (auto& p : params) split_params.push_back(p.grad->clone());
  l.zero_grad();
  auto grads = l.backward(std::move(first.stash), r);
  REQUIRE(grads.size() == inputs.size());
  for (std::size_t k = 0; k < grads.size(); ++k) CHECK(grads[k].matrix() == split_in[k].matrix());
  for (std::size_t k = 0; k < params.size(); ++k) CHECK(params[k].grad->matrix() == split_params[k].matrix());

  std::size_t checked = 0;
  std::vector<tensor_d> x = clones(inputs);
  auto objective_x = [&] {
    auto o = l.forward(clones(x), ctx).output;
    return (o.matrix().array() * r.matrix().array()).sum();
  };
  for (std::size_t k = 0; k < x.size(); ++k) {
    REQUIRE(grads[k].batch() == x[k].batch());
    REQUIRE(grads[k].sample_shape() == x[k].sample_shape());
    for (std::int64_t i = 0; i < x[k].size(); ++i) {
      const double v = x[k].data()[i];
      x[k].data()[i] = v + h;
      const double lp = objective_x();
      x[k].data()[i] = v - h;
      const double lm = objective_x();
      x[k].data()[i] = v;
      const double numeric = (lp - lm) / (2 * h);
      INFO(l.label(), " input ", k, " element ", i, " analytic ", grads[k].data()[i], " numeric ", numeric);
      CHECK(close(grads[k].data()[i], numeric, tol));
      ++checked;
    }
  }
  for (auto& p : params) {
    for (std::int64_t i = 0; i < p.value->size(); ++i) {
      const double v = p.value->data()[i];
      p.value->data()[i] = v + h;
      const double lp = objective();
      p.value->data()[i] = v - h;
      const double lm = objective();
      p.value->data()[i] = v;
      const double numeric = (lp - lm) / (2 * h);
      INFO(l.label(), " parameter ", p.name, " element ", i, " analytic ", p.grad->data()[i], " numeric ", numeric);
      CHECK(close(p.grad->data()[i], numeric, tol));
      ++checked;
    }
  }

  // Accumulation: a second backward of the same micro-batch adds the same amount again.
  std::vector<tensor_d> once;
  for (auto& p : params) once.push_back(p.grad->clone());
  auto again = l.forward(clones(inputs), ctx);
  l.backward(std::move(again.stash), r);
  for (std::size_t k = 0; k < params.size(); ++k) {
    const double err = (params[k].grad->matrix() - 2.0 * once[k].matrix()).cwiseAbs().maxCoeff();
    CHECK(err <= 1e-12 * std::max(1.0, once[k].matrix().cwiseAbs().maxCoeff()));
  }
  return checked;
}

}  // namespace nerve::layers::testing

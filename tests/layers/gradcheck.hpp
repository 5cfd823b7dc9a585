#pragma once
// The library's gradient checker (layers/gradcheck.hpp) as doctest assertions, for the
// layers tests: one CHECK per input and parameter, with the report's line as context.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "layers/gradcheck.hpp"

namespace nerve::layers::testing {

using layers::random_tensor;

/// True when `a` and `b` agree to `rel` relative to max(1, |a|, |b|) (the checker's rule).
inline bool close(double a, double b, double rel) {
  return std::abs(a - b) <= rel * std::max({1.0, std::abs(a), std::abs(b)});
}

/// `check_gradients(l, inputs)` with every part of its report asserted: each input and
/// parameter within `tol`, B + W equal to the full backward, and accumulation. Returns
/// the number of scalars checked.
inline std::size_t gradcheck(basic_layer<double>& l, const std::vector<tensor_d>& inputs, std::uint64_t seed = 99,
                             double h = 1e-6, double tol = 1e-7) {
  gradcheck_options options;
  options.step = h;
  options.tolerance = tol;
  options.seed = seed;
  const auto report = check_gradients(l, inputs, options);
  INFO(report.to_string());
  CHECK(report.inputs.size() == inputs.size());
  for (const auto& c : report.inputs) {
    INFO(c.to_string());
    CHECK(c.passed);
  }
  for (const auto& c : report.parameters) {
    INFO(c.to_string());
    CHECK(c.passed);
  }
  CHECK(report.split_matches);
  CHECK(report.accumulates);
  return static_cast<std::size_t>(report.checked());
}

}  // namespace nerve::layers::testing

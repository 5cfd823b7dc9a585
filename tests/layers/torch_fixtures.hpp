#pragma once
// Reading the PyTorch parity fixtures (tests/layers/fixtures/torch_*.safetensors, written by
// scripts/torch_reference*.py): one set of helpers for every parity test of layers_test.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "layers/checkpoint/safetensors.hpp"
#include "layers/tensor.hpp"

namespace nerve::layers::testing {

/// Fixture `torch_<name>.safetensors`.
inline checkpoint::safetensors_file torch_fixture(const std::string& name) {
  return checkpoint::safetensors_file::read(std::filesystem::path(NERVE_LAYERS_FIXTURES) /
                                            ("torch_" + name + ".safetensors"));
}

/// Tensor `name` of `f` as a nerve tensor: the first dimension is the batch (none: 1).
inline tensor fixture_tensor(const checkpoint::safetensors_file& f, const std::string& name) {
  const auto& info = f.at(name);
  auto values = f.to_float(info);
  std::vector<std::int64_t> dims(info.shape.begin(), info.shape.end());
  const std::int64_t batch = dims.empty() ? 1 : dims[0];
  if (!dims.empty()) dims.erase(dims.begin());
  tensor t(batch, shape(dims));
  REQUIRE(std::int64_t(values.size()) == t.size());
  std::copy(values.begin(), values.end(), t.data());
  return t;
}

/// Copies fixture tensor `name` into a parameter or buffer of the same size.
inline void fixture_assign(const checkpoint::safetensors_file& f, const std::string& name, tensor& target) {
  auto values = f.to_float(f.at(name));
  REQUIRE(std::int64_t(values.size()) == target.size());
  std::copy(values.begin(), values.end(), target.data());
}

/// The ∞-norm relative error of `got` against `want`: max|Δ| / max|want| (max|Δ| if want is 0).
inline double max_relative_error(const float* got, const float* want, std::int64_t n) {
  double diff = 0, scale = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::abs(double(got[i]) - double(want[i])));
    scale = std::max(scale, std::abs(double(want[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

/// `got` against fixture tensor `name`, as `max_relative_error`.
inline double fixture_error(const tensor& got, const checkpoint::safetensors_file& f, const std::string& name) {
  const tensor want = fixture_tensor(f, name);
  REQUIRE(got.size() == want.size());
  return max_relative_error(got.data(), want.data(), got.size());
}

/// Checks `got` within `tolerance` (relative, as `max_relative_error`) of fixture tensor `name`.
inline void check_fixture_close(const tensor& got, const checkpoint::safetensors_file& f, const std::string& name,
                                double tolerance = 1e-5) {
  const double err = fixture_error(got, f, name);
  INFO(name, ": relative error ", err);
  CHECK(err <= tolerance);
}

}  // namespace nerve::layers::testing

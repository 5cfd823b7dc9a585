// nerve against PyTorch 1.13: fixtures written by scripts/torch_reference.py (safetensors).
//
// Relative error is the ∞-norm one, max|nerve − torch| / max|torch|, per tensor,
// and must be at most 1e-5 in float32.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>

#include "layers/activation.hpp"
#include "layers/checkpoint/safetensors.hpp"
#include "layers/conv2d.hpp"
#include "layers/executor.hpp"
#include "layers/linear.hpp"
#include "layers/loss.hpp"
#include "layers/norm.hpp"
#include "layers/pool.hpp"
#include "layers/presets.hpp"

using namespace nerve::layers;
using nerve::checkpoint::safetensors_file;

namespace {

constexpr double tolerance = 1e-5;

safetensors_file fixture(const std::string& name) {
  return safetensors_file::read(std::filesystem::path(NERVE_LAYERS_FIXTURES) / ("torch_" + name + ".safetensors"));
}

/// Tensor `name` of `f` as a nerve tensor: the first dimension is the batch.
tensor load(const safetensors_file& f, const std::string& name) {
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
void assign(const safetensors_file& f, const std::string& name, tensor& target) {
  auto values = f.to_float(f.at(name));
  REQUIRE(std::int64_t(values.size()) == target.size());
  std::copy(values.begin(), values.end(), target.data());
}

double relative_error(const float* got, const float* want, std::int64_t n) {
  double diff = 0, scale = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::abs(double(got[i]) - double(want[i])));
    scale = std::max(scale, std::abs(double(want[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

void check_close(const tensor& got, const safetensors_file& f, const std::string& name) {
  const tensor want = load(f, name);
  REQUIRE(got.size() == want.size());
  const double err = relative_error(got.data(), want.data(), got.size());
  INFO(name, ": relative error ", err);
  CHECK(err <= tolerance);
}

/// Forward the fixture's `x` through `l`, backward its `grad_out`, compare `out` and `grad_x`.
void check_layer(layer& l, const safetensors_file& f) {
  l.zero_grad();
  auto r = l.forward(load(f, "x"));
  check_close(r.output, f, "out");
  auto g = l.backward(std::move(r.stash), load(f, "grad_out"));
  check_close(g[0], f, "grad_x");
}

}  // namespace

TEST_SUITE("layers.parity") {
  TEST_CASE("Linear matches PyTorch") {
    auto f = fixture("linear");
    linear l(5, 3);
    assign(f, "weight", l.weight());
    assign(f, "bias", l.bias());
    check_layer(l, f);
    check_close(l.weight_grad(), f, "grad_weight");
    check_close(l.bias_grad(), f, "grad_bias");
  }

  TEST_CASE("Conv2d matches PyTorch") {
    auto f = fixture("conv2d");
    conv2d c(2, 3, 3, 2, 1);
    assign(f, "weight", c.weight());
    assign(f, "bias", c.bias());
    check_layer(c, f);
    check_close(c.weight_grad(), f, "grad_weight");
    check_close(c.bias_grad(), f, "grad_bias");
  }

  TEST_CASE("LayerNorm matches PyTorch") {
    auto f = fixture("layer_norm");
    layer_norm ln(shape{6});
    assign(f, "weight", ln.weight());
    assign(f, "bias", ln.bias());
    check_layer(ln, f);
    check_close(ln.weight_grad(), f, "grad_weight");
    check_close(ln.bias_grad(), f, "grad_bias");
  }

  TEST_CASE("BatchNorm matches PyTorch, running statistics included") {
    auto f = fixture("batch_norm");
    batch_norm bn(3);
    assign(f, "weight", bn.weight());
    assign(f, "bias", bn.bias());
    check_layer(bn, f);
    check_close(bn.weight_grad(), f, "grad_weight");
    check_close(bn.bias_grad(), f, "grad_bias");
    check_close(bn.running_mean(), f, "running_mean");
    check_close(bn.running_var(), f, "running_var");
  }

  TEST_CASE("GELU matches PyTorch") {
    auto f = fixture("gelu");
    gelu g;
    check_layer(g, f);
  }

  TEST_CASE("MaxPool2d matches PyTorch") {
    auto f = fixture("max_pool2d");
    max_pool2d p(3, 2, 1);
    check_layer(p, f);
  }

  TEST_CASE("CrossEntropy matches PyTorch") {
    auto f = fixture("cross_entropy");
    auto logits = load(f, "logits");
    targets t;
    for (auto v : f.to_int64(f.at("labels"))) t.labels.push_back(std::int32_t(v));
    cross_entropy ce;
    auto r = ce.forward(logits, t);
    const float want = load(f, "loss").data()[0];
    CHECK(std::abs(r.loss - want) <= tolerance * std::abs(want));
    check_close(ce.backward(r.stash), f, "grad_logits");
  }

  TEST_CASE("one SGD step of mlp matches PyTorch") {
    auto f = fixture("mlp_step");
    auto g = make_preset("mlp");
    // The fixture's initial weights: bound·sin(0.7·i + 0.3·k) for the k-th parameter, rounded to float.
    auto params = g.parameters();
    for (std::size_t k = 0; k < params.size(); ++k) {
      const double bound = 1.0 / std::sqrt(params[k].name.starts_with("fc1") ? 784.0 : 256.0);
      for (std::int64_t i = 0; i < params[k].value->size(); ++i)
        params[k].value->data()[i] = float(bound * std::sin(0.7 * double(i) + 0.3 * double(k)));
    }
    direct_executor ex(g);
    targets t;
    for (auto v : f.to_int64(f.at("labels"))) t.labels.push_back(std::int32_t(v));
    cross_entropy ce;
    sgd opt(sgd_options{0.1, 0.9, 0.0, 1e-4});
    auto r = ex.train_step(load(f, "x"), t, ce, opt);
    const float want_loss = load(f, "loss").data()[0];
    CHECK(std::abs(r.loss - want_loss) <= tolerance * std::abs(want_loss));

    auto& fc1 = g.layer<linear>("fc1");
    const tensor rows = load(f, "fc1.weight.rows0_16");
    CHECK(relative_error(fc1.weight().data(), rows.data(), rows.size()) <= tolerance);
    const tensor sums = load(f, "fc1.weight.row_sums");
    std::vector<float> ours(256);
    for (int o = 0; o < 256; ++o) ours[o] = float(fc1.weight().matrix().row(o).cast<double>().sum());
    CHECK(relative_error(ours.data(), sums.data(), 256) <= tolerance);
    check_close(fc1.bias(), f, "fc1.bias");
    check_close(g.layer<linear>("fc2").weight(), f, "fc2.weight");
    check_close(g.layer<linear>("fc2").bias(), f, "fc2.bias");
  }
}

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
#include "tests/layers/torch_fixtures.hpp"

using namespace nerve::layers;
using nerve::checkpoint::safetensors_file;
using nerve::layers::testing::check_fixture_close;
using nerve::layers::testing::fixture_assign;
using nerve::layers::testing::fixture_error;
using nerve::layers::testing::fixture_tensor;
using nerve::layers::testing::max_relative_error;
using nerve::layers::testing::torch_fixture;

namespace {

constexpr double tolerance = 1e-5;

/// Forward the fixture's `x` through `l`, backward its `grad_out`, compare `out` and `grad_x`.
void check_layer(layer& l, const safetensors_file& f) {
  l.zero_grad();
  auto r = l.forward(fixture_tensor(f, "x"));
  check_fixture_close(r.output, f, "out");
  auto g = l.backward(std::move(r.stash), fixture_tensor(f, "grad_out"));
  check_fixture_close(g[0], f, "grad_x");
}

}  // namespace

TEST_SUITE("layers.parity") {
  TEST_CASE("Linear matches PyTorch") {
    auto f = torch_fixture("linear");
    linear l(5, 3);
    fixture_assign(f, "weight", l.weight());
    fixture_assign(f, "bias", l.bias());
    check_layer(l, f);
    check_fixture_close(l.weight_grad(), f, "grad_weight");
    check_fixture_close(l.bias_grad(), f, "grad_bias");
  }

  TEST_CASE("Conv2d matches PyTorch") {
    auto f = torch_fixture("conv2d");
    conv2d c(2, 3, 3, 2, 1);
    fixture_assign(f, "weight", c.weight());
    fixture_assign(f, "bias", c.bias());
    check_layer(c, f);
    check_fixture_close(c.weight_grad(), f, "grad_weight");
    check_fixture_close(c.bias_grad(), f, "grad_bias");
  }

  TEST_CASE("LayerNorm matches PyTorch") {
    auto f = torch_fixture("layer_norm");
    layer_norm ln(shape{6});
    fixture_assign(f, "weight", ln.weight());
    fixture_assign(f, "bias", ln.bias());
    check_layer(ln, f);
    check_fixture_close(ln.weight_grad(), f, "grad_weight");
    check_fixture_close(ln.bias_grad(), f, "grad_bias");
  }

  TEST_CASE("BatchNorm matches PyTorch, running statistics included") {
    auto f = torch_fixture("batch_norm");
    batch_norm bn(3);
    fixture_assign(f, "weight", bn.weight());
    fixture_assign(f, "bias", bn.bias());
    check_layer(bn, f);
    check_fixture_close(bn.weight_grad(), f, "grad_weight");
    check_fixture_close(bn.bias_grad(), f, "grad_bias");
    check_fixture_close(bn.running_mean(), f, "running_mean");
    check_fixture_close(bn.running_var(), f, "running_var");
  }

  TEST_CASE("GELU matches PyTorch") {
    auto f = torch_fixture("gelu");
    gelu g;
    check_layer(g, f);
  }

  TEST_CASE("MaxPool2d matches PyTorch") {
    auto f = torch_fixture("max_pool2d");
    max_pool2d p(3, 2, 1);
    check_layer(p, f);
  }

  TEST_CASE("CrossEntropy matches PyTorch") {
    auto f = torch_fixture("cross_entropy");
    auto logits = fixture_tensor(f, "logits");
    targets t;
    for (auto v : f.to_int64(f.at("labels"))) t.labels.push_back(std::int32_t(v));
    cross_entropy ce;
    auto r = ce.forward(logits, t);
    const float want = fixture_tensor(f, "loss").data()[0];
    CHECK(std::abs(r.loss - want) <= tolerance * std::abs(want));
    check_fixture_close(ce.backward(r.stash), f, "grad_logits");
  }

  TEST_CASE("one SGD step of mlp matches PyTorch") {
    auto f = torch_fixture("mlp_step");
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
    auto r = ex.train_step(fixture_tensor(f, "x"), t, ce, opt);
    const float want_loss = fixture_tensor(f, "loss").data()[0];
    CHECK(std::abs(r.loss - want_loss) <= tolerance * std::abs(want_loss));

    auto& fc1 = g.layer<linear>("fc1");
    const tensor rows = fixture_tensor(f, "fc1.weight.rows0_16");
    CHECK(max_relative_error(fc1.weight().data(), rows.data(), rows.size()) <= tolerance);
    const tensor sums = fixture_tensor(f, "fc1.weight.row_sums");
    std::vector<float> ours(256);
    for (int o = 0; o < 256; ++o) ours[o] = float(fc1.weight().matrix().row(o).cast<double>().sum());
    CHECK(max_relative_error(ours.data(), sums.data(), 256) <= tolerance);
    check_fixture_close(fc1.bias(), f, "fc1.bias");
    check_fixture_close(g.layer<linear>("fc2").weight(), f, "fc2.weight");
    check_fixture_close(g.layer<linear>("fc2").bias(), f, "fc2.bias");
  }
}

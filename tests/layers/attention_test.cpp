// Multi-head self-attention (layers/attention.hpp): finite differences in double, PyTorch
// parity (fixtures from scripts/torch_reference_attention.py), causal masking, and the
// refusals at construction and wiring.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <random>
#include <string>

#include "layers/attention.hpp"
#include "layers/checkpoint/safetensors.hpp"
#include "layers/graph.hpp"
#include "tests/layers/gradcheck.hpp"
#include "tests/layers/torch_fixtures.hpp"

using namespace nerve::layers;
using nerve::layers::testing::check_fixture_close;
using nerve::layers::testing::fixture_assign;
using nerve::layers::testing::fixture_error;
using nerve::layers::testing::fixture_tensor;
using nerve::layers::testing::max_relative_error;
using nerve::layers::testing::torch_fixture;
using nerve::checkpoint::safetensors_file;
using nerve::layers::testing::random_tensor;

namespace {

}  // namespace

TEST_SUITE("layers.attention") {
  TEST_CASE("MultiheadAttention matches PyTorch forward and backward, causal and not") {
    for (const std::string name : {"attention", "attention_causal"}) {
      CAPTURE(name);
      const auto f = safetensors_file::read(std::filesystem::path(NERVE_LAYERS_FIXTURES) /
                                            ("torch_" + name + ".safetensors"));
      multihead_attention l(12, 3, name == "attention_causal");
      for (auto& p : l.parameters()) {
        auto values = f.to_float(f.at(p.name));
        REQUIRE(std::int64_t(values.size()) == p.value->size());
        std::copy(values.begin(), values.end(), p.value->data());
      }
      l.zero_grad();
      auto r = l.forward(fixture_tensor(f, "x"));
      CHECK(r.output.sample_shape() == shape{5, 12});
      CHECK(fixture_error(r.output, f, "out") <= 1e-5);
      auto g = l.backward(std::move(r.stash), fixture_tensor(f, "grad_out"));
      CHECK(fixture_error(g[0], f, "grad_x") <= 1e-5);
      for (auto& p : l.parameters()) {
        CAPTURE(p.name);
        CHECK(fixture_error(*p.grad, f, "grad_" + p.name) <= 1e-5);
      }
    }
  }

  TEST_CASE("MultiheadAttention's backward matches finite differences, inputs and parameters, causal and not") {
    using nerve::layers::testing::gradcheck;
    for (bool causal : {false, true}) {
      CAPTURE(causal);
      basic_multihead_attention<double> l(6, 2, causal);
      std::mt19937_64 rng(5);
      l.reset_parameters(rng);
      std::vector<tensor_d> in;
      in.push_back(random_tensor(2, {4, 6}, 7));
      // 48 inputs, then 3·6·6 + 18 + 6·6 + 6 parameters.
      CHECK(gradcheck(l, in) == 48 + 108 + 18 + 36 + 6);
    }
  }

  TEST_CASE("causal attention's token i depends on tokens 0 to i only") {
    multihead_attention l(8, 2, true);
    std::mt19937_64 rng(3);
    l.reset_parameters(rng);
    const auto x = random_tensor(1, {6, 8}, 9).cast<float>();
    auto later = x.clone();
    for (std::int64_t c = 0; c < 8; ++c) later.data()[4 * 8 + c] += 1.0f;  // token 4 changes
    const auto a = l.forward(x.clone()).output, b = l.forward(later.clone()).output;
    for (std::int64_t i = 0; i < 6 * 8; ++i) {
      CAPTURE(i);
      if (i < 4 * 8)
        CHECK(a.data()[i] == b.data()[i]);  // tokens 0…3 never see token 4
      else
        CHECK(a.data()[i] != b.data()[i]);
    }
  }

  TEST_CASE("attention of large scores stays finite at every length, causal and not") {
    for (bool causal : {false, true})
      for (std::int64_t t : {1, 2, 7, 24}) {
        CAPTURE(causal);
        CAPTURE(t);
        multihead_attention l(4, 2, causal);
        std::mt19937_64 rng{std::uint64_t(t)};
        l.reset_parameters(rng);
        // Scores of about ±10⁴: exp overflows unless each row's maximum is subtracted.
        auto x = random_tensor(2, {t, 4}, 11, -300, 300).cast<float>();
        auto r = l.forward(std::move(x));
        auto g = l.backward(std::move(r.stash), random_tensor(2, {t, 4}, 13).cast<float>());
        for (std::int64_t i = 0; i < r.output.size(); ++i) CHECK(std::isfinite(r.output.data()[i]));
        for (std::int64_t i = 0; i < g[0].size(); ++i) CHECK(std::isfinite(g[0].data()[i]));
        for (auto& p : l.parameters())
          for (std::int64_t i = 0; i < p.grad->size(); ++i) CHECK(std::isfinite(p.grad->data()[i]));
      }
  }

  TEST_CASE("MultiheadAttention refuses a width its heads do not divide, and a sample that is not [T, C]") {
    CHECK_THROWS_WITH_AS(multihead_attention(10, 4),
                         "MultiheadAttention: dim 10 is not divisible by heads 4 (each head takes dim / heads features)",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(multihead_attention(8, 0),
                         "MultiheadAttention: dim and heads must be positive, got dim=8 heads=0", std::invalid_argument);
    graph_builder b;
    b.input("tokens", {16, 6});
    b.add("attn", std::make_unique<multihead_attention>(8, 2), {"tokens"});
    try {
      b.build(1);
      FAIL("built");
    } catch (const wiring_error& e) {
      CHECK(std::string(e.what()).find("attn (MultiheadAttention): input 0 has shape [16, 6], expected [T, 8]") !=
            std::string::npos);
    }
    graph_builder good;
    good.input("tokens", {16, 8});
    good.add("attn", std::make_unique<multihead_attention>(8, 2, true), {"tokens"});
    auto g = good.build(1);
    CHECK(g.nodes()[g.output()].output_shape == shape{16, 8});
    std::vector<std::string> names;
    for (auto& p : g.parameters()) names.push_back(p.name);
    CHECK(names == std::vector<std::string>{"attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight", "attn.proj.bias"});
  }
}

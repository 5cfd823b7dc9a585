// Samples with a sequence dimension, [T, F]: Linear and LayerNorm work on each token as
// PyTorch's do (the last dimension is the features, the ones before it are rows of their
// own), so a transformer's blocks can be wired from them.
#include <doctest/doctest.h>

#include "layers/activation.hpp"
#include "layers/graph.hpp"
#include "layers/init.hpp"
#include "layers/linear.hpp"
#include "layers/norm.hpp"
#include "tests/layers/gradcheck.hpp"

#include <memory>
#include <random>
#include <string>

using namespace nerve::layers;
using nerve::layers::testing::random_tensor;

namespace {

bool same_bits(const tensor& a, const tensor& b) {
  return a.size() == b.size() && std::equal(a.data(), a.data() + a.size(), b.data());
}

/// `t` (`[N, T, F]`) as `[N·T, F]`: each token a sample.
tensor tokens_as_samples(const tensor& t) {
  tensor out(t.size() / t.sample_shape()[t.sample_shape().rank() - 1],
             shape{t.sample_shape()[t.sample_shape().rank() - 1]});
  std::copy(t.data(), t.data() + t.size(), out.data());
  return out;
}

/// Runs `seq` on `x` (`[N, T, F]`) and `flat` (the same weights) on its tokens as samples;
/// both outputs, input gradients and parameter gradients must have the same bits.
void check_per_token(layer& seq, layer& flat, const tensor& x, std::uint64_t seed) {
  auto a = seq.forward(x.clone());
  auto b = flat.forward(tokens_as_samples(x));
  REQUIRE(a.output.size() == b.output.size());
  CHECK(a.output.sample_shape().rank() == x.sample_shape().rank());
  CHECK(same_bits(tokens_as_samples(a.output), b.output));
  const auto dy = random_tensor(x.batch(), a.output.sample_shape(), seed).cast<float>();
  auto ga = seq.backward(std::move(a.stash), dy);
  auto gb = flat.backward(std::move(b.stash), tokens_as_samples(dy));
  REQUIRE(ga.size() == 1);
  CHECK(ga[0].sample_shape() == x.sample_shape());
  CHECK(same_bits(tokens_as_samples(ga[0]), gb[0]));
  auto pa = seq.parameters(), pb = flat.parameters();
  REQUIRE(pa.size() == pb.size());
  for (std::size_t i = 0; i < pa.size(); ++i) {
    CAPTURE(pa[i].name);
    CHECK(pa[i].grad->size() > 0);
    CHECK(same_bits(*pa[i].grad, *pb[i].grad));
  }
}

}  // namespace

TEST_SUITE("layers.tokens") {
  TEST_CASE("Linear on [T, in] samples is Linear on each token: the same bits") {
    for (auto s : {shape{4, 6}, shape{2, 3, 6}}) {
      CAPTURE(s.to_string());
      linear seq(6, 5), flat(6, 5);
      std::mt19937_64 rng(3), same(3);
      seq.reset_parameters(rng);
      flat.reset_parameters(same);
      check_per_token(seq, flat, random_tensor(3, s, 5).cast<float>(), 7);
    }
  }

  TEST_CASE("LayerNorm of [F] on [T, F] samples normalises each token: the same bits") {
    layer_norm seq(shape{6}), flat(shape{6});
    std::mt19937_64 rng(9);
    std::normal_distribution<float> d;
    for (auto* l : {&seq, &flat}) {  // weights away from ones and zeros, the same in both
      rng.seed(9);
      for (auto& p : l->parameters())
        for (std::int64_t i = 0; i < p.value->size(); ++i) p.value->data()[i] = d(rng);
    }
    check_per_token(seq, flat, random_tensor(3, {4, 6}, 11).cast<float>(), 13);
  }

  TEST_CASE("per-token backward matches finite differences") {
    using nerve::layers::testing::gradcheck;
    basic_linear<double> lin(3, 5);
    std::mt19937_64 rng(17);
    lin.reset_parameters(rng);
    std::vector<tensor_d> in;
    in.push_back(random_tensor(2, {4, 3}, 19));
    CHECK(gradcheck(lin, in) > 0);
    basic_layer_norm<double> ln(shape{3});
    for (auto& p : ln.parameters()) uniform_fill(*p.value, 1.0, rng);
    in.clear();
    in.push_back(random_tensor(2, {2, 4, 3}, 23));
    CHECK(gradcheck(ln, in) > 0);
  }

  TEST_CASE("a block of [T, F] wires: the shapes follow the tokens, and a wrong one is named") {
    graph_builder b;
    b.input("tokens", {16, 8});
    b.add("ln", std::make_unique<layer_norm>(shape{8}), {"tokens"});
    b.add("fc1", std::make_unique<linear>(8, 32), {"ln"});
    b.add("act", std::make_unique<gelu>(), {"fc1"});
    b.add("fc2", std::make_unique<linear>(32, 8), {"act"});
    auto g = b.build(1);
    CHECK(g.nodes()[g.output()].output_shape == shape{16, 8});

    graph_builder bad;
    bad.input("image", {1, 28, 28});
    bad.add("fc", std::make_unique<linear>(784, 10), {"image"});
    try {
      bad.build(1);
      FAIL("built");
    } catch (const wiring_error& e) {
      CHECK(std::string(e.what()).find("fc (Linear): input 0 has shape [1, 28, 28], expected […, 784] (put a Flatten "
                                       "in front to take [1, 28, 28] as one vector)") != std::string::npos);
    }
    graph_builder norm;
    norm.input("tokens", {16, 8});
    norm.add("ln", std::make_unique<layer_norm>(shape{16}), {"tokens"});
    try {
      norm.build(1);
      FAIL("built");
    } catch (const wiring_error& e) {
      CHECK(std::string(e.what()).find("ln (LayerNorm): input 0 has shape [16, 8], expected […, 16]") !=
            std::string::npos);
    }
  }
}

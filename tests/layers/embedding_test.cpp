// The layers that turn tokens and images into sequences (#36): Embedding,
// PositionalEmbedding, ClassToken, SelectToken and PatchEmbedding. Gradient checks in
// double, refusals, and parity with PyTorch 1.13 (fixtures by
// scripts/torch_reference_embed.py; relative ∞-norm error at most 1e-5 in float32).
#include <doctest/doctest.h>

#include "actors/runtime.hpp"
#include "layers/checkpoint/safetensors.hpp"
#include "layers/class_token.hpp"
#include "layers/conv2d.hpp"
#include "layers/embedding.hpp"
#include "layers/graph.hpp"
#include "layers/init.hpp"
#include "layers/linear.hpp"
#include "layers/loss.hpp"
#include "layers/network.hpp"
#include "layers/optimizer.hpp"
#include "layers/patch_embedding.hpp"
#include "tests/layers/gradcheck.hpp"
#include "tests/layers/torch_fixtures.hpp"

#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>
#include <random>
#include <string>

using namespace nerve::layers;
using nerve::layers::testing::check_fixture_close;
using nerve::layers::testing::fixture_assign;
using nerve::layers::testing::fixture_error;
using nerve::layers::testing::fixture_tensor;
using nerve::layers::testing::max_relative_error;
using nerve::layers::testing::torch_fixture;
using nerve::checkpoint::safetensors_file;
using nerve::layers::testing::gradcheck;
using nerve::layers::testing::random_tensor;

namespace {

/// `batch` samples of `tokens` ids, each `ids[i]` in turn.
template <class Scalar = float>
basic_tensor<Scalar> id_tensor(std::int64_t batch, std::vector<double> ids) {
  basic_tensor<Scalar> t(batch, shape{std::int64_t(ids.size()) / batch});
  for (std::size_t i = 0; i < ids.size(); ++i) t.data()[i] = Scalar(ids[i]);
  return t;
}

/// A gradient check's single input.
std::vector<tensor_d> one_input(tensor_d t) {
  std::vector<tensor_d> v;
  v.push_back(std::move(t));
  return v;
}

/// `t` under another sample shape of as many values.
tensor reshaped(tensor t, shape s) {
  t.reshape(std::move(s));
  return t;
}

/// The message `l.forward(x)` throws (empty: none).
std::string refusal(layer& l, tensor x) {
  try {
    l.forward(std::move(x));
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return {};
}

/// The wiring error of `input` (a sample shape) into `l`.
std::string wiring_refusal(shape input, std::unique_ptr<layer> l) {
  graph_builder b;
  b.input("x", std::move(input));
  b.add("l", std::move(l), {"x"});
  try {
    b.build(1);
  } catch (const wiring_error& e) {
    return e.what();
  }
  return {};
}

}  // namespace

TEST_SUITE("layers.embedding") {
  TEST_CASE("Embedding looks up a row per id: [T] ids give [T, dim]") {
    embedding e(4, 3);
    for (std::int64_t i = 0; i < e.weight().size(); ++i) e.weight().data()[i] = float(i);
    auto r = e.forward(id_tensor(2, {3, 0, 0, 2}));
    CHECK(r.output.batch() == 2);
    CHECK(r.output.sample_shape() == shape{2, 3});
    const float want[] = {9, 10, 11, 0, 1, 2, 0, 1, 2, 6, 7, 8};
    CHECK(std::equal(want, want + 12, r.output.data()));
  }

  TEST_CASE("Embedding refuses an id that is no row, naming the layer, the id and its place") {
    embedding e(5, 2);
    e.set_name("wte");
    CHECK(refusal(e, id_tensor(2, {0, 1, 4, 5})) == "wte (Embedding): id 5 at sample 1, position 1 is not an "
                                                     "integer in [0, 5)");
    CHECK(refusal(e, id_tensor(1, {-1, 0})) == "wte (Embedding): id -1 at sample 0, position 0 is not an integer "
                                               "in [0, 5)");
    CHECK(refusal(e, id_tensor(3, {0, 1, 2.5})) == "wte (Embedding): id 2.5 at sample 2, position 0 is not an "
                                                   "integer in [0, 5)");
    CHECK(refusal(e, id_tensor(1, {std::numeric_limits<double>::quiet_NaN()})).find("id nan at sample 0") !=
          std::string::npos);
    CHECK(refusal(e, id_tensor(1, {4, 0})).empty());
    CHECK_THROWS_AS(embedding(std::int64_t(1) << 25, 8), std::invalid_argument);
  }

  TEST_CASE("a bad id ends a network's run with the Embedding's refusal") {
    graph_builder b;
    b.input("ids", {3});
    b.add("wte", embedding(5, 4), {"ids"});
    b.add("first", basic_select_token<float>(0), {"wte"});
    b.add("head", linear(4, 2), {"first"});
    auto g = b.build(1);
    nerve::actors::runtime rt({.loops = 1});
    network net(rt, g, std::make_shared<cross_entropy>(), [] { return std::make_unique<sgd>(sgd_options{0.1}); });
    targets y;
    y.labels = {0, 1};
    auto f = net.train_step(id_tensor(2, {0, 1, 2, 3, 9, 4}), std::move(y));
    CHECK_THROWS_WITH_AS(rt.synchronize(),
                         "actor 'wte' failed: wte (Embedding): id 9 at sample 1, position 1 is not an integer in [0, 5)",
                         nerve::actors::actor_failure);
    CHECK_THROWS(f.get());
  }

  TEST_CASE("Embedding's weight gradient matches finite differences, repeated ids summed") {
    basic_embedding<double> e(6, 4);
    std::mt19937_64 rng(5);
    e.reset_parameters(rng);
    std::vector<basic_tensor<double>> in;
    in.push_back(id_tensor<double>(3, {1, 5, 1, 0, 1, 3, 5, 5, 2, 0, 1, 4}));
    gradcheck_options o;
    o.perturbed = 0;  // ids: a step of h makes them no id at all
    const auto report = check_gradients(e, in, o);
    INFO(report.to_string());
    CHECK(report.passed());
    CHECK(report.parameters.at(0).checked == 24);
  }

  TEST_CASE("Embedding adds each row's tokens in order: the weight gradient has a serial sum's bits") {
    embedding e(3, 2);
    std::mt19937_64 rng(1);
    e.reset_parameters(rng);
    const std::vector<double> ids{2, 0, 2, 2, 1, 2, 0, 2};
    auto r = e.forward(id_tensor(2, ids));
    const auto dy = random_tensor(2, shape{4, 2}, 8).cast<float>();
    e.zero_grad();
    e.backward(std::move(r.stash), dy);
    std::vector<float> want(6, 0.0f);
    for (std::size_t t = 0; t < ids.size(); ++t)
      for (int c = 0; c < 2; ++c) want[std::size_t(ids[t]) * 2 + std::size_t(c)] += dy.data()[t * 2 + std::size_t(c)];
    CHECK(std::equal(want.begin(), want.end(), e.weight_grad().data()));
  }

  TEST_CASE("PositionalEmbedding adds its [1, T, dim] to every sample; other shapes fail at wiring") {
    basic_positional_embedding<double> p(3, 4);
    std::mt19937_64 rng(2);
    p.reset_parameters(rng);
    CHECK(gradcheck(p, one_input(random_tensor(2, shape{3, 4}, 3))) > 0);
    CHECK(p.parameters().at(0).torch_shape == std::vector<std::int64_t>{1, 3, 4});
    CHECK(wiring_refusal({5, 4}, std::make_unique<positional_embedding>(3, 4))
              .find("l (PositionalEmbedding): input 0 has shape [5, 4], expected [3, 4]") != std::string::npos);
  }

  TEST_CASE("ClassToken puts its token first: [T, C] gives [T + 1, C]") {
    class_token c(2);
    c.weight().data()[0] = 7, c.weight().data()[1] = 8;
    auto r = c.forward(reshaped(id_tensor(1, {1, 2, 3, 4}), shape{2, 2}));
    CHECK(r.output.sample_shape() == shape{3, 2});
    const float want[] = {7, 8, 1, 2, 3, 4};
    CHECK(std::equal(want, want + 6, r.output.data()));

    basic_class_token<double> d(3);
    std::mt19937_64 rng(4);
    normal_fill(d.weight(), 1.0, rng);
    CHECK(gradcheck(d, one_input(random_tensor(2, shape{4, 3}, 6))) > 0);
    CHECK(wiring_refusal({4, 5}, std::make_unique<class_token>(3))
              .find("l (ClassToken): input 0 has shape [4, 5], expected [T, 3]") != std::string::npos);
  }

  TEST_CASE("SelectToken takes one token; its gradient goes back to that row alone") {
    select_token s(1);
    auto r = s.forward(reshaped(id_tensor(1, {1, 2, 3, 4, 5, 6}), shape{3, 2}));
    CHECK(r.output.sample_shape() == shape{2});
    CHECK(r.output.data()[0] == 3);
    CHECK(r.output.data()[1] == 4);
    auto g = s.backward(std::move(r.stash), id_tensor(1, {10, 20}));
    const float want[] = {0, 0, 10, 20, 0, 0};
    CHECK(g.at(0).sample_shape() == shape{3, 2});
    CHECK(std::equal(want, want + 6, g[0].data()));

    basic_select_token<double> d(0);
    CHECK(gradcheck(d, one_input(random_tensor(3, shape{4, 5}, 9))) > 0);
    CHECK(wiring_refusal({3, 8}, std::make_unique<select_token>(3))
              .find("l (SelectToken): input 0 has shape [3, 8], expected [T, C] with T > 3") != std::string::npos);
  }

  TEST_CASE("PatchEmbedding is the patch-strided Conv2d with its weight reshaped, each patch a token") {
    const std::int64_t p = 3, dim = 5;
    patch_embedding pe(p, dim, 2);
    conv2d conv(2, dim, p, p);
    std::mt19937_64 rng(7);
    pe.reset_parameters(rng);
    std::copy(pe.weight().data(), pe.weight().data() + pe.weight().size(), conv.weight().data());
    std::copy(pe.bias().data(), pe.bias().data() + pe.bias().size(), conv.bias().data());
    const auto x = random_tensor(2, shape{2, 6, 9}, 11).cast<float>();
    auto a = pe.forward(x.clone());
    auto b = conv.forward(x.clone());  // [dim, 2, 3]: channel-major
    REQUIRE(a.output.sample_shape() == shape{6, dim});
    for (std::int64_t n = 0; n < 2; ++n)
      for (std::int64_t t = 0; t < 6; ++t)
        for (std::int64_t c = 0; c < dim; ++c) {
          CAPTURE(n);
          CAPTURE(t);
          CAPTURE(c);
          CHECK(a.output.data()[(n * 6 + t) * dim + c] ==
                doctest::Approx(b.output.data()[(n * dim + c) * 6 + t]).epsilon(1e-5));
        }

    basic_patch_embedding<double> d(2, 3);
    std::mt19937_64 r2(3);
    d.reset_parameters(r2);
    CHECK(gradcheck(d, one_input(random_tensor(2, shape{1, 4, 6}, 12))) > 0);
    CHECK(wiring_refusal({1, 28, 27}, std::make_unique<patch_embedding>(7, 64))
              .find("l (PatchEmbedding): input 0 has shape [1, 28, 27], expected [1, H, W] with H and W multiples of "
                    "the patch 7") != std::string::npos);
  }
}

TEST_SUITE("layers.parity") {
  TEST_CASE("Embedding matches PyTorch: forward and the weight's gradient") {
    auto f = torch_fixture("embedding");
    embedding e(7, 5);
    fixture_assign(f, "weight", e.weight());
    e.zero_grad();
    auto r = e.forward(fixture_tensor(f, "x"));
    check_fixture_close(r.output, f, "out");
    e.backward(std::move(r.stash), fixture_tensor(f, "grad_out"));
    check_fixture_close(e.weight_grad(), f, "grad_weight");
  }

  TEST_CASE("PatchEmbedding matches PyTorch's patch-strided Conv2d") {
    auto f = torch_fixture("patch_embedding");
    patch_embedding pe(7, 4);
    fixture_assign(f, "weight", pe.weight());
    fixture_assign(f, "bias", pe.bias());
    pe.zero_grad();
    auto r = pe.forward(fixture_tensor(f, "x"));
    check_fixture_close(r.output, f, "out");
    auto g = pe.backward(std::move(r.stash), fixture_tensor(f, "grad_out"));
    check_fixture_close(g.at(0), f, "grad_x");
    check_fixture_close(pe.weight_grad(), f, "grad_weight");
    check_fixture_close(pe.bias_grad(), f, "grad_bias");
  }

  TEST_CASE("ClassToken then PositionalEmbedding match PyTorch's cat and add") {
    auto f = torch_fixture("class_token_pos");
    class_token cls(4);
    positional_embedding pos(4, 4);
    fixture_assign(f, "cls", cls.weight());
    fixture_assign(f, "pos", pos.weight());
    cls.zero_grad(), pos.zero_grad();
    auto a = cls.forward(fixture_tensor(f, "x"));
    auto b = pos.forward(std::move(a.output));
    check_fixture_close(b.output, f, "out");
    auto gb = pos.backward(std::move(b.stash), fixture_tensor(f, "grad_out"));
    auto ga = cls.backward(std::move(a.stash), gb.at(0));
    check_fixture_close(ga.at(0), f, "grad_x");
    check_fixture_close(cls.weight_grad(), f, "grad_cls");
    check_fixture_close(pos.weight_grad(), f, "grad_pos");
  }
}

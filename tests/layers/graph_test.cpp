// Graph building, validation, the direct executor, hooks, micro-batches and determinism.
#include <doctest/doctest.h>

#include <set>

#include "layers/activation.hpp"
#include "layers/conv2d.hpp"
#include "layers/executor.hpp"
#include "layers/join.hpp"
#include "layers/linear.hpp"
#include "layers/norm.hpp"
#include "layers/presets.hpp"
#include "tests/layers/gradcheck.hpp"
#include "tests/layers/common.hpp"

using namespace nerve::layers;
using nerve::layers::testing::random_tensor;

namespace {

std::string wiring_message(graph_builder& b) {
  try {
    b.build();
  } catch (const wiring_error& e) {
    return e.what();
  }
  return "(no error)";
}

using nerve::layers::testing::contains;

tensor random_graph_input(std::int64_t n, shape s, std::uint64_t seed) { return random_tensor(n, std::move(s), seed).cast<float>(); }

using nerve::layers::testing::random_labels;

}  // namespace

TEST_SUITE("layers.graph") {
  TEST_CASE("presets name their parameters as PyTorch does") {
    auto mlp = make_preset("mlp", 1);
    auto p = mlp.parameters();
    REQUIRE(p.size() == 4);
    CHECK(p[0].name == "fc1.weight");
    CHECK(p[0].torch_shape == std::vector<std::int64_t>{256, 784});
    CHECK(p[1].name == "fc1.bias");
    CHECK(p[1].torch_shape == std::vector<std::int64_t>{256});
    CHECK(p[3].name == "fc2.bias");
    CHECK(mlp.parameter_count() == 784 * 256 + 256 + 256 * 10 + 10);

    auto lenet = make_preset("lenet", 1);
    std::vector<std::string> names;
    for (auto& q : lenet.parameters()) names.push_back(q.name);
    CHECK(names == std::vector<std::string>{"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc1.weight",
                                            "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"});
    CHECK(lenet.parameters()[0].torch_shape == std::vector<std::int64_t>{6, 1, 5, 5});
    CHECK(lenet.parameter_count() == 61706);  // LeNet-5 with padding 2 on 28×28, as torchvision-style scripts count it
    CHECK(lenet.nodes()[lenet.output()].output_shape == shape{10});

    auto deep = make_preset("deep-mlp", 1);
    CHECK(deep.parameters().size() == 10);
    CHECK(deep.parameters()[8].name == "fc5.weight");
    auto res = make_preset("resmlp", 1);
    CHECK(res.parameters().back().name == "fc6.bias");
    CHECK(res.node("add1").inputs.size() == 2);
    CHECK(res.node("relu1").consumers.size() == 2);  // fan-out into the block and the skip
    CHECK_THROWS_AS(make_preset("vgg"), std::invalid_argument);
  }

  TEST_CASE("initialisation is PyTorch's default scheme and seeded") {
    auto g = make_preset("mlp", 7);
    auto& fc1 = g.layer<linear>("fc1");
    const float bound = 1.0f / std::sqrt(784.0f);
    CHECK(fc1.weight().matrix().maxCoeff() <= bound);
    CHECK(fc1.weight().matrix().minCoeff() >= -bound);
    CHECK(fc1.weight().matrix().maxCoeff() > 0.95f * bound);
    CHECK(std::abs(fc1.weight().matrix().mean()) < 0.01f * bound);
    auto same = make_preset("mlp", 7);
    auto other = make_preset("mlp", 8);
    CHECK(same.layer<linear>("fc2").weight().matrix() == g.layer<linear>("fc2").weight().matrix());
    CHECK(other.layer<linear>("fc1").weight().matrix() != fc1.weight().matrix());
  }

  TEST_CASE("a shape mismatch names both layers and both shapes") {
    graph_builder b;
    b.input("input", {784});
    b.add("fc1", linear(784, 128), {"input"});
    b.add("relu1", relu(), {"fc1"});
    b.add("fc2", linear(256, 10), {"relu1"});
    const auto m = wiring_message(b);
    CAPTURE(m);
    CHECK(contains(m, "'relu1'"));
    CHECK(contains(m, "'fc2"));
    CHECK(contains(m, "[128]"));
    CHECK(contains(m, "expects […, 256] at input 0"));
  }

  TEST_CASE("a fan-in mismatch names the join and both producers") {
    graph_builder b;
    b.input("x", {8});
    b.add("a", linear(8, 4), {"x"});
    b.add("b", linear(8, 5), {"x"});
    b.add("sum", add(), {"a", "b"});
    const auto m = wiring_message(b);
    CAPTURE(m);
    CHECK(contains(m, "'a'"));
    CHECK(contains(m, "'b'"));
    CHECK(contains(m, "'sum"));
    CHECK(contains(m, "[5]"));
    CHECK(contains(m, "[4]"));
  }

  TEST_CASE("a join whose inputs disagree names every producer and its shape") {
    // A residual block where conv3 lost its padding: Add compares against input 0, so the
    // message must not blame the unchanged skip connection (act1) alone.
    //   input ─► conv1 ─► act1 ─┬─► conv2 ─► act2 ─► conv3 ─► add1
    //                           └──────────────────────────────┘
    graph_builder b;
    b.input("input", {1, 28, 28});
    b.add("conv1", conv2d(1, 8, 3, 1, 1), {"input"});
    b.add("act1", relu(), {"conv1"});
    b.add("conv2", conv2d(8, 8, 3, 1, 1), {"act1"});
    b.add("act2", relu(), {"conv2"});
    b.add("conv3", conv2d(8, 8, 3, 1, 0), {"act2"});  // padding 0: [8, 26, 26]
    b.add("add1", add(), {"conv3", "act1"});
    CHECK(wiring_message(b) ==
          "graph: shape mismatch at 'add1 (Add)', whose inputs do not fit together: got 'conv3' [8, 26, 26] (input 0) "
          "and 'act1' [8, 28, 28] (input 1) (add1 (Add): input 1 has shape [8, 28, 28], expected [8, 26, 26] (the "
          "shape of input 0))");

    SUBCASE("three inputs are all listed") {
      graph_builder c;
      c.input("x", {8});
      c.add("a", linear(8, 4), {"x"});
      c.add("b", linear(8, 4), {"x"});
      c.add("c", linear(8, 3), {"x"});
      c.add("sum", add(), {"a", "b", "c"});
      const auto m = wiring_message(c);
      CAPTURE(m);
      CHECK(contains(m, "'sum (Add)'"));
      CHECK(contains(m, "got 'a' [4] (input 0), 'b' [4] (input 1) and 'c' [3] (input 2)"));
    }
  }

  TEST_CASE("add takes a layer by value or moved in") {
    // A named layer passed as it is (b.add("fc1", fc1, ...)) does not compile: the
    // static_assert in graph_builder::add says to write a temporary or std::move(fc1).
    // (CTest has no compile-failure test for it; the message was checked by hand.)
    graph_builder b;
    b.input("x", {8});
    linear fc1(8, 4);
    b.add("fc1", std::move(fc1), {"x"});
    b.add("act", relu(), {"fc1"});
    b.add("fc2", std::make_unique<linear>(4, 2), {"act"});
    auto g = b.build(1);
    CHECK(g.layer<linear>("fc1").weight().batch() == 4);
    CHECK(g.node("act").layer->kind() == "ReLU");
    CHECK(g.nodes()[g.output()].name == "fc2");
  }

  TEST_CASE("cycles, unknown names, duplicates and loose ends are wiring errors") {
    SUBCASE("cycle") {
      graph_builder b;
      b.input("x", {4});
      b.add("a", add(), {"x", "c"});
      b.add("c", relu(), {"a"});
      b.add("out", relu(), {"c"});
      CHECK(contains(wiring_message(b), "cycle"));
    }
    SUBCASE("unknown producer") {
      graph_builder b;
      b.input("x", {4});
      b.add("a", relu(), {"y"});
      const auto m = wiring_message(b);
      CHECK(contains(m, "'y'"));
      CHECK(contains(m, "does not exist"));
    }
    SUBCASE("duplicate name") {
      graph_builder b;
      b.input("x", {4});
      b.add("x", relu(), {"x"});
      CHECK(contains(wiring_message(b), "two nodes are named 'x'"));
    }
    SUBCASE("unconnected input of a join") {
      graph_builder b;
      b.input("x", {4});
      b.add("sum", add(), {"x"});
      CHECK(contains(wiring_message(b), "takes at least 2 inputs but is wired to 1"));
    }
    SUBCASE("layer with no input") {
      graph_builder b;
      b.input("x", {4});
      b.add("a", relu(), {});
      CHECK(contains(wiring_message(b), "unconnected input"));
    }
    SUBCASE("unused graph input") {
      graph_builder b;
      b.input("x", {4});
      b.input("y", {4});
      b.add("a", relu(), {"x"});
      b.output("a");
      CHECK(contains(wiring_message(b), "input 'y' is not connected"));
    }
    SUBCASE("two dangling outputs") {
      graph_builder b;
      b.input("x", {4});
      b.add("a", relu(), {"x"});
      b.add("b", relu(), {"x"});
      CHECK(contains(wiring_message(b), "call output(name)"));
    }
  }

  TEST_CASE("the topological order puts producers first") {
    // Added out of order: the builder sorts.
    graph_builder b;
    b.add("head", linear(4, 2), {"sum"});
    b.add("sum", add(), {"left", "right"});
    b.add("left", linear(4, 4), {"x"});
    b.add("right", tanh_layer(), {"x"});
    b.input("x", {4});
    auto g = b.build();
    std::vector<std::size_t> pos(g.nodes().size());
    for (std::size_t k = 0; k < g.order().size(); ++k) pos[g.order()[k]] = k;
    for (std::size_t i = 0; i < g.nodes().size(); ++i)
      for (std::size_t p : g.nodes()[i].inputs) CHECK(pos[p] < pos[i]);
    CHECK(g.nodes()[g.output()].name == "head");
    CHECK(contains(g.summary(), "sum (Add) <- left, right -> [4]"));
  }
}

TEST_SUITE("layers.executor") {
  TEST_CASE("a DAG with fan-out, a skip and a concat has the right gradients") {
    // x ─► fc1 ─► gelu ─┬─► fc2 ─► add ─► cat ─► head
    //                   └─────────┘      ▲
    //      x ─► ln ──────────────────────┘
    basic_graph_builder<double> b;
    b.input("x", {5});
    b.add("fc1", basic_linear<double>(5, 6), {"x"});
    b.add("act", basic_gelu<double>(), {"fc1"});
    b.add("fc2", basic_linear<double>(6, 6, false), {"act"});
    b.add("add", basic_add<double>(), {"fc2", "act"});
    b.add("ln", basic_layer_norm<double>({5}), {"x"});
    b.add("cat", basic_concat<double>(), {"add", "ln"});
    b.add("head", basic_linear<double>(11, 3), {"cat"});
    auto g = b.build(3);
    basic_direct_executor<double> ex(g);
    const auto x = random_tensor(4, {5}, 5);
    const auto r = random_tensor(4, {3}, 6);
    g.zero_grad();
    ex.forward(x.clone(), {0});
    CHECK(ex.in_flight() == 1);
    ex.backward(0, r);
    CHECK(ex.in_flight() == 0);
    auto objective = [&] {
      auto o = ex.predict(x.clone());
      return (o.matrix().array() * r.matrix().array()).sum();
    };
    for (auto& p : g.parameters())
      for (std::int64_t i = 0; i < p.value->size(); ++i) {
        const double v = p.value->data()[i], h = 1e-6;
        p.value->data()[i] = v + h;
        const double lp = objective();
        p.value->data()[i] = v - h;
        const double lm = objective();
        p.value->data()[i] = v;
        INFO(p.name, "[", i, "]");
        CHECK(nerve::layers::testing::close(p.grad->data()[i], (lp - lm) / (2 * h), 1e-7));
      }
  }

  TEST_CASE("micro-batches in flight out of order give the same gradients") {
    auto g = make_preset<double>("resmlp", 4);
    basic_direct_executor<double> ex(g);
    const auto x = random_tensor(6, {784}, 8);
    const auto r = random_tensor(6, {10}, 9);
    g.zero_grad();
    ex.forward(x.clone(), {0});
    ex.backward(0, r);
    std::vector<tensor_d> whole;
    for (auto& p : g.parameters()) whole.push_back(p.grad->clone());

    g.zero_grad();
    ex.forward(x.slice(0, 2), {10});
    ex.forward(x.slice(2, 4), {11});
    CHECK(ex.in_flight() == 2);
    CHECK(ex.stash_bytes() > 0);
    CHECK_THROWS_AS(ex.forward(x.slice(0, 1), {10}), std::invalid_argument);
    ex.backward(11, r.slice(2, 4));
    ex.backward(10, r.slice(0, 2));
    CHECK_THROWS_AS(ex.backward(10, r.slice(0, 2)), std::invalid_argument);
    auto params = g.parameters();
    for (std::size_t k = 0; k < params.size(); ++k) {
      INFO(params[k].name);
      CHECK((params[k].grad->matrix() - whole[k].matrix()).cwiseAbs().maxCoeff() < 1e-12);
    }
  }

  TEST_CASE("gradient accumulation over micro-batches equals one mini-batch") {
    // The mini-batch loss is the mean over all N samples; micro-batch i's loss
    // gradient is scaled by nᵢ/N, so the sums match one backward over N.
    for (auto model : {"mlp", "resmlp", "lenet"}) {
      CAPTURE(model);
      auto a = make_preset(model, 11);
      auto b = make_preset(model, 11);
      const shape in = a.nodes()[a.inputs()[0]].output_shape;
      const auto x = random_graph_input(30, in, 12);
      const auto t = random_labels(30, 13);
      cross_entropy ce;
      sgd opt_a(sgd_options{0.1, 0.9}), opt_b(sgd_options{0.1, 0.9});
      direct_executor ea(a), eb(b);
      auto ra = ea.train_step(x.clone(), t, ce, opt_a, 1);
      auto rb = eb.train_step(x.clone(), t, ce, opt_b, 4);  // 8, 8, 7, 7 samples
      CHECK(ra.loss == doctest::Approx(rb.loss).epsilon(1e-5));
      CHECK(ra.correct == rb.correct);
      auto pa = a.parameters(), pb = b.parameters();
      for (std::size_t k = 0; k < pa.size(); ++k) {
        INFO(pa[k].name);
        const float scale = std::max(1.0f, pa[k].grad->matrix().cwiseAbs().maxCoeff());
        CHECK((pa[k].grad->matrix() - pb[k].grad->matrix()).cwiseAbs().maxCoeff() <= 1e-5f * scale);
        CHECK((pa[k].value->matrix() - pb[k].value->matrix()).cwiseAbs().maxCoeff() <= 1e-6f);
      }
    }
  }

  TEST_CASE("the same seed gives bitwise identical weights after training steps") {
    auto run = [](std::uint64_t seed) {
      auto g = make_preset("resmlp", seed);
      direct_executor ex(g);
      cross_entropy ce;
      adam opt(adam_options{1e-3});
      for (std::uint64_t step = 0; step < 5; ++step)
        ex.train_step(random_graph_input(16, {784}, 100 + step), random_labels(16, 200 + step), ce, opt, 2, step);
      std::vector<tensor> w;
      for (auto& p : g.parameters()) w.push_back(p.value->clone());
      return w;
    };
    auto a = run(21), b = run(21), c = run(22);
    REQUIRE(a.size() == b.size());
    bool all_same = true, any_diff = false;
    for (std::size_t k = 0; k < a.size(); ++k) {
      all_same = all_same && std::memcmp(a[k].data(), b[k].data(), a[k].payload_bytes()) == 0;
      any_diff = any_diff || a[k].matrix() != c[k].matrix();
    }
    CHECK(all_same);
    CHECK(any_diff);
  }

  TEST_CASE("a forward hook can replace an output and a backward hook a gradient") {
    auto g = make_preset("mlp", 5);
    direct_executor ex(g);
    const auto x = random_graph_input(3, {784}, 7);
    auto plain = ex.predict(x.clone());
    int forward_calls = 0;
    g.register_forward_hook("relu1", [&](const hook_context& c, tensor& out) {
      CHECK(c.node == "relu1");
      ++forward_calls;
      out.set_zero();  // the head then sees only its bias
    });
    auto hooked = ex.predict(x.clone());
    CHECK(forward_calls == 1);
    for (std::int64_t s = 0; s < 3; ++s)
      for (std::int64_t j = 0; j < 10; ++j) CHECK(hooked.row(s)[j] == g.layer<linear>("fc2").bias().data()[j]);
    CHECK(plain.matrix() != hooked.matrix());
    g.clear_hooks();

    std::vector<std::string> seen;
    g.register_backward_hook("relu1", [&](const hook_context& c, std::vector<tensor>& grad_in, const tensor& grad_out) {
      seen.emplace_back(c.node);
      CHECK(grad_out.sample_shape() == shape{256});
      REQUIRE(grad_in.size() == 1);
      grad_in[0].set_zero();  // nothing reaches fc1
    });
    g.register_backward_hook("fc1", [&](const hook_context& c, std::vector<tensor>& grad_in, const tensor&) {
      seen.emplace_back(c.node);
      CHECK(grad_in[0].empty());  // a graph input gets no gradient
    });
    g.zero_grad();
    ex.forward(x.clone(), {0});
    ex.backward(0, random_graph_input(3, {10}, 8));
    CHECK(seen == std::vector<std::string>{"relu1", "fc1"});
    CHECK(g.layer<linear>("fc1").weight_grad().matrix().cwiseAbs().maxCoeff() == 0.0f);
    CHECK(g.layer<linear>("fc2").weight_grad().matrix().cwiseAbs().maxCoeff() > 0.0f);
  }

  TEST_CASE("wrong input shapes are rejected before any layer runs") {
    auto g = make_preset("mlp");
    direct_executor ex(g);
    CHECK_THROWS_AS(ex.predict(tensor::zeros(2, {1, 28, 28})), std::invalid_argument);
    CHECK_THROWS_AS(ex.backward(3, tensor::zeros(2, {10})), std::invalid_argument);
  }
}

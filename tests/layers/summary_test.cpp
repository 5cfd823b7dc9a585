// The model summary (layers/summary.hpp): every preset's parameters against counts done
// by hand, the stash against a forward call's own, and the graph left as it was.
#include <doctest/doctest.h>

#include <map>
#include <string>
#include <vector>

#include "layers/activation.hpp"
#include "layers/linear.hpp"
#include "layers/norm.hpp"
#include "layers/presets.hpp"
#include "layers/summary.hpp"

using namespace nerve::layers;

namespace {

/// Each node's parameters by name, as the summary lists them.
std::map<std::string, std::int64_t> parameters_of(const model_summary& s) {
  std::map<std::string, std::int64_t> m;
  for (const auto& n : s.nodes) m[n.name] = n.parameters;
  return m;
}

/// A Linear of `in` inputs and `out` outputs: a weight of out x in and a bias of out.
constexpr std::int64_t linear_count(std::int64_t in, std::int64_t out) { return out * in + out; }
/// A Conv2d: a weight of out x in x k x k and a bias of out.
constexpr std::int64_t conv_count(std::int64_t in, std::int64_t out, std::int64_t k) { return out * in * k * k + out; }

}  // namespace

TEST_SUITE("layers.summary") {
  TEST_CASE("every preset's parameter counts are those counted by hand") {
    // The presets this test counts: a new one fails here until its count is added.
    CHECK_THROWS_WITH(make_preset("none"), "unknown model 'none' (mlp, deep-mlp, lenet, resmlp, vit, gpt)");

    SUBCASE("mlp") {
      auto g = make_preset("mlp");
      const auto s = summary(g);
      const auto p = parameters_of(s);
      CHECK(p.at("fc1") == 784 * 256 + 256);  // 200,960
      CHECK(p.at("relu1") == 0);
      CHECK(p.at("fc2") == 256 * 10 + 10);  // 2,570
      CHECK(s.parameters == 200960 + 2570);  // 203,530
      CHECK(s.parameters == g.parameter_count());
    }
    SUBCASE("deep-mlp") {
      auto g = make_preset("deep-mlp");
      const auto s = summary(g);
      const auto p = parameters_of(s);
      CHECK(p.at("fc1") == 784 * 1024 + 1024);  // 803,840
      for (const char* fc : {"fc2", "fc3", "fc4"}) CHECK(p.at(fc) == 1024 * 1024 + 1024);  // 1,049,600 each
      CHECK(p.at("fc5") == 1024 * 10 + 10);  // 10,250
      CHECK(s.parameters == 803840 + 3 * 1049600 + 10250);  // 3,962,890
    }
    SUBCASE("lenet") {
      auto g = make_preset("lenet");
      const auto s = summary(g);
      const auto p = parameters_of(s);
      CHECK(p.at("conv1") == 6 * 1 * 5 * 5 + 6);  // 156
      CHECK(p.at("conv2") == 16 * 6 * 5 * 5 + 16);  // 2,416
      CHECK(p.at("fc1") == 400 * 120 + 120);  // 48,120
      CHECK(p.at("fc2") == 120 * 84 + 84);  // 10,164
      CHECK(p.at("fc3") == 84 * 10 + 10);  // 850
      for (const char* none : {"relu1", "pool1", "relu2", "pool2", "flatten", "relu3", "relu4"}) CHECK(p.at(none) == 0);
      CHECK(s.parameters == 156 + 2416 + 48120 + 10164 + 850);  // 61,706
      // Output shapes: 28 + 2*2 - 5 + 1 = 28; pooled 14; 14 - 5 + 1 = 10; pooled 5; 16 * 5 * 5 = 400.
      std::map<std::string, shape> out;
      for (const auto& n : s.nodes) out[n.name] = n.output;
      CHECK(out.at("conv1") == shape{6, 28, 28});
      CHECK(out.at("pool1") == shape{6, 14, 14});
      CHECK(out.at("conv2") == shape{16, 10, 10});
      CHECK(out.at("pool2") == shape{16, 5, 5});
      CHECK(out.at("flatten") == shape{400});
      CHECK(out.at("fc3") == shape{10});
    }
    SUBCASE("resmlp") {
      auto g = make_preset("resmlp");
      const auto s = summary(g);
      const auto p = parameters_of(s);
      CHECK(p.at("fc1") == 784 * 256 + 256);  // 200,960
      for (const char* fc : {"fc2", "fc3", "fc4", "fc5"}) CHECK(p.at(fc) == 256 * 256 + 256);  // 65,792 each
      CHECK(p.at("fc6") == 256 * 10 + 10);  // 2,570
      CHECK(p.at("add1") == 0);
      CHECK(p.at("add2") == 0);
      CHECK(s.parameters == 200960 + 4 * 65792 + 2570);  // 466,698
    }
    SUBCASE("vit") {
      auto g = make_preset("vit");
      const auto s = summary(g);
      const auto p = parameters_of(s);
      CHECK(p.at("patch") == linear_count(49, 64));  // 3,200
      CHECK(p.at("cls") == 64);
      CHECK(p.at("pos") == 17 * 64);  // 1,088
      for (int i = 0; i < 4; ++i) {
        const std::string b = "blocks." + std::to_string(i) + ".";
        CHECK(p.at(b + "ln1") == 2 * 64);
        CHECK(p.at(b + "attn") == linear_count(64, 192) + linear_count(64, 64));  // 16,640
        CHECK(p.at(b + "ln2") == 2 * 64);
        CHECK(p.at(b + "mlp.fc") == linear_count(64, 128));  // 8,320
        CHECK(p.at(b + "mlp.proj") == linear_count(128, 64));  // 8,256
        for (const char* none : {"add1", "mlp.act", "add2"}) CHECK(p.at(b + none) == 0);
      }
      CHECK(p.at("ln_f") == 2 * 64);
      CHECK(p.at("select") == 0);
      CHECK(p.at("head") == linear_count(64, 10));  // 650
      CHECK(s.parameters == 3200 + 64 + 1088 + 4 * (128 + 16640 + 128 + 8320 + 8256) + 128 + 650);  // 139,018
    }
    SUBCASE("gpt") {
      auto g = make_preset("gpt", 0, preset_shape{shape{64}, 114});
      const auto s = summary(g);
      const auto p = parameters_of(s);
      CHECK(p.at("wte") == 114 * 128);  // 14,592
      CHECK(p.at("wpe") == 64 * 128);   // 8,192
      for (int i = 0; i < 4; ++i) {
        const std::string b = "blocks." + std::to_string(i) + ".";
        CHECK(p.at(b + "attn") == linear_count(128, 384) + linear_count(128, 128));  // 66,048
        CHECK(p.at(b + "mlp.fc") == linear_count(128, 512));                          // 66,048
        CHECK(p.at(b + "mlp.proj") == linear_count(512, 128));                        // 65,664
      }
      CHECK(p.at("head") == 0);  // tied to wte: the weight is counted once, there
      CHECK(s.parameters == 14592 + 8192 + 4 * (4 * 128 + 66048 + 66048 + 65664) + 2 * 128);  // 816,128
      CHECK(s.parameters == g.parameter_count());
    }
    // The helpers above, checked against the same arithmetic once.
    CHECK(linear_count(784, 256) == 200960);
    CHECK(conv_count(6, 16, 5) == 2416);
  }

  TEST_CASE("the stash per micro-batch is what forward keeps for backward at that size") {
    for (const char* name : {"mlp", "lenet", "resmlp"}) {
      CAPTURE(name);
      for (std::int64_t m : {1, 2, 7, 64}) {
        CAPTURE(m);
        auto g = make_preset(name);
        const auto s = summary(g, {.micro_batch = m});
        CHECK(s.micro_batch == m);
        // One forward at m rows, node by node, its stashes measured directly.
        std::vector<tensor> outputs(g.nodes().size());
        std::int64_t total = 0;
        std::map<std::string, std::int64_t> direct;
        for (std::size_t i : g.order()) {
          auto& n = g.nodes()[i];
          if (n.is_input()) {
            outputs[i] = tensor::constant(m, n.output_shape, 0.5f);
            continue;
          }
          std::vector<tensor> in;
          for (auto p : n.inputs) in.push_back(outputs[p].clone());
          auto r = n.layer->forward(std::move(in));
          direct[n.name] = std::int64_t(r.stash.payload_bytes());
          total += direct[n.name];
          outputs[i] = std::move(r.output);
        }
        for (const auto& node : s.nodes)
          if (node.kind != "Input") CHECK(node.stash_bytes == direct.at(node.name));
        CHECK(s.stash_bytes == total);
      }
    }
    // mlp at 256 rows, by hand: fc1 keeps its input (256 x 784 floats), relu1 its output
    // (256 x 256), fc2 its input (256 x 256).
    auto g = make_preset("mlp");
    CHECK(summary(g, {.micro_batch = 256}).stash_bytes == 4 * (256 * 784 + 256 * 256 + 256 * 256));
  }

  TEST_CASE("summarising leaves the graph as it was: buffers, modes, weights") {
    graph_builder b;
    b.input("x", shape{4});
    b.add("fc", linear(4, 3), {"x"});
    b.add("bn", batch_norm(3), {"fc"});
    b.add("act", relu(), {"bn"});
    auto g = b.build(1);
    g.node("bn").layer->set_training(false);
    std::vector<float> before;
    for (auto& buf : g.buffers()) before.insert(before.end(), buf.value->data(), buf.value->data() + buf.value->size());
    const auto weights = g.parameters()[0].value->clone();
    const auto s = summary(g, {.micro_batch = 5, .places = {"", "loop 0", "loop 1", "loop 0"}});
    std::vector<float> after;
    for (auto& buf : g.buffers()) after.insert(after.end(), buf.value->data(), buf.value->data() + buf.value->size());
    CHECK(after == before);
    CHECK_FALSE(g.node("bn").layer->training());
    CHECK(g.node("fc").layer->training());
    CHECK(std::equal(weights.data(), weights.data() + weights.size(), g.parameters()[0].value->data()));
    REQUIRE(s.nodes.size() == 4);
    CHECK(s.nodes[0].place == "-");
    CHECK(s.nodes[2].place == "loop 1");
    CHECK(s.nodes[2].parameters == 3 + 3);  // BatchNorm's weight and bias
    CHECK(s.parameters == 4 * 3 + 3 + 6);
    const auto text = to_text(s);
    CHECK(text.find("bn     BatchNorm") != std::string::npos);
    CHECK(totals_line(s).find("21 parameters (84 B)") == 0);
  }

  TEST_CASE("places_on_loops puts layers where a network puts their actors") {
    auto g = make_preset("mlp");
    const auto one = places_on_loops(g, 2, false, "cpu");
    CHECK(one[g.index_of("fc2")] == "loop 0");
    CHECK(one[g.index_of("input")].empty());
    const auto spread = places_on_loops(g, 2, true, "standin");
    CHECK(spread[g.index_of("fc1")] == "loop 0 on standin");
    CHECK(spread[g.index_of("relu1")] == "loop 1 on standin");
    CHECK(spread[g.index_of("fc2")] == "loop 0 on standin");
  }

  TEST_CASE("a micro-batch of no rows is refused") {
    auto g = make_preset("mlp");
    CHECK_THROWS_WITH_AS(summary(g, {.micro_batch = 0}), doctest::Contains("at least 1 row (got 0)"),
                         std::invalid_argument);
  }
}

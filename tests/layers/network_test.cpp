// The actor executor against the direct one: the same graph, data and optimizer must give
// bitwise the same weights and losses.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <random>
#include <thread>

#include "actors/runtime.hpp"
#include "layers/activation.hpp"
#include "layers/executor.hpp"
#include "layers/gemm.hpp"
#include "layers/join.hpp"
#include "layers/linear.hpp"
#include "layers/network.hpp"
#include "layers/presets.hpp"

#include <nlohmann/json.hpp>

using namespace nerve;
using namespace nerve::layers;

namespace {

tensor random_batch(std::int64_t n, shape s, std::uint64_t seed) {
  tensor t(n, std::move(s));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  for (std::int64_t i = 0; i < t.size(); ++i) t.data()[i] = u(rng);
  return t;
}

targets random_labels(std::int64_t n, int classes, std::uint64_t seed) {
  targets t;
  std::mt19937_64 rng(seed);
  for (std::int64_t i = 0; i < n; ++i) t.labels.push_back(static_cast<std::int32_t>(rng() % classes));
  return t;
}

bool same_bits(graph& a, graph& b) {
  auto pa = a.parameters();
  auto pb = b.parameters();
  if (pa.size() != pb.size()) return false;
  for (std::size_t i = 0; i < pa.size(); ++i) {
    if (pa[i].name != pb[i].name || pa[i].value->size() != pb[i].value->size()) return false;
    if (std::memcmp(pa[i].value->data(), pb[i].value->data(), pa[i].value->size() * sizeof(float)) != 0) return false;
  }
  return true;
}

optimizer_factory sgd_factory(sgd_options o) {
  return [o] { return std::make_unique<sgd>(o); };
}

/// Runs `steps` steps of `model` both ways and compares bits after every step.
void check_parity(std::string_view model, std::size_t micro_batches, bool spread, unsigned loops,
                  std::int64_t batch = 24) {
  auto direct_graph = make_preset(model, 7);
  auto actor_graph = make_preset(model, 7);
  REQUIRE(same_bits(direct_graph, actor_graph));
  const sgd_options o{0.05, 0.9, 0.0, 1e-4, true};
  sgd direct_opt(o);
  direct_executor direct(direct_graph);
  auto criterion = std::make_shared<cross_entropy>();

  actors::runtime rt({.loops = loops});
  network net(rt, actor_graph, criterion, sgd_factory(o), network_options{.spread = spread});
  const shape in = direct_graph.nodes()[direct_graph.inputs()[0]].output_shape;
  for (std::uint64_t step = 0; step < 3; ++step) {
    auto x = random_batch(batch, in, 100 + step);
    auto y = random_labels(batch, 10, 200 + step);
    auto want = direct.train_step(x.clone(), y, *criterion, direct_opt, micro_batches, step);
    auto got = net.train_step(std::move(x), y.clone(), micro_batches, step).get();
    CHECK(got.loss == want.loss);  // bitwise: the same sums in the same order
    CHECK(got.correct == want.correct);
    CHECK(got.samples == want.samples);
    REQUIRE(same_bits(direct_graph, actor_graph));
  }
}

}  // namespace

TEST_SUITE("layers.network") {
  TEST_CASE("an actor-run training step gives bitwise the weights of the direct executor") {
    for (std::string_view model : {"mlp", "resmlp", "lenet", "vit"}) {
      for (std::size_t m : {1u, 3u}) {
        for (bool spread : {false, true}) {
          CAPTURE(model);
          CAPTURE(m);
          CAPTURE(spread);
          check_parity(model, m, spread, 2);
        }
      }
    }
  }

  TEST_CASE("deep-mlp at the benchmark's batch 256: actor-run steps are bitwise the direct ones") {
    // The shapes nerve-bench train times (blocked products, split over threads at 2).
    for (int threads : {1, 2}) {
      CAPTURE(threads);
      set_gemm_threads(threads);
      check_parity("deep-mlp", 1, false, 1, 256);
    }
    set_gemm_threads(1);
  }

  TEST_CASE("evaluate and predict match the direct executor and change nothing") {
    auto g1 = make_preset("mlp", 3);
    auto g2 = make_preset("mlp", 3);
    direct_executor direct(g1);
    auto criterion = std::make_shared<cross_entropy>();
    actors::runtime rt({.loops = 2});
    network net(rt, g2, criterion, sgd_factory({0.1}));
    auto x = random_batch(10, shape{784}, 5);
    auto y = random_labels(10, 10, 6);
    auto want = direct.evaluate(x.clone(), y, *criterion);
    auto got = net.evaluate(x.clone(), y.clone()).get();
    CHECK(got.loss == want.loss);
    CHECK(got.correct == want.correct);
    auto out = net.predict(x.clone()).get();
    auto ref = direct.predict(x.clone());
    REQUIRE(out.batch() == 10);
    CHECK(std::memcmp(out.data(), ref.data(), ref.size() * sizeof(float)) == 0);
    CHECK(same_bits(g1, g2));
  }

  TEST_CASE("a bad split is an error in the future, and the network goes on") {
    auto g = make_preset("mlp", 1);
    actors::runtime rt({.loops = 1});
    network net(rt, g, std::make_shared<cross_entropy>(), sgd_factory({0.1}));
    auto bad = net.train_step(random_batch(2, shape{784}, 1), random_labels(2, 10, 1), 3);
    CHECK_THROWS_WITH_AS(bad.get(), "network: cannot split a batch of 2 into 3 non-empty micro-batches", std::invalid_argument);
    auto ok = net.train_step(random_batch(4, shape{784}, 1), random_labels(4, 10, 1), 2).get();
    CHECK(ok.samples == 4);
  }

  TEST_CASE("a layer that throws ends the run with its error") {
    auto g = make_preset("mlp", 1);
    g.register_forward_hook("fc2", [](const hook_context& c, tensor&) {
      if (c.micro_batch == 1) throw std::runtime_error("bad activation in micro-batch 1");
    });
    actors::runtime rt({.loops = 2});
    network net(rt, g, std::make_shared<cross_entropy>(), sgd_factory({0.1}), network_options{.spread = true});
    auto f = net.train_step(random_batch(8, shape{784}, 1), random_labels(8, 10, 1), 4);
    CHECK_THROWS_WITH_AS(rt.synchronize(), "actor 'fc2' failed: bad activation in micro-batch 1", actors::actor_failure);
    CHECK_THROWS(f.get());  // the step's answer is an error, not a hang
  }

  TEST_CASE("after a failure the network refuses every call at once, quoting the failure") {
    auto g = make_preset("mlp", 1);
    g.register_forward_hook("fc2", [](const hook_context& c, tensor&) {
      if (c.micro_batch == 1) throw std::runtime_error("bad activation in micro-batch 1");
    });
    actors::runtime rt({.loops = 2});
    network net(rt, g, std::make_shared<cross_entropy>(), sgd_factory({0.1}), network_options{.spread = true});
    auto first = net.train_step(random_batch(8, shape{784}, 1), random_labels(8, 10, 1), 4);
    CHECK_THROWS_AS(first.get(), actors::actor_failure);
    g.clear_hooks();  // the hook is not why the next calls fail: the network is dead

    const std::string want =
        "network: the network stopped because of the first failure: actor 'fc2' failed: bad activation in "
        "micro-batch 1; it cannot run again and must be rebuilt (a new runtime and a new network)";
    auto check_refused = [&](auto future) {
      REQUIRE(future.wait_for(std::chrono::seconds(0)) == std::future_status::ready);  // at once, not after a send
      try {
        future.get();
        FAIL("a call on a dead network succeeded");
      } catch (const std::runtime_error& e) {
        CHECK(std::string(e.what()) == want);
        try {  // the first failure itself is nested in the error
          std::rethrow_if_nested(e);
          FAIL("no nested failure");
        } catch (const actors::actor_failure& inner) {
          CHECK(std::string(inner.what()) == "actor 'fc2' failed: bad activation in micro-batch 1");
        }
      }
    };
    SUBCASE("train_step") { check_refused(net.train_step(random_batch(4, shape{784}, 2), random_labels(4, 10, 2), 1)); }
    SUBCASE("evaluate") { check_refused(net.evaluate(random_batch(4, shape{784}, 2), random_labels(4, 10, 2))); }
    SUBCASE("predict") { check_refused(net.predict(random_batch(4, shape{784}, 2))); }
  }

  TEST_CASE("a network on a shut-down runtime says so") {
    auto g = make_preset("mlp", 1);
    actors::runtime rt({.loops = 1});
    network net(rt, g, std::make_shared<cross_entropy>(), sgd_factory({0.1}));
    rt.shutdown();
    CHECK_THROWS_WITH_AS(net.predict(random_batch(2, shape{784}, 1)).get(),
                         "network: the network stopped because the runtime was shut down; it cannot run again and "
                         "must be rebuilt (a new runtime and a new network)",
                         std::runtime_error);
  }

  TEST_CASE("independent branches of a DAG run at the same time on different loops") {
    // input ─► a ─┐
    //       └─► b ─┴─► add ─► out
    auto build = [] {
      graph_builder b;
      b.input("input", shape{64});
      b.add("a", linear(64, 64), {"input"});
      b.add("b", linear(64, 64), {"input"});
      b.add("add", nerve::layers::add(), {"a", "b"});
      b.add("out", linear(64, 10), {"add"});
      return b.build(1);
    };
    // Each branch's hook waits (bounded) for the other branch to be inside its forward too.
    auto run = [&](std::vector<unsigned> loops) {
      auto g = build();
      std::atomic<int> inside{0};
      std::atomic<bool> met{false};
      auto hook = [&](const hook_context&, tensor&) {
        inside.fetch_add(1);
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
        while (inside.load() < 2 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
        if (inside.load() >= 2) met = true;
        inside.fetch_sub(1);  // out again: a branch that runs later does not meet this one
      };
      g.register_forward_hook("a", hook);
      g.register_forward_hook("b", hook);
      actors::runtime rt({.loops = 2});
      network net(rt, g, std::make_shared<cross_entropy>(), sgd_factory({0.1}), network_options{.loops = loops});
      net.train_step(random_batch(4, shape{64}, 1), random_labels(4, 10, 2)).get();
      return met.load();
    };
    // node order: input, a, b, add, out
    CHECK(run({0, 0, 1, 0, 0}));        // a and b on different loops: both inside at once
    CHECK_FALSE(run({0, 0, 0, 0, 0}));  // the control: one loop runs them one after the other
  }

  TEST_CASE("same seed and threads: bitwise-identical losses run to run") {
    auto once = [] {
      auto g = make_preset("resmlp", 11);
      actors::runtime rt({.loops = 2});
      network net(rt, g, std::make_shared<cross_entropy>(), sgd_factory({0.05, 0.9}), network_options{.spread = true});
      std::vector<double> losses;
      for (std::uint64_t s = 0; s < 4; ++s)
        losses.push_back(net.train_step(random_batch(16, shape{784}, s), random_labels(16, 10, s), 2, s).get().loss);
      return losses;
    };
    CHECK(once() == once());
  }
}

TEST_SUITE("layers.network") {
  TEST_CASE("a recorded run has one step slice per training step, and none for evaluation") {
    auto g = make_preset("mlp", 2);
    actors::runtime rt({.loops = 1, .record = true});
    network net(rt, g, std::make_shared<cross_entropy>(), sgd_factory({0.1}));
    for (std::uint64_t s = 0; s < 3; ++s) net.train_step(random_batch(8, shape{784}, s), random_labels(8, 10, s), 2, s).get();
    net.evaluate(random_batch(8, shape{784}, 9), random_labels(8, 10, 9)).get();
    rt.synchronize();
    auto trace = rt.trace().to_chrome_trace(nlohmann::json::array(), nlohmann::json::object());
    std::vector<std::int64_t> steps;
    for (auto& e : trace["traceEvents"])
      if (e.value("cat", "") == "step") {
        CHECK(e["ph"] == "X");
        CHECK(e["tid"] == 0);
        CHECK(e["dur"].get<double>() > 0);
        steps.push_back(e["args"]["step"].get<std::int64_t>());
      }
    CHECK(steps == std::vector<std::int64_t>{0, 1, 2});
  }
}

TEST_SUITE("layers.network.bus") {
  // Edges counted from the graph itself, not from the plan under test: every input port
  // of a layer whose producer is a layer (a gradient goes back on it), plus the loss.
  struct edge_count {
    std::uint64_t gradient = 1, input = 0;
  };
  edge_count count_edges(const graph& g) {
    edge_count c;
    for (auto& n : g.nodes())
      for (std::size_t p : n.inputs) (g.nodes()[p].is_input() ? c.input : c.gradient) += 1;
    return c;
  }

  TEST_CASE("one step of M micro-batches delivers exactly E·M forwards and E·M gradients through bus signals") {
    // resmlp has a skip connection (fan-out from one node into an Add), so an output
    // feeds two edges and a gradient comes back on each.
    for (std::string_view model : {"mlp", "resmlp", "lenet"}) {
      for (std::size_t m : {1u, 4u}) {
        CAPTURE(model);
        CAPTURE(m);
        auto g = make_preset(model, 1);
        const auto e = count_edges(g);
        actors::runtime rt({.loops = 2});
        network net(rt, g, std::make_shared<cross_entropy>(), sgd_factory({0.1}), network_options{.spread = true});
        CHECK(net.plan().gradient_edges == e.gradient);
        CHECK(net.plan().input_edges == e.input);
        const shape in = g.nodes()[g.inputs()[0]].output_shape;
        net.train_step(random_batch(8, in, 1), random_labels(8, 10, 2), m).get();
        auto t = net.traffic();
        CHECK(t.forward == e.gradient * m);
        CHECK(t.backward == e.gradient * m);
        CHECK(t.feed == e.input * m);
        net.train_step(random_batch(8, in, 3), random_labels(8, 10, 4), m, 1).get();
        t = net.traffic();
        CHECK(t.forward == 2 * e.gradient * m);
        CHECK(t.backward == 2 * e.gradient * m);
        // Evaluation flows forward only.
        net.evaluate(random_batch(8, in, 5), random_labels(8, 10, 6)).get();
        CHECK(net.traffic().forward == 2 * e.gradient * m + e.gradient);
        CHECK(net.traffic().backward == 2 * e.gradient * m);
      }
    }
  }

  TEST_CASE("the plan sums a fan-out's gradients latest consumer first, and knows each input's edge") {
    // input ─► a ─┬─► r ─► add(port 0) ─► out
    //             └──────► add(port 1)
    graph_builder b;
    b.input("input", shape{8});
    b.add("a", linear(8, 8), {"input"});
    b.add("r", relu(), {"a"});
    b.add("add", nerve::layers::add(), {"r", "a"});
    b.add("out", linear(8, 4), {"add"});
    auto g = b.build(1);
    auto p = make_plan(g);
    const auto a = g.index_of("a"), r = g.index_of("r"), add = g.index_of("add"), out = g.index_of("out");
    CHECK(p.nodes[a].edges == std::vector<plan_edge>{{r, 0}, {add, 1}});
    CHECK(p.nodes[a].grad_order == std::vector<std::uint32_t>{1, 0});  // add is later than r
    CHECK(p.nodes[add].producer_edge == std::vector<std::uint32_t>{0, 1});
    CHECK(p.nodes[out].feeds_loss);
    CHECK(p.nodes[out].grad_order == std::vector<std::uint32_t>{0});
    CHECK(p.gradient_edges == 5);  // a→r, a→add, r→add, add→out, out→loss
    CHECK(p.input_edges == 1);
  }

  TEST_CASE("a recorded step shows each layer as an actor, an arrow per message, and each edge's credits") {
    auto g = make_preset("resmlp", 2);
    actors::runtime rt({.loops = 2, .record = true});
    network net(rt, g, std::make_shared<cross_entropy>(), sgd_factory({0.1}), network_options{.spread = true});
    const std::size_t m = 3;
    net.train_step(random_batch(9, shape{784}, 1), random_labels(9, 10, 2), m).get();
    rt.synchronize();
    auto trace = rt.trace().to_chrome_trace(nlohmann::json::array(), nlohmann::json::object());
    std::map<std::int64_t, std::pair<int, int>> runs;  // actor -> (forward runs, backward runs)
    std::size_t flows = 0;
    std::map<std::int64_t, std::vector<std::int64_t>> credits;  // edge id -> available, in order
    for (auto& e : trace["traceEvents"]) {
      if (e["ph"] == "X" && e.value("cat", "") == "handler") {
        if (e["name"] == "forward") ++runs[e["tid"].get<std::int64_t>()].first;
        if (e["name"] == "backward") ++runs[e["tid"].get<std::int64_t>()].second;
      }
      if (e["ph"] == "s" && (e["name"] == "forward" || e["name"] == "backward")) ++flows;
      if (e["ph"] == "C" && e["name"] == "credits") credits[e["id"].get<std::int64_t>()].push_back(e["args"]["available"]);
    }
    // Every layer node has a track with a forward run per micro-batch and input port, a
    // backward run per micro-batch and consumer edge.
    const auto plan = make_plan(g);
    for (std::size_t i = 0; i < g.nodes().size(); ++i) {
      if (g.nodes()[i].is_input()) continue;
      CAPTURE(g.nodes()[i].name);
      const auto id = static_cast<std::int64_t>(net.actor_of(g.nodes()[i].name).id());
      CHECK(runs[id].first == int(m * g.nodes()[i].inputs.size()));
      CHECK(runs[id].second == int(m * plan.nodes[i].edge_count()));
    }
    // An arrow per bus message: forwards (with the feeds) and gradients.
    CHECK(flows == (2 * plan.gradient_edges + plan.input_edges) * m);
    // Each edge: down by one per forward, back up by one per gradient, ending where it began.
    REQUIRE(credits.size() == plan.gradient_edges);
    for (auto& [edge, v] : credits) {
      CAPTURE(edge);
      REQUIRE(v.size() == 2 * m);
      std::int64_t low = *std::min_element(v.begin(), v.end());
      CHECK(low >= 0);
      CHECK(v.back() == std::int64_t(m));
    }
  }
}

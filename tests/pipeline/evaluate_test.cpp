// Evaluation and prediction through a pipeline's own stages: the layer actors in
// evaluation mode, on their loops, against the direct executor and a network.
#include <doctest/doctest.h>

#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "layers/activation.hpp"
#include "layers/linear.hpp"
#include "layers/network.hpp"
#include "layers/norm.hpp"
#include "layers/pipeline/engine.hpp"
#include "layers/pipeline/pipeline.hpp"
#include "layers/flatten.hpp"
#include "layers/trainer.hpp"
#include "tests/layers/tiny_fashion_mnist.hpp"
#include "tests/pipeline/chain.hpp"

using namespace nerve;
using namespace nerve::pipeline;
using layers::tensor;

namespace {

layers::optimizer_factory sgd() {
  return [] { return layers::make_optimizer<float>("sgd", 0.05, 0.9); };
}

/// The bytes of every parameter and buffer of `g`, in order.
std::vector<float> state_of(layers::graph& g) {
  std::vector<float> out;
  for (auto& p : g.parameters()) out.insert(out.end(), p.value->data(), p.value->data() + p.value->size());
  for (auto& b : g.buffers()) out.insert(out.end(), b.value->data(), b.value->data() + b.value->size());
  return out;
}

/// input [12] → fc1 → bn1 → relu1 → fc2 [4]: BatchNorm normalises with the batch's statistics
/// in training and with its running ones in evaluation, which it must not update.
layers::graph with_batch_norm(std::uint64_t seed = 5) {
  layers::graph_builder b;
  b.input("input", layers::shape{12});
  b.add("fc1", layers::linear(12, 16), {"input"});
  b.add("bn1", layers::batch_norm(16), {"fc1"});
  b.add("relu1", layers::relu(), {"bn1"});
  b.add("fc2", layers::linear(16, 4), {"relu1"});
  return b.build(seed);
}

/// A pass-through layer that throws in its forward in evaluation.
class failing_in_evaluation final : public layers::layer {
 public:
  std::string_view kind() const noexcept override { return "FailingInEvaluation"; }

 protected:
  layers::shape infer_shape(std::span<const layers::shape> in) const override { return in[0]; }
  forward_result do_forward(std::vector<tensor>& in, const layers::forward_context&) override {
    if (!this->training()) throw std::runtime_error("boom: evaluation");
    forward_result r;
    r.output = std::move(in[0]);
    return r;
  }
  std::vector<tensor> do_backward_input(const stash_type&, const tensor& dy, layers::input_mask) override {
    std::vector<tensor> g;
    g.push_back(dy.clone());
    return g;
  }
};

}  // namespace

TEST_SUITE("pipeline.evaluate") {
  TEST_CASE("evaluation and prediction on the stages give the direct executor's figures and outputs, weights untouched") {
    struct variant {
      const char* name;
      std::uint32_t S, M, chunks, replicas;
    };
    for (const variant v : {variant{"1f1b", 1, 1, 1, 1}, variant{"1f1b", 2, 3, 1, 1}, variant{"gpipe", 3, 4, 1, 1},
                            variant{"interleaved", 2, 4, 2, 1}, variant{"zb-h1", 2, 2, 1, 2}}) {
      CAPTURE(v.name);
      CAPTURE(v.S);
      CAPTURE(v.replicas);
      const auto plan = make_schedule(v.name, v.S, v.M, v.chunks);
      std::vector<layers::graph> graphs;
      for (std::uint32_t r = 0; r < v.replicas; ++r) graphs.push_back(test::small_chain());
      std::vector<layers::graph*> ptrs;
      for (auto& g : graphs) ptrs.push_back(&g);
      actors::runtime rt(actors::runtime_options{.loops = 2});
      nerve::pipeline::pipeline p(rt, ptrs, partition_by_parameters(graphs[0], plan.pieces()), plan,
                                  std::make_shared<layers::cross_entropy>(), sgd());
      for (std::uint64_t s = 0; s < 2; ++s) {
        auto b = test::make_batch(graphs[0], 24, 40 + s);
        p.train_step(std::move(b.x), b.t, s);
      }
      const auto before = state_of(graphs[0]);
      // 37 rows: micro-batches of unequal size; 1 row: fewer rows than micro-batches.
      for (std::int64_t rows : {37, 1}) {
        CAPTURE(rows);
        auto b = test::make_batch(graphs[0], rows, 90);
        auto ref_x = b.x.clone();
        layers::direct_executor exec(graphs[0]);
        const auto expect = exec.evaluate(ref_x.clone(), b.t, layers::cross_entropy{});
        const auto want = exec.predict(ref_x.clone());

        const auto got = p.evaluate(b.x.clone(), b.t);
        CHECK(got.samples == rows);
        CHECK(got.correct == expect.correct);
        CHECK(got.loss == doctest::Approx(expect.loss).epsilon(1e-6));
        const auto out = p.predict(std::move(b.x));
        REQUIRE(out.batch() == rows);
        REQUIRE(out.features() == want.features());
        for (std::int64_t i = 0; i < out.size(); ++i) CHECK(out.data()[i] == doctest::Approx(want.data()[i]).epsilon(1e-5));
      }
      CHECK(state_of(graphs[0]) == before);
      // The stages take the next step as before.
      auto b = test::make_batch(graphs[0], 24, 77);
      CHECK(p.train_step(std::move(b.x), b.t, 2).samples == 24);
    }
  }

  TEST_CASE("BatchNorm evaluates with its running statistics, which evaluation leaves as they are") {
    auto piped = with_batch_norm(), networked = with_batch_norm();
    actors::runtime rt(actors::runtime_options{.loops = 2});
    const auto plan = make_schedule("1f1b", 2, 2);
    nerve::pipeline::pipeline p(rt, piped, partition_at(piped, {"relu1"}), plan,
                                std::make_shared<layers::cross_entropy>(), sgd());
    for (std::uint64_t s = 0; s < 3; ++s) {
      auto b = test::make_batch(piped, 32, 10 + s);
      p.train_step(std::move(b.x), b.t, s);
    }
    // A network on the pipeline's trained weights and running statistics.
    auto from = piped.parameters(), to = networked.parameters();
    for (std::size_t i = 0; i < from.size(); ++i) to[i].value->matrix() = from[i].value->matrix();
    auto bf = piped.buffers(), bt = networked.buffers();
    REQUIRE(bf.size() == 2);  // running mean and variance
    for (std::size_t i = 0; i < bf.size(); ++i) bt[i].value->matrix() = bf[i].value->matrix();
    const auto before = state_of(piped);
    layers::network net(rt, networked, std::make_shared<layers::cross_entropy>(), sgd());

    auto b = test::make_batch(piped, 64, 99);
    const auto by_pipeline = p.evaluate(b.x.clone(), b.t);
    const auto by_network = net.evaluate(b.x.clone(), b.t.clone()).get();
    CHECK(by_pipeline.correct == by_network.correct);
    CHECK(by_pipeline.loss == doctest::Approx(by_network.loss).epsilon(1e-6));
    CHECK(state_of(piped) == before);
    // Not the figures of training mode, which normalises with the batch's own statistics
    // (a forward that keeps its stash, as a training step's does).
    layers::direct_executor exec(networked);
    for (auto& n : networked.nodes())
      if (n.layer) n.layer->set_training(true);
    const auto y = exec.forward(b.x.clone(), layers::forward_context{});
    CHECK(layers::cross_entropy{}.forward(y, b.t).loss != doctest::Approx(by_network.loss).epsilon(1e-4));
  }

  TEST_CASE("a layer that throws in evaluation ends the evaluation with its error and stops the stages") {
    layers::graph_builder gb;
    gb.input("input", layers::shape{12});
    gb.add("fc1", layers::linear(12, 8), {"input"});
    gb.add("bad", std::make_unique<failing_in_evaluation>(), {"fc1"});
    gb.add("fc2", layers::linear(8, 4), {"bad"});
    auto g = gb.build(3);
    actors::runtime rt(actors::runtime_options{.loops = 2});
    nerve::pipeline::pipeline p(rt, g, partition_at(g, {"bad"}), make_schedule("1f1b", 2, 2),
                                std::make_shared<layers::cross_entropy>(), sgd());
    auto b = test::make_batch(g, 8, 1);
    p.train_step(b.x.clone(), b.t, 0);
    CHECK_THROWS_WITH(p.evaluate(std::move(b.x), b.t), doctest::Contains("boom: evaluation"));
    CHECK(p.stopped());
  }

  TEST_CASE("the trainer's pipeline engine evaluates on the stages: a network's accuracy, and nothing moves") {
    // [1, 28, 28] → flatten → fc1 → bn1 → relu1 → fc2 [10], cut after bn1; two epochs.
    auto make = [] {
      layers::graph_builder b;
      b.input("input", layers::shape{1, 28, 28});
      b.add("flat", layers::flatten(), {"input"});
      b.add("fc1", layers::linear(784, 24), {"flat"});
      b.add("bn1", layers::batch_norm(24), {"fc1"});
      b.add("relu1", layers::relu(), {"bn1"});
      b.add("fc2", layers::linear(24, 10), {"relu1"});
      return b.build(9);
    };
    nerve::testing::tiny_fashion_mnist data(96, 40);
    layers::train_options o;
    o.data = data.dir;
    o.epochs = 2;
    o.batch = 32;
    o.lr = 0.05;
    o.threads = 1;  // one product thread in both: the network's products then give the pipeline's bits
    o.shuffle = false;
    auto piped = [&](layers::graph& g, bool evaluate) {
      auto opts = o;
      opts.evaluate = evaluate;
      engine_outcome out;
      std::vector<layers::graph*> replicas{&g};
      return layers::train(g, opts, {}, {},
                           [&](actors::runtime& rt, layers::graph&, const layers::train_options& oo) {
                             return std::make_unique<pipeline_engine>(rt, replicas, partition_at(g, {"relu1"}),
                                                                      make_schedule("1f1b", 2, 2), oo, pipeline_options{},
                                                                      std::vector<std::string>{"cpu", "cpu"}, out);
                           });
    };
    auto g1 = make(), g2 = make(), g3 = make();
    const auto with_eval = piped(g1, true);
    const auto without = piped(g2, false);
    // Evaluation changed nothing: the weights and BatchNorm's running statistics of a run
    // without it, bitwise (in training mode it would have moved the running statistics).
    CHECK(state_of(g1) == state_of(g2));
    // The figures of a network evaluating the same graph: train the same micro-batches
    // through a network (bitwise the pipeline's weights), evaluate with it.
    auto net_opts = o;
    net_opts.micro_batches = 2;
    const auto by_network = layers::train(g3, net_opts);
    CHECK(state_of(g3) == state_of(g1));
    REQUIRE(with_eval.epochs.size() == 2);
    REQUIRE(by_network.epochs.size() == 2);
    for (std::size_t e = 0; e < 2; ++e) {
      CAPTURE(e);
      CHECK(with_eval.epochs[e].test_accuracy == by_network.epochs[e].test_accuracy);
      CHECK(with_eval.epochs[e].test_loss == doctest::Approx(by_network.epochs[e].test_loss).epsilon(1e-6));
      CHECK(without.epochs[e].train_loss == with_eval.epochs[e].train_loss);
    }
  }
}

// A step that stops moving ends with a report of who waits on whom (docs/pipeline.md,
// "A run that stops moving"): a layer of stage 1 blocks in its forward on a latch the test
// holds; with a stall timeout of 1 s the step throws well before the timeout plus 5 s.
#include <doctest/doctest.h>

#include "tests/layers/blocking_layer.hpp"

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "layers/activation.hpp"
#include "layers/linear.hpp"
#include "layers/pipeline/pipeline.hpp"
#include "tests/pipeline/chain.hpp"

using namespace nerve;
using namespace nerve::pipeline;
using layers::tensor;

namespace {

using test::blocking;
using test::latch;

/// input → fc1 → relu1 | block → fc2: stage 1 begins with the blocking layer.
layers::graph blocked_chain(std::shared_ptr<latch> l) {
  layers::graph_builder b;
  b.input("input", layers::shape{12});
  b.add("fc1", layers::linear(12, 16), {"input"});
  b.add("relu1", layers::relu(), {"fc1"});
  b.add("block", std::make_unique<blocking>(std::move(l)), {"relu1"});
  b.add("fc2", layers::linear(16, 4), {"block"});
  return b.build(3);
}

}  // namespace

TEST_SUITE("pipeline.stall") {
  TEST_CASE("a stage whose layer blocks ends the step with a report naming it and what the others wait for") {
    for (const char* schedule : {"1f1b", "emergent"}) {
      CAPTURE(schedule);
      auto l = std::make_shared<latch>();
      auto g = blocked_chain(l);
      actors::runtime rt(actors::runtime_options{.loops = 2});
      const bool emergent = std::string(schedule) == "emergent";
      const auto plan = make_schedule("1f1b", 2, 2);
      pipeline_options po{.emergent = emergent, .stall_timeout_s = 1};
      std::string what;
      double took = 0;
      {
        nerve::pipeline::pipeline p(rt, g, partition_at(g, {"block"}), plan, std::make_shared<layers::cross_entropy>(),
                                    [] { return layers::make_optimizer<float>("sgd", 0.1, 0); }, po);
        auto b = test::make_batch(g, 8, 1);
        const auto t0 = std::chrono::steady_clock::now();
        try {
          p.train_step(std::move(b.x), b.t, 0);
        } catch (const stall_error& e) {
          what = e.what();
        }
        took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        // The pipeline is failed; it stops its actors once the layer lets go of its loop.
        auto b2 = test::make_batch(g, 8, 2);
        CHECK_THROWS_AS(p.train_step(std::move(b2.x), b2.t, 1), std::logic_error);
        l->open();
      }
      INFO(what);
      CHECK(took >= 1.0);
      CHECK(took < 6.0);
      CHECK(what.find("pipeline stalled") != std::string::npos);
      CHECK(what.find("stage 1: stopped in F0, admitted and running: 0 of 2 layers done") != std::string::npos);
      CHECK(what.find("stage 0: ") != std::string::npos);
      CHECK(what.find("from stage 1") != std::string::npos);
      CHECK(what.find("edge to stage 1: 2 micro-batches out") != std::string::npos);
    }
  }

  TEST_CASE("a stall timeout of 0 leaves the watch off and a moving step unaffected") {
    auto g = test::small_chain();
    actors::runtime rt(actors::runtime_options{.loops = 2});
    const auto plan = make_schedule("1f1b", 2, 4);
    nerve::pipeline::pipeline p(rt, g, partition_by_parameters(g, plan.pieces()), plan,
                                std::make_shared<layers::cross_entropy>(),
                                [] { return layers::make_optimizer<float>("sgd", 0.1, 0); },
                                pipeline_options{.stall_timeout_s = 0});
    auto b = test::make_batch(g, 16, 3);
    CHECK(p.train_step(std::move(b.x), b.t, 0).samples == 16);
  }
}

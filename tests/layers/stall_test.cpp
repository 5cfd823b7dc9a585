// A training step of a network that stops moving ends with a `stall_error` naming the
// layers that have not finished it (network_options::stall_timeout_s).
#include <doctest/doctest.h>

#include "tests/layers/blocking_layer.hpp"

#include <chrono>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "layers/activation.hpp"
#include "layers/linear.hpp"
#include "layers/network.hpp"
#include "layers/trainer.hpp"

using namespace nerve;
using layers::tensor;

namespace {

using test::blocking;
using test::latch;

}  // namespace

TEST_SUITE("layers.network.stall") {
  TEST_CASE("a layer that blocks ends the step with a stall error naming the layers that did not finish it") {
    auto l = std::make_shared<latch>();
    layers::graph_builder b;
    b.input("input", layers::shape{6});
    b.add("fc1", layers::linear(6, 8), {"input"});
    b.add("block", std::make_unique<blocking>(l), {"fc1"});
    b.add("fc2", layers::linear(8, 3), {"block"});
    auto g = b.build(1);
    // The blocking layer on a loop of its own, the rest on loop 0.
    std::vector<unsigned> loops(g.nodes().size(), 0);
    loops[g.index_of("block")] = 1;
    actors::runtime rt(actors::runtime_options{.loops = 2});
    std::string what;
    double took = 0;
    {
      layers::network net(rt, g, std::make_shared<layers::cross_entropy>(),
                          [] { return layers::make_optimizer<float>("sgd", 0.1, 0); },
                          layers::network_options{.loops = loops, .stall_timeout_s = 1});
      tensor x(4, layers::shape{6});
      x.matrix().setOnes();
      layers::targets t;
      t.labels = {0, 1, 2, 0};
      const auto t0 = std::chrono::steady_clock::now();
      auto f = net.train_step(std::move(x), std::move(t), 2);
      CHECK_THROWS_AS(
          try { f.get(); } catch (const layers::stall_error& e) {
            what = e.what();
            throw;
          },
          layers::stall_error);
      took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      tensor y(4, layers::shape{6});
      layers::targets u;
      u.labels = {0, 1, 2, 0};
      CHECK_THROWS_AS(net.train_step(std::move(y), std::move(u)).get(), std::runtime_error);
      l->open();
    }
    INFO(what);
    CHECK(took >= 1.0);
    CHECK(took < 6.0);
    CHECK(what.find("network stalled") != std::string::npos);
    CHECK(what.find("layers that have not finished it: fc1, block, fc2") != std::string::npos);
  }

  TEST_CASE("--stall-timeout takes 0 or a positive number of seconds and names itself otherwise") {
    layers::train_options o;
    o.lead = false;  // no files to check
    for (double ok : {0.0, 0.5, 60.0}) {
      o.stall_timeout = ok;
      CHECK_NOTHROW(layers::check_options(o));
    }
    for (double bad : {-1.0, std::numeric_limits<double>::infinity(), std::nan("")}) {
      o.stall_timeout = bad;
      CHECK_THROWS_WITH_AS(layers::check_options(o), doctest::Contains("--stall-timeout must be 0 (no watch) or a positive number of seconds"),
                           std::invalid_argument);
    }
  }
}

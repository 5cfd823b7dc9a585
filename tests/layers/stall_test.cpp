// A training step of a network that stops moving ends with a `stall_error` naming the
// layers that have not finished it (network_options::stall_timeout_s).
#include <doctest/doctest.h>

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

/// Held until `open`: what a layer that blocks its loop (a lock, a device that hangs) does.
struct latch {
  std::mutex m;
  std::condition_variable cv;
  bool opened = false;
  void wait() {
    std::unique_lock lock(m);
    cv.wait(lock, [&] { return opened; });
  }
  void open() {
    std::lock_guard lock(m);
    opened = true;
    cv.notify_all();
  }
};

/// The identity, whose forward waits on `l` in training.
class blocking final : public layers::layer {
 public:
  explicit blocking(std::shared_ptr<latch> l) : l_(std::move(l)) {}
  std::string_view kind() const noexcept override { return "Blocking"; }

 protected:
  layers::shape infer_shape(std::span<const layers::shape> in) const override { return in[0]; }
  forward_result do_forward(std::vector<tensor>& in, const layers::forward_context&) override {
    if (this->training()) l_->wait();
    forward_result r;
    r.output = std::move(in[0]);
    return r;
  }
  std::vector<tensor> do_backward_input(const stash_type&, const tensor& dy, layers::input_mask) override {
    std::vector<tensor> g;
    g.push_back(dy.clone());
    return g;
  }

 private:
  std::shared_ptr<latch> l_;
};

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

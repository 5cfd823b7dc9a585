#pragma once
// A layer that stops its loop, for the tests of the stall report (tests/layers and
// tests/pipeline): the identity, whose training forward waits on a latch the test holds.
#include <condition_variable>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "layers/layer.hpp"

namespace nerve::test {

using layers::tensor;

/// Held until `open`: what a layer that blocks its loop (a lock, a device that hangs) does.
struct latch {
  std::mutex m;
  std::condition_variable cv;
  bool opened = false, entered = false;
  void wait() {
    std::unique_lock lock(m);
    entered = true;
    cv.notify_all();
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

}  // namespace nerve::test

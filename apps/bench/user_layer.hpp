#pragma once
// `nerve-bench train --only user-layer`: a layer as a user writes it, compiled twice into
// nerve-bench (user_layer_native.cpp with nerve's own -march, user_layer_default.cpp with
// the compiler's defaults), so the two builds run the same source inside the same actors.
// Each translation unit defines NERVE_BENCH_USER_LAYER_NS before including this header:
// the two copies have names of their own and never meet at link time.

#include <chrono>
#include <cmath>
#include <memory>

#include "layers/layer.hpp"

namespace nerve::bench {

/// The time a user layer spent in its own calls (forward, B), summed. One loop calls it.
struct user_layer_clock {
  double forward_seconds = 0, backward_seconds = 0;
  long calls = 0;
};

namespace NERVE_BENCH_USER_LAYER_NS {

/// Swish, x·σ(x): a pointwise loop with expf in forward and backward (the layer of issue 37,
/// whose backward ran 20x slower inside the actors than called directly).
class user_swish final : public layers::basic_layer<float> {
 public:
  explicit user_swish(user_layer_clock& clock) : clock_(clock) {}
  std::string_view kind() const noexcept override { return "UserSwish"; }

 protected:
  layers::shape infer_shape(std::span<const layers::shape> inputs) const override { return inputs[0]; }
  forward_result do_forward(std::vector<tensor_type>& inputs, const layers::forward_context&) override {
    const auto t0 = std::chrono::steady_clock::now();
    tensor_type& x = inputs[0];
    tensor_type y(x.batch(), x.sample_shape());
    const float* xs = x.data();
    float* ys = y.data();
    for (std::int64_t i = 0, n = x.size(); i < n; ++i) ys[i] = xs[i] / (1.f + std::exp(-xs[i]));
    forward_result r{std::move(y), {}};
    r.stash.tensors.push_back(std::move(x));
    clock_.forward_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
  }
  std::vector<tensor_type> do_backward_input(const stash_type& saved, const tensor_type& dy,
                                             layers::input_mask) override {
    const auto t0 = std::chrono::steady_clock::now();
    const tensor_type& x = saved.tensors[0];
    std::vector<tensor_type> g(1);
    g[0] = tensor_type(dy.batch(), saved.input_shapes[0]);
    const float *xs = x.data(), *d = dy.data();
    float* gs = g[0].data();
    for (std::int64_t i = 0, n = x.size(); i < n; ++i) {
      const float s = 1.f / (1.f + std::exp(-xs[i]));
      gs[i] = d[i] * s * (1.f + xs[i] * (1.f - s));
    }
    clock_.backward_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++clock_.calls;
    return g;
  }
  void do_backward_weight(const stash_type&, const tensor_type&) override {}

 private:
  user_layer_clock& clock_;
};

}  // namespace NERVE_BENCH_USER_LAYER_NS
}  // namespace nerve::bench

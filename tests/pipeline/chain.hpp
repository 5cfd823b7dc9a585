#pragma once
// The small chain the pipeline suites cut into stages (CPU pipelines in
// tests/pipeline, device stages in tests/gpu).
#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "actors/runtime.hpp"

#include "layers/activation.hpp"
#include "layers/dropout.hpp"
#include "layers/norm.hpp"
#include "layers/graph.hpp"
#include "layers/linear.hpp"

namespace nerve::test {

/// A layer not written with ops (a device runs it on the host): y = x/2, dx = dy/2.
class host_half final : public layers::layer {
 public:
  std::string_view kind() const noexcept override { return "HostHalf"; }

 protected:
  layers::shape infer_shape(std::span<const layers::shape> in) const override { return in[0]; }
  forward_result do_forward(std::vector<layers::tensor>& in, const layers::forward_context&) override {
    in[0].matrix() *= 0.5f;
    return {std::move(in[0]), {}};
  }
  std::vector<layers::tensor> do_backward_input(const stash_type&, const layers::tensor& dy,
                                                layers::input_mask) override {
    std::vector<layers::tensor> g;
    g.push_back(dy.clone());
    g[0].matrix() *= 0.5f;
    return g;
  }
};

/// What `small_chain` puts between relu4 and fc5.
enum class chain_extra { none, dropout, host_layer, batch_norm };

/// input [12] → fc1 → relu1 → … → fc4 → relu4 [→ extra] → fc5 [4]: nine layers (ten with
/// the extra: a Dropout(0.5), a `host_half`, or a BatchNorm with its running statistics).
inline layers::graph small_chain(std::uint64_t seed = 7, chain_extra extra = chain_extra::none) {
  layers::graph_builder b;
  b.input("input", layers::shape{12});
  std::string prev = "input";
  for (int i = 1; i <= 4; ++i) {
    const std::string fc = "fc" + std::to_string(i), relu = "relu" + std::to_string(i);
    b.add(fc, layers::linear(i == 1 ? 12 : 16, 16), {prev});
    b.add(relu, layers::relu(), {fc});
    prev = relu;
  }
  if (extra == chain_extra::dropout) {
    b.add("drop", layers::dropout(0.5), {prev});
    prev = "drop";
  } else if (extra == chain_extra::host_layer) {
    b.add("half", std::make_unique<host_half>(), {prev});
    prev = "half";
  } else if (extra == chain_extra::batch_norm) {
    b.add("bn", layers::batch_norm(16), {prev});
    prev = "bn";
  }
  b.add("fc5", layers::linear(16, 4), {prev});
  return b.build(seed);
}

/// A batch of `n` normal samples for `g`'s input and random labels for its output, from `seed`.
struct batch {
  layers::tensor x;
  layers::targets t;
};
inline batch make_batch(const layers::graph& g, std::int64_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d;
  const auto& shape = g.nodes()[g.inputs()[0]].output_shape;
  batch b{layers::tensor(n, shape), {}};
  for (std::int64_t i = 0; i < b.x.size(); ++i) b.x.data()[i] = d(rng);
  const auto classes = g.nodes()[g.output()].output_shape.numel();
  for (std::int64_t i = 0; i < n; ++i) b.t.labels.push_back(std::int32_t(rng() % std::uint64_t(classes)));
  return b;
}

/// From `rt`'s trace: how many `kind` messages the actors in `members` sent, when the first
/// left, and when the last action span of stage `stage` on `track` ended — what the
/// all-reduce overlap tests compare.
struct send_and_actions {
  std::size_t sends = 0;
  std::int64_t first_send = -1, last_action_end = 0;
};
inline send_and_actions sends_against_actions(actors::runtime& rt, const std::vector<actors::address>& members,
                                              std::string_view kind, std::uint32_t track, std::int32_t stage) {
  auto in_stage = [&](std::uint64_t t) {
    return std::any_of(members.begin(), members.end(), [&](auto& a) { return a.id() == t; });
  };
  send_and_actions out;
  for (const auto& r : rt.trace().snapshot()) {
    if (r.kind == actors::record_kind::send && in_stage(r.track) && r.tag && r.tag->name == kind) {
      ++out.sends;
      if (out.first_send < 0) out.first_send = r.ts_ns;
    }
    if (r.kind == actors::record_kind::span && r.cat && std::string(r.cat) == "action" && r.aux == stage &&
        r.track == track)
      out.last_action_end = std::max(out.last_action_end, r.ts_ns + r.dur_ns);
  }
  return out;
}

}  // namespace nerve::test

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>

#include "layers/activation.hpp"
#include "layers/linear.hpp"
#include "layers/pipeline/pipeline.hpp"
#include "layers/network.hpp"
#include "layers/presets.hpp"
#include "tests/pipeline/chain.hpp"

using namespace nerve;
using namespace nerve::pipeline;
using layers::tensor;

namespace {

bool sanitize_scale() {
  const char* s = std::getenv("NERVE_TEST_SCALE");
  return s && std::string(s) == "sanitize";
}

using nerve::test::small_chain;

using nerve::test::batch;
using nerve::test::make_batch;

layers::optimizer_factory sgd_factory() {
  return [] { return layers::make_optimizer<float>("sgd", 0.05, 0.9); };
}

/// Every parameter of `a` and `b` has the same bits.
void check_bitwise(layers::graph& a, layers::graph& b) {
  auto pa = a.parameters(), pb = b.parameters();
  REQUIRE(pa.size() == pb.size());
  for (std::size_t i = 0; i < pa.size(); ++i) {
    CAPTURE(pa[i].name);
    REQUIRE(pa[i].value->size() == pb[i].value->size());
    CHECK(std::memcmp(pa[i].value->data(), pb[i].value->data(), std::size_t(pa[i].value->size()) * sizeof(float)) == 0);
  }
}

/// Trains `steps` steps directly and through a pipeline with `plan`; checks the weights and losses bitwise.
void check_parity(const std::string& model, const schedule& plan, int steps, std::int64_t batch_size,
                  pipeline_options options = {}, unsigned loops = 2) {
  auto direct_g = model == "chain" ? small_chain() : layers::make_preset(model, 3);
  auto piped_g = model == "chain" ? small_chain() : layers::make_preset(model, 3);
  layers::direct_executor exec(direct_g);
  auto opt = layers::make_optimizer<float>("sgd", 0.05, 0.9);
  auto criterion = std::make_shared<layers::cross_entropy>();
  actors::runtime rt(actors::runtime_options{.loops = loops});
  auto pieces = partition_by_parameters(piped_g, plan.pieces());
  nerve::pipeline::pipeline p(rt, piped_g, pieces, plan, criterion, sgd_factory(), options);
  for (int s = 0; s < steps; ++s) {
    auto b1 = make_batch(direct_g, batch_size, 100 + std::uint64_t(s));
    auto b2 = make_batch(direct_g, batch_size, 100 + std::uint64_t(s));
    auto r1 = exec.train_step(std::move(b1.x), b1.t, *criterion, *opt, plan.micro_batches, std::uint64_t(s));
    auto r2 = p.train_step(std::move(b2.x), b2.t, std::uint64_t(s));
    // The same sum in the same order, but the compiler may fuse share * loss + sum into one
    // FMA in the executor and not here (or the other way): the reported loss may differ in its
    // last bit. The weights never do (checked bitwise below).
    CHECK(r2.loss == doctest::Approx(r1.loss).epsilon(1e-14));
    CHECK(r1.correct == r2.correct);
    CHECK(r1.samples == r2.samples);
  }
  check_bitwise(direct_g, piped_g);
}

std::size_t layers_of(const layers::graph& g) {
  std::size_t n = 0;
  for (auto& x : g.nodes()) n += x.is_input() ? 0 : 1;
  return n;
}

std::vector<std::uint32_t> micro_batch_counts(std::uint32_t S) {
  std::vector<std::uint32_t> v;
  for (std::uint32_t m : {1u, S - 1, S, 2 * S + 1})
    if (m > 0 && std::find(v.begin(), v.end(), m) == v.end()) v.push_back(m);
  return v;
}

/// A layer that passes its input through and throws in its `fail_at`-th backward (0-based).
class failing_layer final : public layers::layer {
 public:
  explicit failing_layer(int fail_at) : fail_at_(fail_at) {}
  std::string_view kind() const noexcept override { return "Failing"; }

 protected:
  layers::shape infer_shape(std::span<const layers::shape> in) const override { return in[0]; }
  forward_result do_forward(std::vector<tensor>& in, const layers::forward_context& ctx) override {
    forward_result r;
    r.output = std::move(in[0]);
    r.stash.indices.push_back(std::int32_t(ctx.micro_batch));
    return r;
  }
  std::vector<tensor> do_backward_input(const stash_type& saved, const tensor& dy, layers::input_mask) override {
    if (saved.indices[0] == fail_at_)
      throw std::runtime_error("boom: backward of micro-batch " + std::to_string(saved.indices[0]));
    std::vector<tensor> g;
    g.push_back(dy.clone());
    return g;
  }

 private:
  int fail_at_;
};

}  // namespace

TEST_SUITE("pipeline.parity") {
  TEST_CASE("every schedule updates weights bitwise as sequential training, S in 1..4, M in 1, S-1, S, 2S+1") {
    const int steps = sanitize_scale() ? 2 : 3;
    for (std::uint32_t S = 1; S <= 4; ++S)
      for (std::uint32_t M : micro_batch_counts(S)) {
        for (auto name : {"gpipe", "1f1b", "zb-h1"}) {
          CAPTURE(name);
          CAPTURE(S);
          CAPTURE(M);
          check_parity("chain", make_schedule(name, S, M), steps, 19);
        }
        CAPTURE(S);
        CAPTURE(M);
        check_parity("chain", make_schedule("interleaved", S, M, 2), steps, 19);
      }
  }

  TEST_CASE("skip connections that cross stages pass through and sum in the same order") {
    // resmlp: fc1 relu1 [fc2 relu2 fc3 add1 relu3] [fc4 relu4 fc5 add2 relu5] fc6; cuts inside blocks.
    for (std::uint32_t S : {2u, 3u, 4u}) {
      CAPTURE(S);
      check_parity("resmlp", make_schedule("1f1b", S, S + 1), 2, 8);
      check_parity("resmlp", make_schedule("zb-h1", S, S + 1), 2, 8);
    }
  }

  TEST_CASE("emergent mode (credits, backward first) is bitwise too") {
    for (std::uint32_t S = 1; S <= 4; ++S)
      for (std::uint32_t M : micro_batch_counts(S)) {
        CAPTURE(S);
        CAPTURE(M);
        pipeline_options o;
        o.emergent = true;
        check_parity("chain", make_schedule("1f1b", S, M), 2, 19, o);
      }
  }

  TEST_CASE("all stages on one loop give the same bits") {
    check_parity("chain", make_schedule("1f1b", 3, 5), 2, 10, {}, 1);
  }
}

TEST_SUITE("pipeline.run") {
  TEST_CASE("a layer throwing in backward on micro-batch k ends the step with its error and stops every stage") {
    for (std::uint32_t S : {2u, 3u}) {
      for (auto name : {"gpipe", "1f1b", "zb-h1"}) {
        CAPTURE(S);
        CAPTURE(name);
        layers::graph_builder b;
        b.input("input", layers::shape{12});
        b.add("fc1", layers::linear(12, 16), {"input"});
        b.add("relu1", layers::relu(), {"fc1"});
        b.add("boom", failing_layer(2), {"relu1"});
        b.add("fc2", layers::linear(16, 16), {"boom"});
        b.add("relu2", layers::relu(), {"fc2"});
        b.add("fc3", layers::linear(16, 4), {"relu2"});
        auto g = b.build(1);
        actors::runtime rt(actors::runtime_options{.loops = 2});
        auto criterion = std::make_shared<layers::cross_entropy>();
        nerve::pipeline::pipeline p(rt, g, partition_by_parameters(g, S), make_schedule(name, S, 4), criterion,
                                    sgd_factory());
        auto data = make_batch(g, 8, 1);
        // The layer actor's failure, named by the actor: "actor 'boom' failed: boom: …".
        CHECK_THROWS_WITH(p.train_step(std::move(data.x), data.t), doctest::Contains("'boom' failed: boom: backward of micro-batch 2"));
        rt.synchronize();  // the stop messages are handled
        CHECK(p.stopped());
        auto again = make_batch(g, 8, 2);
        CHECK_THROWS_WITH(p.train_step(std::move(again.x), again.t), doctest::Contains("previous step failed"));
      }
    }
  }

  TEST_CASE("peak stashed micro-batches: 1f1b holds min(S-s, M), gpipe M, and each schedule its simulated peak") {
    const std::uint32_t S = 3, M = 7;
    for (auto name : {"gpipe", "1f1b", "zb-h1", "interleaved"}) {
      CAPTURE(name);
      auto g = small_chain();
      actors::runtime rt(actors::runtime_options{.loops = 2});
      auto plan = make_schedule(name, S, M, std::string(name) == "interleaved" ? 2 : 1);
      auto sim = simulate(plan);
      nerve::pipeline::pipeline p(rt, g, partition_by_parameters(g, plan.pieces()), plan,
                                  std::make_shared<layers::cross_entropy>(), sgd_factory());
      for (int s = 0; s < 2; ++s) {
        auto data = make_batch(g, 14, std::uint64_t(s));
        p.train_step(std::move(data.x), data.t, std::uint64_t(s));
      }
      auto m = p.metrics();
      for (std::uint32_t s = 0; s < S; ++s) {
        CAPTURE(s);
        CHECK(m[s].peak_stashed == sim.peak_in_flight[s]);
        CHECK(m[s].peak_stash_bytes > 0);
        CHECK(m[s].steps == 2);
      }
      if (std::string(name) == "1f1b")
        for (std::uint32_t s = 0; s < S; ++s) CHECK(m[s].peak_stashed == S - s);
      if (std::string(name) == "gpipe") CHECK(m[0].peak_stashed == M);
    }
  }

  TEST_CASE("metrics add up: busy plus idle is the wall time, idle splits by cause") {
    auto g = small_chain();
    actors::runtime rt(actors::runtime_options{.loops = 2});
    nerve::pipeline::pipeline p(rt, g, partition_by_parameters(g, 2), make_schedule("1f1b", 2, 4),
                                std::make_shared<layers::cross_entropy>(), sgd_factory());
    auto data = make_batch(g, 8, 1);
    p.train_step(std::move(data.x), data.t);
    for (auto& m : p.metrics()) {
      CHECK(m.busy_s > 0);
      CHECK(m.busy_s + m.idle_s == doctest::Approx(m.wall_s));
      CHECK(m.idle_input_s + m.idle_backpressure_s + m.idle_optimizer_s == doctest::Approx(m.idle_s));
      CHECK(m.actions == 8);
    }
    CHECK(p.last_step().size() == 2);
    CHECK(p.last_step()[0].size() == 8);
    CHECK(p.last_step()[0][2].a == action{op::B, 0, 0});
  }

  TEST_CASE("busy time splits into F, B, W and the optimizer, and predicts the bubble of the cut") {
    for (auto name : {"1f1b", "zb-h1"}) {
      CAPTURE(name);
      const bool split = std::string(name) == "zb-h1";
      auto g = small_chain();
      actors::runtime rt(actors::runtime_options{.loops = 2});
      const auto plan = make_schedule(name, 2, 4);
      nerve::pipeline::pipeline p(rt, g, partition_by_parameters(g, 2), plan,
                                  std::make_shared<layers::cross_entropy>(), sgd_factory());
      for (int s = 0; s < 3; ++s) {
        auto data = make_batch(g, 8, std::uint64_t(s));
        p.train_step(std::move(data.x), data.t, std::uint64_t(s));
      }
      const auto m = p.metrics();
      for (const auto& x : m) {
        CAPTURE(x.stage);
        CHECK(x.f_count == 3 * 4);
        CHECK(x.b_count == 3 * 4);
        CHECK(x.w_count == (split ? 3 * 4 : 0));
        CHECK(x.f_s > 0);
        CHECK(x.b_s > 0);
        CHECK((x.w_s > 0) == split);
        CHECK(x.optimizer_s > 0);
        CHECK(x.f_s + x.b_s + x.w_s + x.optimizer_s == doctest::Approx(x.busy_s).epsilon(1e-6));
      }
      // The prediction is the simulation with these costs: a bubble in [0, 1) for every
      // stage, and the theory exactly when every stage costs the same.
      const auto predicted = predicted_bubbles(plan, m);
      REQUIRE(predicted.size() == 2);
      for (double b : predicted) {
        CHECK(b >= 0);
        CHECK(b < 1);
      }
      auto even = m;
      for (auto& x : even) {
        x.f_s = double(x.f_count), x.b_s = split ? double(x.b_count) : 2.0 * double(x.b_count);
        x.w_s = double(x.w_count), x.optimizer_s = 0;
      }
      const auto theory = predicted_bubbles(plan, even);
      for (double b : theory) CHECK(b == doctest::Approx(bubble_theory(plan)));
      CHECK_THROWS_AS(predicted_bubbles(plan, std::vector<stage_metrics>(3)), std::invalid_argument);
    }
  }

  TEST_CASE("emergent mode reproduces 1f1b on the first and last stage") {
    for (std::uint32_t S : {2u, 3u, 4u}) {
      CAPTURE(S);
      const std::uint32_t M = 2 * S + 1;
      auto g = small_chain();
      actors::runtime rt(actors::runtime_options{.loops = 2});
      pipeline_options o;
      o.emergent = true;
      auto plan = make_schedule("1f1b", S, M);
      nerve::pipeline::pipeline p(rt, g, partition_by_parameters(g, S), plan, std::make_shared<layers::cross_entropy>(),
                                  sgd_factory(), o);
      auto data = make_batch(g, 2 * M, 1);
      p.train_step(std::move(data.x), data.t);
      schedule seen = plan;
      for (std::uint32_t s = 0; s < S; ++s) {
        seen.actions[s].clear();
        for (auto& a : p.last_step()[s]) seen.actions[s].push_back(a.a);
      }
      CHECK_NOTHROW(validate(seen));
      CHECK(seen.actions[0] == plan.actions[0]);
      CHECK(seen.actions[S - 1] == plan.actions[S - 1]);
      CHECK(p.metrics()[0].peak_stashed == S);
    }
  }

  TEST_CASE("a schedule that does not fit the partition or is invalid is refused before a step") {
    auto g = small_chain();
    actors::runtime rt(actors::runtime_options{.loops = 2});
    auto crit = std::make_shared<layers::cross_entropy>();
    CHECK_THROWS_WITH(nerve::pipeline::pipeline(rt, g, partition_by_parameters(g, 3), make_schedule("1f1b", 2, 4),
                                                crit, sgd_factory()),
                      doctest::Contains("the partition 3"));
    auto bad = make_schedule("1f1b", 2, 4);
    bad.actions[1].pop_back();
    CHECK_THROWS_AS(nerve::pipeline::pipeline(rt, g, partition_by_parameters(g, 2), bad, crit, sgd_factory()),
                    schedule_error);
    nerve::pipeline::pipeline p(rt, g, partition_by_parameters(g, 2), make_schedule("1f1b", 2, 4), crit, sgd_factory());
    auto data = make_batch(g, 3, 1);
    CHECK_THROWS_WITH(p.train_step(std::move(data.x), data.t), doctest::Contains("into 4 micro-batches"));
  }
}

TEST_SUITE("pipeline.partition") {
  TEST_CASE("explicit split points, parameter balance, and measured cost") {
    auto g = small_chain();
    auto p = partition_at(g, {"fc3"});
    CHECK(to_string(g, p) == "[fc1 relu1 fc2 relu2] | [fc3 relu3 fc4 relu4 fc5]");
    CHECK_THROWS_WITH(partition_at(g, {"fc3", "fc2"}), doctest::Contains("leaves stage 1 empty"));
    CHECK_THROWS_WITH(partition_at(g, {"fc1"}), doctest::Contains("leaves stage 0 empty"));
    CHECK_THROWS_AS(partition_at(g, {"nope"}), layers::wiring_error);
    auto deep = layers::make_preset("deep-mlp", 0);
    CHECK(to_string(deep, partition_by_parameters(deep, 2)) == "[fc1 relu1 fc2 relu2] | [fc3 relu3 fc4 relu4 fc5]");
    CHECK_THROWS_WITH(partition_by_parameters(g, 10), doctest::Contains("cannot cut 9 layers into 10 pieces"));
    auto costs = profile_layers(g, 8, 1);
    REQUIRE(costs.size() == 9);
    auto byc = partition_by_cost(g, costs, 3);
    CHECK(byc.size() == 3);
    for (auto& piece : byc) CHECK(!piece.empty());
    CHECK(partition_by_cost(g, {1, 1, 1, 1, 1, 1, 1, 1, 10}, 2).back().size() == 1);
  }
}

TEST_SUITE("pipeline.data_parallel") {
  /// The largest |a - b| over every parameter, and the largest |a|.
  std::pair<double, double> max_difference(layers::graph& a, layers::graph& b) {
    auto pa = a.parameters(), pb = b.parameters();
    double d = 0, m = 0;
    for (std::size_t i = 0; i < pa.size(); ++i)
      for (std::int64_t k = 0; k < pa[i].value->size(); ++k) {
        d = std::max(d, double(std::abs(pa[i].value->data()[k] - pb[i].value->data()[k])));
        m = std::max(m, double(std::abs(pa[i].value->data()[k])));
      }
    return {d, m};
  }

  TEST_CASE("R replicas at batch b give the weights of one replica at batch R*b, up to summation order") {
    const int steps = sanitize_scale() ? 2 : 3;
    for (std::uint32_t R : {2u, 3u})
      for (std::uint32_t S : {1u, 2u})
        for (auto name : {"1f1b", "zb-h1"}) {
          CAPTURE(R);
          CAPTURE(S);
          CAPTURE(name);
          const std::uint32_t M = 2;
          const std::int64_t b = 6;
          auto single = small_chain();
          std::vector<layers::graph> reps;
          for (std::uint32_t r = 0; r < R; ++r) reps.push_back(small_chain());
          std::vector<layers::graph*> ptrs;
          for (auto& g : reps) ptrs.push_back(&g);
          actors::runtime rt(actors::runtime_options{.loops = 2});
          auto crit = std::make_shared<layers::cross_entropy>();
          auto plan = make_schedule(name, S, M);
          nerve::pipeline::pipeline one(rt, single, partition_by_parameters(single, S), plan, crit, sgd_factory());
          nerve::pipeline::pipeline dp(rt, ptrs, partition_by_parameters(reps[0], S), plan, crit, sgd_factory());
          CHECK(dp.replicas() == R);
          for (int s = 0; s < steps; ++s) {
            auto d1 = make_batch(single, std::int64_t(R) * b, 50 + std::uint64_t(s));
            auto d2 = make_batch(single, std::int64_t(R) * b, 50 + std::uint64_t(s));
            auto r1 = one.train_step(std::move(d1.x), d1.t, std::uint64_t(s));
            auto r2 = dp.train_step(std::move(d2.x), d2.t, std::uint64_t(s));
            CHECK(r2.loss == doctest::Approx(r1.loss).epsilon(1e-6));
            CHECK(r1.correct == r2.correct);
          }
          // Every replica holds the same bits (they stepped the same all-reduced sums).
          for (std::uint32_t r = 1; r < R; ++r) check_bitwise(reps[0], reps[r]);
          // The sums differ only in how they are associated: R partial sums of M
          // micro-batch gradients instead of one running sum of R*M. Each addition rounds by
          // at most 2^-24 relative; after a few steps the weights agree to ~1e-7 relative.
          auto [diff, scale] = max_difference(single, reps[0]);
          CHECK(diff <= 1e-6 * scale);
        }
  }

  TEST_CASE("a layer's gradient all-reduce starts while backward of the step is still running") {
    auto g1 = small_chain(), g2 = small_chain();
    actors::runtime rt(actors::runtime_options{.loops = 2, .record = true});
    nerve::pipeline::pipeline dp(rt, std::vector<layers::graph*>{&g1, &g2}, partition_by_parameters(g1, 1),
                                 make_schedule("1f1b", 1, 3), std::make_shared<layers::cross_entropy>(), sgd_factory());
    auto d = make_batch(g1, 12, 1);
    dp.train_step(std::move(d.x), d.t);
    rt.synchronize();
    // The contributions leave from the layer actors of replica 0's stage (its group).
    const auto& members = dp.stage_group(0, 0).members();
    const auto seen = nerve::test::sends_against_actions(rt, members, "contribution", stage_track(0), 0);
    REQUIRE(seen.first_send > 0);
    CHECK(seen.first_send < seen.last_action_end);  // fc5's bucket leaves during the last B, before fc1's W
  }
}

TEST_SUITE("pipeline.bus") {
  TEST_CASE("one step of M micro-batches over E edges of a 2-stage pipeline delivers exactly E·M forwards and E·M gradients through bus signals") {
    struct variant {
      const char* model;
      const char* schedule;
      std::uint32_t chunks;
      bool emergent;
    };
    for (auto v : {variant{"chain", "1f1b", 1, false}, variant{"chain", "zb-h1", 1, false},
                   variant{"chain", "gpipe", 1, false}, variant{"chain", "interleaved", 2, false},
                   variant{"chain", "1f1b", 1, true}, variant{"resmlp", "1f1b", 1, false},
                   variant{"resmlp", "zb-h1", 1, false}}) {
      for (std::uint32_t M : {1u, 4u}) {
        CAPTURE(v.model);
        CAPTURE(v.schedule);
        CAPTURE(v.emergent);
        CAPTURE(M);
        auto g = std::string(v.model) == "chain" ? small_chain() : layers::make_preset(v.model, 3);
        // Counted from the graph: every input of a layer whose producer is a layer, and the loss.
        std::uint64_t E = 1, inputs = 0;
        for (auto& n : g.nodes())
          for (std::size_t p : n.inputs) (g.nodes()[p].is_input() ? inputs : E) += 1;
        if (std::string(v.model) == "chain") CHECK(E == 9);
        actors::runtime rt(actors::runtime_options{.loops = 2});
        pipeline_options o;
        o.emergent = v.emergent;
        const auto plan = make_schedule(v.schedule, 2, M, v.chunks);
        nerve::pipeline::pipeline p(rt, g, partition_by_parameters(g, plan.pieces()), plan,
                                    std::make_shared<layers::cross_entropy>(), sgd_factory(), o);
        CHECK(p.stage_group(0, 0).size() + p.stage_group(0, 1).size() == layers_of(g));
        auto d = make_batch(g, 8, 1);
        p.train_step(std::move(d.x), d.t, 0);
        auto t = p.traffic();
        CHECK(t.forward == E * M);
        CHECK(t.backward == E * M);
        CHECK(t.feed == inputs * M);
        auto d2 = make_batch(g, 8, 2);
        p.train_step(std::move(d2.x), d2.t, 1);
        t = p.traffic();
        CHECK(t.forward == 2 * E * M);
        CHECK(t.backward == 2 * E * M);
      }
    }
  }

  TEST_CASE("every layer is an actor of its stage's group with a forward and a backward run per micro-batch") {
    const std::uint32_t M = 3;
    auto g = small_chain();
    actors::runtime rt(actors::runtime_options{.loops = 2, .record = true});
    const auto plan = make_schedule("zb-h1", 2, M);
    nerve::pipeline::pipeline p(rt, g, partition_at(g, {"fc3"}), plan, std::make_shared<layers::cross_entropy>(),
                                sgd_factory());
    auto d = make_batch(g, 6, 1);
    p.train_step(std::move(d.x), d.t);
    rt.synchronize();
    const auto records = rt.trace().snapshot();
    for (std::uint32_t s = 0; s < 2; ++s)
      for (const auto& a : p.stage_group(0, s).members()) {
        CAPTURE(s);
        CAPTURE(a.id());
        CHECK(a.loop() == p.stage_actors()[s].loop());
        std::int64_t forwards = 0, backwards = 0;
        for (const auto& r : records)
          if (r.kind == actors::record_kind::handle && r.track == a.id() && r.tag) {
            forwards += r.tag->name == "forward";
            backwards += r.tag->name == "backward";
          }
        CHECK(forwards == M);
        CHECK(backwards == M);
      }
    CHECK(p.stage_group(0, 0).size() == 4);  // fc1 relu1 fc2 relu2
    CHECK(p.stage_group(0, 1).size() == 5);  // fc3 relu3 fc4 relu4 fc5
  }
}

TEST_SUITE("pipeline.checkpoint") {
  TEST_CASE("a pipeline's optimizer state is a network's: the same names, counters and bits, and it loads back") {
    auto piped = small_chain(), networked = small_chain();
    auto crit = std::make_shared<layers::cross_entropy>();
    actors::runtime rt(actors::runtime_options{.loops = 2});
    nerve::pipeline::pipeline p(rt, piped, partition_by_parameters(piped, 2), make_schedule("zb-h1", 2, 3), crit,
                                sgd_factory());
    layers::network net(rt, networked, crit, sgd_factory());
    for (std::uint64_t s = 0; s < 2; ++s) {
      auto a = make_batch(piped, 9, 20 + s), b = make_batch(piped, 9, 20 + s);
      p.train_step(std::move(a.x), a.t, s);
      net.train_step(std::move(b.x), std::move(b.t), 3, s).get();
    }
    check_bitwise(piped, networked);
    const auto ps = p.optimizer_state_of(), ns = net.optimizer_state_of();
    CHECK(ps.counters == ns.counters);
    CHECK(ps.counters.at("fc1.steps") == 2);
    // Buffers by parameter and name (an optimizer lists them in its own order).
    auto by_name = [](const layers::optimizer_state& st) {
      std::map<std::string, std::vector<float>> m;
      for (auto& b : st.buffers) m[b.parameter + "/" + b.name] = b.values;
      return m;
    };
    REQUIRE(ps.buffers.size() == 10);  // a momentum buffer per weight and bias of fc1 … fc5
    CHECK(by_name(ps).count("fc1.weight/momentum_buffer") == 1);
    CHECK(by_name(ps) == by_name(ns));
    // Loaded into a fresh pipeline, it is what that pipeline then reports.
    auto fresh = small_chain();
    nerve::pipeline::pipeline q(rt, fresh, partition_by_parameters(fresh, 2), make_schedule("1f1b", 2, 3), crit,
                                sgd_factory());
    q.load_optimizer_state(ps);
    const auto qs = q.optimizer_state_of();
    CHECK(qs.counters == ps.counters);
    CHECK(by_name(qs) == by_name(ps));
    layers::optimizer_state stray;
    stray.buffers.push_back({"nope.weight", "momentum_buffer", {1.f}});
    CHECK_THROWS_WITH(q.load_optimizer_state(stray), doctest::Contains("'nope.weight' belongs to no layer"));
  }
}

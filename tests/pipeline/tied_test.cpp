// Tied weights (graph_builder::tie): a language model's head that shares its token
// embedding's weight. One parameter in the graph's list and its files; an update made
// from the sum of both gradients, directly, through a network's actors, and across
// pipeline stages and replicas, with the same bits everywhere.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "actors/runtime.hpp"
#include "layers/executor.hpp"
#include "layers/network.hpp"
#include "layers/optimizer.hpp"
#include "layers/module_path.hpp"
#include "layers/pipeline/pipeline.hpp"
#include "layers/presets.hpp"
#include "tests/pipeline/tiny_lm.hpp"

using namespace nerve;
using nerve::test::tiny_lm;
using nerve::test::tiny_lm_batch;

namespace {

bool tied_sanitize_scale() {
  const char* s = std::getenv("NERVE_TEST_SCALE");
  return s && std::string(s) == "sanitize";
}

layers::optimizer_factory tied_adamw() {
  return [] { return layers::make_optimizer<float>("adamw", 0.01, 0, 0.1, false, 0.99); };
}

/// Every parameter of `a` and `b` (each listed once: a tied copy is not) has the same bits.
void check_tied_bitwise(layers::graph& a, layers::graph& b) {
  auto pa = a.parameters(), pb = b.parameters();
  REQUIRE(pa.size() == pb.size());
  for (std::size_t i = 0; i < pa.size(); ++i) {
    CAPTURE(pa[i].name);
    REQUIRE(pa[i].value->size() == pb[i].value->size());
    CHECK(std::memcmp(pa[i].value->data(), pb[i].value->data(), std::size_t(pa[i].value->size()) * sizeof(float)) == 0);
  }
}

/// The head's copy of the weight has the embedding's bits.
bool copies_agree(layers::graph& g) {
  auto& e = g.layer<layers::embedding>("wte").weight();
  auto& h = g.layer<layers::linear>("head").weight();
  return e.size() == h.size() && std::memcmp(e.data(), h.data(), std::size_t(e.size()) * sizeof(float)) == 0;
}

}  // namespace

TEST_SUITE("pipeline.tied") {
  TEST_CASE("a tied weight is one parameter: listed and counted once, the copy starting from the owner") {
    auto tied = tiny_lm(), untied = tiny_lm(5, false);
    REQUIRE(tied.ties().size() == 1);
    CHECK(tied.nodes()[tied.ties()[0].copy].name == "head");
    CHECK(tied.nodes()[tied.ties()[0].owner].name == "wte");
    CHECK(tied.is_tied_copy(tied.index_of("head")));
    CHECK_FALSE(tied.is_tied_copy(tied.index_of("wte")));
    std::vector<std::string> names;
    for (const auto& p : tied.parameters()) names.push_back(p.name);
    CHECK(std::find(names.begin(), names.end(), "head.weight") == names.end());
    CHECK(names.front() == "wte.weight");
    CHECK(untied.parameter_count() - tied.parameter_count() == 11 * 8);
    CHECK(copies_agree(tied));
    // The same stream of initial values: every tensor but the untied head's own.
    auto pu = untied.parameters();
    std::erase_if(pu, [](const auto& p) { return p.name == "head.weight"; });
    auto pt = tied.parameters();
    REQUIRE(pt.size() == pu.size());
    for (std::size_t i = 0; i < pt.size(); ++i) {
      CHECK(pt[i].name == pu[i].name);
      CHECK(std::memcmp(pt[i].value->data(), pu[i].value->data(), std::size_t(pt[i].value->size()) * sizeof(float)) == 0);
    }
  }

  TEST_CASE("a tie between layers whose parameters differ, or a node in two ties, is refused at build") {
    auto builder = [] {
      layers::graph_builder b;
      b.input("input", layers::shape{4});
      b.add("wte", layers::embedding(5, 3), {"input"});
      b.add("mid", layers::linear(3, 3, false), {"wte"});
      b.add("head", layers::linear(3, 5), {"mid"});
      return b;
    };
    auto with_bias = builder();
    with_bias.tie("head", "wte");
    CHECK_THROWS_WITH_AS(with_bias.build(1),
                         "graph: tie: 'head' (weight [5, 3], bias [5]) cannot share the weights of 'wte' (weight "
                         "[5, 3]): the parameters must have the same names and shapes",
                         layers::wiring_error);
    auto shapes = builder();
    shapes.tie("mid", "wte");
    CHECK_THROWS_AS(shapes.build(1), layers::wiring_error);
    auto unknown = builder();
    unknown.tie("lm_head", "wte");
    CHECK_THROWS_WITH(unknown.build(1), "graph: tie: the copy 'lm_head' is not a layer node");
    auto self = builder();
    self.tie("wte", "wte");
    CHECK_THROWS_WITH(self.build(1), "graph: tie: node 'wte' is tied to itself");
  }

  TEST_CASE("one update of a tied weight is the step on the sum of both gradients") {
    // The untied twin starts from the same values; its two gradients, summed, are the
    // tied weight's.
    auto tied = tiny_lm(), twin = tiny_lm(5, false);
    auto crit = std::make_shared<layers::cross_entropy>();
    auto b1 = tiny_lm_batch(5, 9), b2 = tiny_lm_batch(5, 9);
    layers::direct_executor t(tied), u(twin);
    auto still = layers::make_optimizer<float>("sgd", 0.0);  // the gradients, no update
    const auto want = u.train_step(std::move(b2.x), b2.t, *crit, *still, 1, 0);
    auto& w0 = twin.layer<layers::embedding>("wte");
    auto& h0 = twin.layer<layers::linear>("head");
    auto sgd = layers::make_optimizer<float>("sgd", 0.5);
    const auto got = t.train_step(std::move(b1.x), b1.t, *crit, *sgd, 1, 0);
    CHECK(got.loss == want.loss);  // the same model until the update
    auto& w = tied.layer<layers::embedding>("wte").weight();
    double worst = 0;
    for (std::int64_t i = 0; i < w.size(); ++i) {
      const float g = w0.weight_grad().data()[i] + h0.weight_grad().data()[i];
      worst = std::max(worst, std::abs(double(w.data()[i]) - (double(w0.weight().data()[i]) - 0.5 * double(g))));
    }
    CHECK(worst < 1e-7);
    // Both gradients count: neither alone gives the update.
    double head_part = 0;
    for (std::int64_t i = 0; i < w.size(); ++i) head_part = std::max(head_part, std::abs(double(h0.weight_grad().data()[i])));
    CHECK(head_part > 1e-3);
    CHECK(copies_agree(tied));
  }

  TEST_CASE("a network's actors sum a tied weight's gradients with an all-reduce: bitwise the direct executor") {
    for (std::size_t m : {1u, 3u}) {
      CAPTURE(m);
      auto direct_g = tiny_lm(), actor_g = tiny_lm();
      auto crit = std::make_shared<layers::cross_entropy>();
      layers::direct_executor direct(direct_g);
      auto opt = tied_adamw()();
      actors::runtime rt({.loops = 2});
      layers::network net(rt, actor_g, crit, tied_adamw(), layers::network_options{.spread = true});
      for (std::uint64_t s = 0; s < 3; ++s) {
        auto b1 = tiny_lm_batch(7, 20 + s), b2 = tiny_lm_batch(7, 20 + s);
        const auto want = direct.train_step(std::move(b1.x), b1.t, *crit, *opt, m, s);
        const auto got = net.train_step(std::move(b2.x), std::move(b2.t), m, s).get();
        CHECK(got.loss == want.loss);
        CHECK(got.correct == want.correct);
      }
      check_tied_bitwise(direct_g, actor_g);
      CHECK(copies_agree(actor_g));
      // The embedding's optimizer state is the tied weight's; the head's is not written.
      const auto state = net.optimizer_state_of();
      for (const auto& b : state.buffers) CHECK(b.parameter.rfind("head.", 0) != 0);
    }
  }

  TEST_CASE("the embedding on the first stage and the tied head on the last: every schedule bitwise one stage") {
    const int steps = tied_sanitize_scale() ? 2 : 3;
    for (std::uint32_t S : {2u, 3u})
      for (const char* name : {"gpipe", "1f1b", "zb-h1", "interleaved", "emergent"}) {
        CAPTURE(S);
        CAPTURE(name);
        const std::uint32_t M = S + 1;
        auto direct_g = tiny_lm(), piped_g = tiny_lm();
        auto crit = std::make_shared<layers::cross_entropy>();
        layers::direct_executor exec(direct_g);
        auto opt = tied_adamw()();
        const bool emergent = std::string(name) == "emergent";
        const auto plan = std::string(name) == "interleaved" ? nerve::pipeline::make_schedule("interleaved", S, M, 2)
                                                             : nerve::pipeline::make_schedule(emergent ? "1f1b" : name, S, M);
        nerve::pipeline::pipeline_options o;
        o.emergent = emergent;
        actors::runtime rt(actors::runtime_options{.loops = 2});
        nerve::pipeline::pipeline p(rt, piped_g, nerve::pipeline::partition_by_parameters(piped_g, plan.pieces()), plan,
                                    crit, tied_adamw(), o);
        // The cut puts the embedding on the first stage and the head on the last.
        auto stage_of = [&](const char* node) {
          const auto i = piped_g.index_of(node);
          for (std::size_t k = 0; k < p.pieces().size(); ++k)
            if (std::find(p.pieces()[k].begin(), p.pieces()[k].end(), i) != p.pieces()[k].end()) return k % S;
          return std::size_t(S);
        };
        CHECK(stage_of("wte") == 0);
        CHECK(stage_of("head") == S - 1);
        for (int s = 0; s < steps; ++s) {
          auto b1 = tiny_lm_batch(9, 40 + std::uint64_t(s)), b2 = tiny_lm_batch(9, 40 + std::uint64_t(s));
          const auto r1 = exec.train_step(std::move(b1.x), b1.t, *crit, *opt, M, std::uint64_t(s));
          const auto r2 = p.train_step(std::move(b2.x), b2.t, std::uint64_t(s));
          CHECK(r2.loss == doctest::Approx(r1.loss).epsilon(1e-14));
          CHECK(r1.correct == r2.correct);
        }
        check_tied_bitwise(direct_g, piped_g);
        CHECK(copies_agree(piped_g));
      }
  }

  TEST_CASE("replicas of a tied model sum every replica's two copies: the same bits on one stage and on three") {
    const std::uint32_t R = 2, M = 2;
    std::vector<std::vector<float>> finals;
    for (std::uint32_t S : {1u, 3u}) {
      CAPTURE(S);
      std::vector<layers::graph> reps;
      for (std::uint32_t r = 0; r < R; ++r) reps.push_back(tiny_lm());
      std::vector<layers::graph*> ptrs;
      for (auto& g : reps) ptrs.push_back(&g);
      actors::runtime rt(actors::runtime_options{.loops = 2});
      auto crit = std::make_shared<layers::cross_entropy>();
      const auto plan = nerve::pipeline::make_schedule("1f1b", S, M);
      nerve::pipeline::pipeline dp(rt, ptrs, nerve::pipeline::partition_by_parameters(reps[0], S), plan, crit,
                                   tied_adamw());
      for (std::uint64_t s = 0; s < 2; ++s) {
        auto b = tiny_lm_batch(8, 70 + s);
        (void)dp.train_step(std::move(b.x), b.t, s);
      }
      check_tied_bitwise(reps[0], reps[1]);
      for (auto& g : reps) CHECK(copies_agree(g));
      auto& w = reps[0].layer<layers::embedding>("wte").weight();
      finals.emplace_back(w.data(), w.data() + w.size());
    }
    CHECK(finals[0] == finals[1]);
  }

  TEST_CASE("a transformer is cut between its blocks, never inside one, unless the pieces outnumber the places") {
    auto g = layers::make_preset("gpt", 1, layers::preset_shape{layers::shape{64}, 114});
    for (std::size_t pieces : {2u, 3u, 4u, 5u, 8u}) {
      CAPTURE(pieces);
      const auto p = nerve::pipeline::partition_by_parameters(g, pieces);
      REQUIRE(p.size() == pieces);
      for (std::size_t k = 1; k < p.size(); ++k) {
        const auto& before = g.nodes()[p[k - 1].back()].name;
        const auto& first = g.nodes()[p[k].front()].name;
        CAPTURE(before);
        CAPTURE(first);
        const auto block = layers::block_of(first);
        CHECK((block.empty() || block != layers::block_of(before)));
      }
    }
    // The tiny model has 5 places between its parts (wte | wpe | blocks.0 | ln_f | head):
    // 6 pieces must cut inside its block.
    auto tiny = tiny_lm();
    CHECK(nerve::pipeline::partition_by_parameters(tiny, 6).size() == 6);
  }
}

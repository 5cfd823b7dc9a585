#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "layers/pipeline/schedule.hpp"

using namespace nerve::pipeline;

namespace {

/// Validates `s` and returns the error (stage, step, text); fails the test if it is valid.
schedule_error rejected(const schedule& s) {
  try {
    validate(s);
  } catch (const schedule_error& e) {
    return e;
  }
  FAIL("schedule was accepted");
  return schedule_error("", -2, -2);
}

}  // namespace

TEST_SUITE("pipeline.schedule") {
  TEST_CASE("every named schedule is valid for S in 1..4 and M in 1, S-1, S, 2S+1") {
    for (std::uint32_t S = 1; S <= 4; ++S)
      for (std::uint32_t M : {1u, S - 1, S, 2 * S + 1}) {
        if (M == 0) continue;
        for (auto name : {"gpipe", "1f1b", "zb-h1"}) {
          CAPTURE(name);
          CAPTURE(S);
          CAPTURE(M);
          auto s = make_schedule(name, S, M);
          CHECK_NOTHROW(validate(s));
        }
        for (std::uint32_t v : {2u, 3u}) {
          auto s = make_schedule("interleaved", S, M, v);
          CAPTURE(S);
          CAPTURE(M);
          CAPTURE(v);
          CHECK_NOTHROW(validate(s));
        }
      }
  }

  TEST_CASE("1f1b is the PipeDream-flush order") {
    auto s = make_schedule("1f1b", 2, 4);
    CHECK(to_text(s).find("stage 0: F0 F1 B0 F2 B1 F3 B2 B3\n") != std::string::npos);
    CHECK(to_text(s).find("stage 1: F0 B0 F1 B1 F2 B2 F3 B3\n") != std::string::npos);
    auto g = make_schedule("gpipe", 2, 3);
    CHECK(to_text(g).find("stage 0: F0 F1 F2 B0 B1 B2\n") != std::string::npos);
  }

  TEST_CASE("the simulated bubble of gpipe and 1f1b is (S-1)/(M+S-1) and 1f1b holds at most S-s") {
    for (std::uint32_t S = 1; S <= 4; ++S)
      for (std::uint32_t M : {1u, S, 2 * S + 1, 8u}) {
        for (auto name : {"gpipe", "1f1b"}) {
          auto s = make_schedule(name, S, M);
          auto sim = simulate(s);
          CAPTURE(name);
          CAPTURE(S);
          CAPTURE(M);
          for (std::uint32_t st = 0; st < S; ++st) CHECK(sim.bubble[st] == doctest::Approx(bubble_theory(s)));
          if (std::string(name) == "gpipe") CHECK(sim.peak_in_flight[0] == M);
          else
            for (std::uint32_t st = 0; st < S; ++st) CHECK(sim.peak_in_flight[st] == std::min(S - st, M));
        }
      }
  }

  TEST_CASE("zb-h1 has a smaller bubble than 1f1b and interleaving shrinks it too") {
    for (std::uint32_t S : {2u, 4u}) {
      const std::uint32_t M = 2 * S;
      auto one = simulate(make_schedule("1f1b", S, M));
      auto zb = simulate(make_schedule("zb-h1", S, M));
      auto il = simulate(make_schedule("interleaved", S, M, 2), {0.5, 0.5, 0.5});
      CAPTURE(S);
      CHECK(zb.makespan < one.makespan);
      CHECK(zb.makespan == 3 * M + S - 1);  // ZB-H1's bubble: (S-1)(F+B-W) with F = B = W
      for (auto p : zb.peak_in_flight) CHECK(p <= S);
      CHECK(il.makespan < one.makespan);
    }
  }

  TEST_CASE("uneven stages: 1f1b takes F0 + M(F1+B1) + B0 when stage 1 is the slower one") {
    // Stage 1 costs twice stage 0: it never waits after its first F, and stage 0 idles
    // for the difference. Hand-worked timeline for M = 4 in the comment of each check.
    const std::vector<action_costs> costs{{1, 1, 0}, {2, 2, 0}};
    for (std::uint32_t M : {1u, 4u, 8u}) {
      CAPTURE(M);
      auto sim = simulate(make_schedule("1f1b", 2, M), costs);
      CHECK(sim.makespan == doctest::Approx(1 + 4.0 * M + 1));  // M = 4: 18
      CHECK(sim.bubble[1] == doctest::Approx(1 - 4.0 * M / (4.0 * M + 2)));
      CHECK(sim.bubble[0] == doctest::Approx(1 - 2.0 * M / (4.0 * M + 2)));
    }
    // Equal per-stage costs give the single-cost timeline.
    auto even = simulate(make_schedule("zb-h1", 3, 5), std::vector<action_costs>(3, {1, 1, 1}));
    auto one = simulate(make_schedule("zb-h1", 3, 5));
    CHECK(even.makespan == one.makespan);
    CHECK(even.bubble == one.bubble);
    CHECK_THROWS_WITH(simulate(make_schedule("1f1b", 3, 5), costs), doctest::Contains("2 stage costs for 3 stages"));
  }

  TEST_CASE("interleaved reaches (S-1)/(vM+S-1) when S divides M") {
    for (std::uint32_t S = 2; S <= 4; ++S)
      for (std::uint32_t v : {2u, 3u})
        for (std::uint32_t M : {S, 2 * S}) {
          auto s = make_schedule("interleaved", S, M, v);
          auto sim = simulate(s);
          CAPTURE(S);
          CAPTURE(v);
          CAPTURE(M);
          for (double b : sim.bubble) CHECK(b == doctest::Approx(double(S - 1) / double(v * M + S - 1)));
        }
  }

  TEST_CASE("a schedule round-trips through its text form and a file") {
    auto s = make_schedule("interleaved", 3, 6, 2);
    auto t = parse_schedule(to_text(s));
    CHECK(t.name == s.name);
    CHECK(t.stages == 3);
    CHECK(t.micro_batches == 6);
    CHECK(t.chunks == 2);
    CHECK(t.actions == s.actions);
    auto z = make_schedule("zb-h1", 2, 4);
    auto path = std::filesystem::temp_directory_path() / "nerve_schedule_test.txt";
    save_schedule(z, path);
    auto back = load_schedule(path);
    std::filesystem::remove(path);
    CHECK(back.split_backward);
    CHECK(back.actions == z.actions);
    CHECK_NOTHROW(validate(back));
  }

  TEST_CASE("bad text names the line") {
    CHECK_THROWS_WITH_AS(parse_schedule("stages 2\nstage 0: F0 X1\n"), doctest::Contains("line 2"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(parse_schedule("stages two\n"), doctest::Contains("line 1"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(parse_schedule("stage 1: F0\n"), doctest::Contains("out of order"), std::invalid_argument);
  }

  TEST_CASE("the tables show stages, steps and bubbles") {
    auto s = make_schedule("1f1b", 2, 4);
    auto t = to_table(s);
    CHECK(t.find("stage 0 | F0 F1 .  .  B0 B0 F2 B1 B1 F3 B2 B2 .  B3 B3") != std::string::npos);
    CHECK(t.find("stage 1 | .  F0 B0 B0 F1 B1 B1 F2 B2 B2 F3 B3 B3 .  .") != std::string::npos);
    CHECK(t.find("bubble 20%") != std::string::npos);
    auto st = to_step_table(s);
    CHECK(st.find("stage 0 | F0 F1 B0 F2 B1 F3 B2 B3") != std::string::npos);
  }

  TEST_CASE("a missing B is refused with its stage") {
    auto s = make_schedule("1f1b", 2, 3);
    auto& l = s.actions[1];
    l.erase(std::find(l.begin(), l.end(), action{op::B, 2, 0}));
    auto e = rejected(s);
    CHECK(e.stage() == 1);
    CHECK(e.step() == int(l.size()));
    CHECK(std::string(e.what()).find("never runs B of micro-batch 2") != std::string::npos);
    CHECK(std::string(e.what()).find("stage 0 waits for its gradient") != std::string::npos);
  }

  TEST_CASE("B before its F is refused at its step") {
    auto s = make_schedule("gpipe", 2, 2);
    std::swap(s.actions[0][1], s.actions[0][3]);  // F0 B1 B0 F1
    auto e = rejected(s);
    CHECK(e.stage() == 0);
    CHECK(e.step() == 1);
    CHECK(std::string(e.what()).find("B of micro-batch 1 comes before its F") != std::string::npos);
  }

  TEST_CASE("W before its B, a duplicate, and out-of-range ids are refused") {
    auto z = make_schedule("zb-h1", 2, 2);
    auto& l = z.actions[1];
    auto w = std::find(l.begin(), l.end(), action{op::W, 0, 0});
    auto b = std::find(l.begin(), l.end(), action{op::B, 0, 0});
    std::iter_swap(w, b);
    auto e = rejected(z);
    CHECK(e.stage() == 1);
    CHECK(e.step() == int(b - l.begin()));
    CHECK(std::string(e.what()).find("comes before its B") != std::string::npos);

    auto d = make_schedule("gpipe", 1, 2);
    d.actions[0][1] = action{op::F, 0, 0};
    CHECK(rejected(d).step() == 1);
    auto r = make_schedule("gpipe", 1, 2);
    r.actions[0][0].micro_batch = 7;
    CHECK(std::string(rejected(r).what()).find("only 2 micro-batches") != std::string::npos);
    auto c = make_schedule("gpipe", 1, 2);
    c.actions[0][0].chunk = 1;
    CHECK(rejected(c).step() == 0);
    auto nw = make_schedule("gpipe", 1, 1);
    nw.actions[0].push_back({op::W, 0, 0});
    CHECK(std::string(rejected(nw).what()).find("split 0") != std::string::npos);
  }

  TEST_CASE("a wait cycle is refused with the stages and steps that wait") {
    // Stage 0 wants B0 before sending F1; stage 1 wants F1 before sending B0.
    schedule s;
    s.name = "cycle";
    s.stages = 2;
    s.micro_batches = 2;
    s.actions = {{{op::F, 0, 0}, {op::B, 0, 0}, {op::F, 1, 0}, {op::B, 1, 0}},
                 {{op::F, 0, 0}, {op::B, 0, 0}, {op::F, 1, 0}, {op::B, 1, 0}}};
    CHECK_NOTHROW(validate(s));  // this one is fine
    s.actions[1] = {{op::F, 1, 0}, {op::F, 0, 0}, {op::B, 0, 0}, {op::B, 1, 0}};
    // Stage 1 waits for F1 first; stage 0 sends F1 only after B0, which needs stage 1's B0.
    auto e = rejected(s);
    CHECK(e.stage() == 0);
    CHECK(e.step() == 1);
    const std::string what = e.what();
    CHECK(what.find("wait cycle") != std::string::npos);
    CHECK(what.find("stage 0, step 1 (B of micro-batch 0) waits for stage 1's B of micro-batch 0") !=
          std::string::npos);
    CHECK(what.find("stage 1, step 0 (F of micro-batch 1) waits for stage 0's F of micro-batch 1") !=
          std::string::npos);
  }

  TEST_CASE("bad counts are refused") {
    CHECK_THROWS_AS(make_schedule("1f1b", 0, 4), std::invalid_argument);
    CHECK_THROWS_AS(make_schedule("1f1b", 2, 4, 2), std::invalid_argument);
    CHECK_THROWS_AS(make_schedule("interleaved", 2, 4, 1), std::invalid_argument);
    CHECK_THROWS_WITH(make_schedule("pipedream", 2, 4), doctest::Contains("known: gpipe"));
    schedule s;
    s.stages = 2;
    s.actions.resize(1);
    CHECK(rejected(s).stage() == 1);
  }
}

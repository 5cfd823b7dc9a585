// Round trip on synthetic traces: what the generator knows by construction must come
// back out of reading and summarising the file it wrote.

#include "apps/trace/reader.hpp"
#include "apps/trace/schedule_plan.hpp"
#include "apps/trace/summary.hpp"
#include "apps/trace/synth.hpp"

#include <doctest/doctest.h>

#include <sstream>

using namespace nerve::trace;

TEST_SUITE("trace.synth") {
  TEST_CASE("the summary recovers the generator's busy time, idle causes and counts") {
    synth_options o;
    o.stages = 3;
    o.microbatches = 4;
    o.actors_per_stage = 2;
    o.steps = 2;
    o.jitter = 0.25;
    o.seed = 7;
    std::ostringstream out;
    const auto truth = write_synthetic_trace(o, out);
    CHECK(truth.steps == 2);

    diagnostics d;
    auto t = read_trace_text(out.str(), "synth.json", d);
    INFO((d.items.empty() ? std::string() : d.items.front().to_string()));
    REQUIRE(d.items.empty());
    CHECK(t.flows.size() == truth.flows);
    trace_index index(t);
    CHECK(index.steps.at(0).size() == 2);
    auto s = summarize(index, {});
    REQUIRE(s.stages.size() == 3);
    for (const auto& st : s.stages) {
      const auto k = static_cast<std::size_t>(st.stage);
      CHECK(st.window_us == doctest::Approx(truth.span_us).epsilon(1e-9));
      CHECK(st.busy_us == doctest::Approx(truth.stage_busy_us[k]).epsilon(1e-6));
      CHECK(st.bubble_pct == doctest::Approx((1.0 - truth.stage_busy_us[k] / truth.span_us) * 100.0).epsilon(1e-6));
      for (const auto& [cause, us] : truth.stage_idle_us[k]) CHECK(st.idle_by_cause.at(cause) == doctest::Approx(us).epsilon(1e-6));
      CHECK(st.idle_unattributed_us == doctest::Approx(0).epsilon(1e-6));
    }
    std::size_t runs = 0;
    for (const auto& a : s.actors) {
      CHECK(a.busy_us == doctest::Approx(truth.actor_busy_us.at(a.tid)).epsilon(1e-6));
      CHECK(a.messages_in == truth.actor_messages_in.at(a.tid));
      CHECK(a.messages_out == truth.actor_messages_out.at(a.tid));
      runs += a.messages_in;
    }
    CHECK(runs == truth.handler_runs);

    SUBCASE("the critical path of the last step spans it and ends at its last run") {
      REQUIRE(s.paths.size() == 1);
      const auto& p = s.paths[0];
      CHECK(p.step.step == 1);
      const auto& last = t.events[p.links.back().run];
      CHECK(last.end() == doctest::Approx(truth.step_end_us[1]));
      CHECK(t.str(last.name) == "step");
      CHECK(p.length_us <= truth.step_end_us[1] - truth.step_start_us[1] + 1e-6);
      CHECK(p.wait_us >= -1e-6);
    }
    SUBCASE("--step picks one step") {
      summary_options so;
      so.select.step = 0;
      auto s0 = summarize(index, so);
      CHECK(s0.windows.at(0).end == doctest::Approx(truth.step_end_us[0]));
      REQUIRE(s0.paths.size() == 1);
      CHECK(s0.paths[0].step.step == 0);
    }
  }

  TEST_CASE("with uniform times the bubble is the 1F1B formula (S-1)/(M+S-1)") {
    synth_options o;
    o.stages = 4;
    o.microbatches = 8;
    o.actors_per_stage = 1;
    o.load_us = 0;
    o.optimizer_us = 0;
    std::ostringstream out;
    write_synthetic_trace(o, out);
    diagnostics d;
    auto t = read_trace_text(out.str(), "synth.json", d);
    REQUIRE(d.error_count() == 0);
    trace_index index(t);
    auto s = summarize(index, {});
    const double expected = 3.0 / 11.0 * 100.0;
    for (const auto& st : s.stages) {
      CHECK(st.bubble_pct == doctest::Approx(expected).epsilon(1e-4));
      CHECK(st.planned_bubble_pct == doctest::Approx(expected));
    }
  }

  TEST_CASE("the planned schedule plays out with the textbook makespan") {
    schedule_info s;
    for (std::int32_t k = 0; k < 4; ++k) s.actions.push_back(one_f_one_b(4, k, 8));
    auto p = play_schedule(s, op_durations(4, {1.0, 2.0, 0.0}));
    CHECK(p.error.empty());
    CHECK(p.makespan == doctest::Approx((8 + 4 - 1) * 3.0));
    CHECK(p.bubble(0) == doctest::Approx(3.0 / 11.0));

    SUBCASE("a schedule that cannot run says where it stops") {
      s.actions[1] = {{'B', 0, 0}, {'F', 0, 0}};
      auto bad = play_schedule(s, op_durations(4, {1.0, 2.0, 0.0}));
      CHECK(bad.error.find("stage 1, step 0") != std::string::npos);
    }
  }
}

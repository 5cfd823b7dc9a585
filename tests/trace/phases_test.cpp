// The plan and the phases of a run in the summary and the page: the planned bubble of a
// merged trace's ranks is the one-process run's, and evaluation between epochs is its own
// phase, outside the training time the bubbles cover. The figures are worked out by hand.

#include "apps/trace/html_page.hpp"
#include "apps/trace/reader.hpp"
#include "apps/trace/summary.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <sstream>
#include <string>

using namespace nerve::trace;

namespace {

const stage_summary& stage(const summary& s, std::int64_t pid, std::int32_t id) {
  for (const auto& st : s.stages)
    if (st.pid == pid && st.stage == id) return st;
  FAIL("no stage " << id << " in pid " << pid);
  return s.stages.front();
}

// A 2-stage 1F1B step of 2 micro-batches as the engine records it: stage 0 takes F 10 and
// B 20 µs, stage 1 F 20 and B 40 µs, with no transfer time, so the run is its own plan:
//
//   stage 0  F0 [0,10] F1 [10,20] ............ B0 [70,90] ............ B1 [130,150]
//   stage 1 .......... F0 [10,30] B0 [30,70] F1 [70,90] B1 [90,130]
//
// makespan 150: stage 0 busy 60 (planned bubble 60%), stage 1 busy 120 (20%). Then the
// evaluation of epoch 1: [160,210] in one process; on two ranks rank 0's is [160,200] and
// rank 1's [170,210] (a collective: the job evaluates from 160 to 210).
//
// `merged`: the ranks of an MPI job in one file (bus::mpi::write_merged_trace): stage s on
// rank s, whose pid is s; the schedule once at the top of `nerve`.
std::string planned_step(bool merged) {
  struct action {
    int stage;
    const char* op;
    int mb;
    double ts, dur;
  };
  const action actions[] = {{0, "F", 0, 0, 10},  {0, "F", 1, 10, 10},  {0, "B", 0, 70, 20},  {0, "B", 1, 130, 20},
                            {1, "F", 0, 10, 20}, {1, "B", 0, 30, 40},  {1, "F", 1, 70, 20},  {1, "B", 1, 90, 40}};
  auto pid = [&](int stage) { return std::to_string(merged ? stage : 0); };
  std::string t = R"({"displayTimeUnit":"ns","traceEvents":[)";
  t += R"({"ph":"X","cat":"step","name":"step","pid":0,"tid":0,"ts":0,"dur":150,"args":{"step":0}})";
  if (merged) {
    t += R"(,{"ph":"M","name":"process_name","pid":0,"tid":0,"args":{"name":"rank 0"}})";
    t += R"(,{"ph":"M","name":"process_name","pid":1,"tid":0,"args":{"name":"rank 1"}})";
    t += R"(,{"ph":"X","cat":"step","name":"step","pid":1,"tid":0,"ts":5,"dur":145,"args":{"step":0}})";
    t += R"(,{"ph":"X","cat":"evaluation","name":"evaluate","pid":0,"tid":0,"ts":160,"dur":40,"args":{"epoch":1}})";
    t += R"(,{"ph":"X","cat":"evaluation","name":"evaluate","pid":1,"tid":0,"ts":170,"dur":40,"args":{"epoch":1}})";
  } else {
    t += R"(,{"ph":"X","cat":"evaluation","name":"evaluate","pid":0,"tid":0,"ts":160,"dur":50,"args":{"epoch":1}})";
  }
  for (const auto& a : actions)
    t += R"(,{"ph":"X","cat":"action","name":")" + std::string(a.op) + R"(","pid":)" + pid(a.stage) +
         R"(,"tid":)" + std::to_string(2000000 + a.stage) + R"(,"ts":)" + std::to_string(a.ts) + R"(,"dur":)" +
         std::to_string(a.dur) + R"(,"args":{"mb":)" + std::to_string(a.mb) + R"(,"chunk":0,"stage":)" +
         std::to_string(a.stage) + R"(,"step":0}})";
  t += R"(],"nerve":{"version":1,"stages":[{"pid":)" + pid(0) + R"(,"stage":0,"actors":[]},{"pid":)" + pid(1) +
       R"(,"stage":1,"actors":[]}],)";
  if (merged) t += R"("ranks":[{"rank":0,"offset_ns":0,"rtt_ns":0},{"rank":1,"offset_ns":0,"rtt_ns":0}],)";
  t += R"("schedule":{"name":"1f1b","stages":2,"microbatches":2,"chunks":1,"actions":[
         [{"op":"F","mb":0,"chunk":0},{"op":"F","mb":1,"chunk":0},{"op":"B","mb":0,"chunk":0},{"op":"B","mb":1,"chunk":0}],
         [{"op":"F","mb":0,"chunk":0},{"op":"B","mb":0,"chunk":0},{"op":"F","mb":1,"chunk":0},{"op":"B","mb":1,"chunk":0}]]}}})";
  return t;
}

// One stage of one actor over two steps, with the evaluation of epoch 1 between them:
//
//   track 0   step 0 [0,50]    evaluate [60,160]           step 1 [160,200]
//   actor 1   fwd [0,40]       fwd [70,90] (evaluating)    fwd [160,190]
//   stage 0   idle optimizer [40,50]                       idle optimizer [190,200]
//
// Window 0..200: evaluation 100, training 100, busy in training 40 + 30 = 70, so the bubble
// is 30 of 100 (30%): optimizer 20 and unattributed 10 (the gap [50,60] before evaluating).
// Counting evaluation as training would read busy 90 of 200, a 55% bubble, 90 unattributed.
const std::string evaluated_run = R"({"displayTimeUnit":"ns","traceEvents":[
  {"ph":"M","name":"thread_name","pid":0,"tid":1,"args":{"name":"fc1"}},
  {"ph":"X","cat":"step","name":"step","pid":0,"tid":0,"ts":0,"dur":50,"args":{"step":0}},
  {"ph":"X","cat":"handler","name":"forward","pid":0,"tid":1,"ts":0,"dur":40,"args":{"loop":0,"mb":0,"queue_us":0,"sender":0}},
  {"ph":"X","cat":"idle","name":"idle","pid":0,"tid":2000000,"ts":40,"dur":10,"args":{"cause":"optimizer","stage":0}},
  {"ph":"X","cat":"evaluation","name":"evaluate","pid":0,"tid":0,"ts":60,"dur":100,"args":{"epoch":1}},
  {"ph":"X","cat":"handler","name":"forward","pid":0,"tid":1,"ts":70,"dur":20,"args":{"loop":0,"mb":0,"queue_us":0,"sender":0}},
  {"ph":"X","cat":"step","name":"step","pid":0,"tid":0,"ts":160,"dur":40,"args":{"step":1}},
  {"ph":"X","cat":"handler","name":"forward","pid":0,"tid":1,"ts":160,"dur":30,"args":{"loop":0,"mb":0,"queue_us":0,"sender":0}},
  {"ph":"X","cat":"idle","name":"idle","pid":0,"tid":2000000,"ts":190,"dur":10,"args":{"cause":"optimizer","stage":0}}],
  "nerve":{"version":1,"actors":[{"id":1,"name":"fc1","loop":0,"stage":0}],"stages":[{"stage":0,"actors":[],"loop":0}]}})";

}  // namespace

TEST_SUITE("trace.phases") {
  TEST_CASE("a merged trace's planned bubble is the one-process run's: each rank's plan is timed by every rank's actions") {
    diagnostics d1, d2;
    auto one = read_trace_text(planned_step(false), "one.json", d1);
    auto job = read_trace_text(planned_step(true), "job.json", d2);
    CHECK(d1.error_count() == 0);
    CHECK(d2.error_count() == 0);
    trace_index one_index(one), job_index(job);
    REQUIRE(job_index.job);
    const auto s1 = summarize(one_index, {});
    const auto s2 = summarize(job_index, {});
    CHECK(stage(s1, 0, 0).planned_bubble_pct == doctest::Approx(60));
    CHECK(stage(s1, 0, 1).planned_bubble_pct == doctest::Approx(20));
    CHECK(stage(s2, 0, 0).planned_bubble_pct == doctest::Approx(60));
    CHECK(stage(s2, 1, 1).planned_bubble_pct == doctest::Approx(20));
    CHECK(s2.stages.size() == 2);  // a rank has the stages it runs, no others

    // The job evaluates while any rank does: [160,210], as the one process.
    for (const auto* s : {&s1, &s2})
      for (const auto& st : s->stages) {
        CHECK(st.window_us == doctest::Approx(210));
        CHECK(st.evaluation_us == doctest::Approx(50));
        CHECK(st.training_us == doctest::Approx(160));
      }
    CHECK(s2.evaluation_us.at(0) == doctest::Approx(40));  // each rank's own slices
    CHECK(s2.evaluation_us.at(1) == doctest::Approx(40));

    // The page says so, and draws each rank's plan under the stages it ran only.
    std::ostringstream one_page, job_page;
    const auto one_stats = write_html_page(one_index, {}, one_page);
    const auto job_stats = write_html_page(job_index, {}, job_page);
    CHECK(job_page.str().find("rank 0 stage 0 bubble 100.0% (plan 60.0%)") != std::string::npos);
    CHECK(job_page.str().find("rank 1 stage 1 bubble 100.0% (plan 20.0%)") != std::string::npos);
    CHECK(std::count(job_stats.lane_labels.begin(), job_stats.lane_labels.end(), "stage 1") == 1);
    // The same planned actions: the job's page has only rank 1's step and evaluation slices more.
    CHECK(job_stats.events == one_stats.events + 2);
  }

  TEST_CASE("evaluation is its own phase: the bubble covers training time only") {
    diagnostics d;
    auto t = read_trace_text(evaluated_run, "evaluated.json", d);
    CHECK(d.error_count() == 0);
    trace_index index(t);
    const auto s = summarize(index, {});
    const auto& st = stage(s, 0, 0);
    CHECK(st.window_us == doctest::Approx(200));
    CHECK(st.evaluation_us == doctest::Approx(100));
    CHECK(st.training_us == doctest::Approx(100));
    CHECK(st.busy_us == doctest::Approx(70));
    CHECK(st.bubble_pct == doctest::Approx(30));
    CHECK(st.idle_by_cause.at("optimizer") == doctest::Approx(20));
    CHECK(st.idle_unattributed_us == doctest::Approx(10));
    CHECK(s.evaluation_counts.at(0) == 1);
    CHECK(s.evaluation_us.at(0) == doctest::Approx(100));

    const auto j = to_json(s, t);
    CHECK(j["processes"][0]["evaluations"] == 1);
    CHECK(j["processes"][0]["evaluation_us"].get<double>() == doctest::Approx(100));
    CHECK(j["stages"][0]["evaluation_us"].get<double>() == doctest::Approx(100));
    CHECK(j["stages"][0]["training_us"].get<double>() == doctest::Approx(100));
    CHECK(j["stages"][0]["bubble_pct"].get<double>() == doctest::Approx(30));

    std::ostringstream text;
    print_summary(s, t, text);
    CHECK(text.str().find("2 step(s), 1 evaluation(s) 0.100 ms") != std::string::npos);
    CHECK(text.str().find("training = window - evaluation") != std::string::npos);
    CHECK(text.str().find("       200.0       100.0        70.0     30.0") != std::string::npos);
    CHECK(text.str().find("unattributed 10.0") != std::string::npos);

    std::ostringstream page;
    write_html_page(index, {}, page);
    CHECK(page.str().find("evaluation 0.1 ms (1), apart from training: not in the bubbles") != std::string::npos);
    CHECK(page.str().find("stage 0 bubble 30.0%") != std::string::npos);

    SUBCASE("one step selects no evaluation") {
      summary_options o;
      o.select.step = 1;
      const auto step = summarize(index, o);
      CHECK(stage(step, 0, 0).evaluation_us == doctest::Approx(0));
      CHECK(stage(step, 0, 0).bubble_pct == doctest::Approx(25));  // busy 30 of 40
      CHECK(step.evaluation_counts.at(0) == 0);
    }
  }
}

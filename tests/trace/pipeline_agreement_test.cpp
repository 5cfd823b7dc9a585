// The viewer's per-stage bubble against nerve-pipeline's own measurement of the same run:
// both must tell the same story (issue 5).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>

#include "apps/trace/analysis.hpp"
#include "apps/trace/reader.hpp"
#include "apps/trace/summary.hpp"
#include "layers/pipeline/pipeline.hpp"
#include "layers/presets.hpp"

using namespace nerve;

namespace {

struct batch {
  layers::tensor x;
  layers::targets t;
};

batch random_batch(std::int64_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  batch b{layers::tensor(n, layers::shape{784}), {}};
  for (std::int64_t i = 0; i < b.x.size(); ++i) b.x.data()[i] = u(rng);
  for (std::int64_t i = 0; i < n; ++i) b.t.labels.push_back(std::int32_t(rng() % 10));
  return b;
}

}  // namespace

TEST_CASE("the summary's stage bubbles agree with the pipeline's own measurement") {
  const char* scale = std::getenv("NERVE_TEST_SCALE");
  const bool sanitized = scale && std::string(scale) == "sanitize";
  // Batch 256 even under the sanitizers: the viewer also counts the handler time around
  // the actions (unpacking, stashing), which the sanitizers inflate; with small batches
  // it grew to 4 points of the step under TSan, with 256 samples the actions dominate.
  //
  // The two measure the same step with different clocks in hand: the pipeline times its
  // actions inside the handlers, the viewer takes the union of the handler runs inside the
  // step slice. Measured: within 1 point on a quiet machine, 2.0 with layers_test beside it
  // on 2 cores (the viewer also counts the handler code around the actions, which
  // preemption and sanitizers stretch): 5 points required, 8 in sanitized builds. A loop
  // thread preempted inside a handler but outside its action (one step in about twenty
  // on a loaded 2-core machine, up to 12 points) is busy to the viewer and idle to the
  // pipeline. Under heavy load that hits many steps, so each schedule gets up to 8 recorded
  // steps (a few ms each) and must agree on one of them; a viewer that measures wrongly
  // disagrees on all of them.
  //
  // Under ThreadSanitizer the handler code around stage 0's actions runs slow enough to be
  // 10-15 points of the step on the 2-vCPU VM of 2026-11-25 (the landed code of that
  // morning read the same): busy to the viewer, idle to the pipeline. Stage 1 agrees
  // within 2 points there. TSan builds allow 20 points; the release bound (5) is the
  // real check.
#if defined(__SANITIZE_THREAD__)
  const double bound = 20.0;
#else
  const double bound = sanitized ? 8.0 : 5.0;
#endif
  for (std::string_view kind : {"gpipe", "1f1b"}) {
    CAPTURE(kind);
    auto g = layers::make_preset("mlp", 5);
    actors::runtime rt({.loops = 2});
    auto plan = pipeline::make_schedule(kind, 2, 4);
    pipeline::pipeline p(rt, g, pipeline::partition_by_parameters(g, 2), plan, std::make_shared<layers::cross_entropy>(),
                         [] { return layers::make_optimizer<float>("sgd", 0.05, 0.9); });
    // A warm-up step unrecorded, then recorded steps measured by both sides.
    auto b0 = random_batch(256, 1);
    p.train_step(std::move(b0.x), b0.t, 0);
    rt.synchronize();
    std::string attempts;
    bool agreed = false;
    for (std::uint64_t step = 1; step <= 8 && !agreed; ++step) {
      p.reset_metrics();
      rt.trace().clear();
      rt.trace().enable();
      auto b1 = random_batch(256, 1 + step);
      p.train_step(std::move(b1.x), b1.t, step);
      rt.synchronize();
      rt.trace().enable(false);
      const auto path =
          (std::filesystem::temp_directory_path() / ("nerve-agree-" + std::string(kind) + ".json")).string();
      pipeline::write_trace(rt, p, path);

      trace::diagnostics diags;
      auto t = trace::read_trace_file(path, diags);
      std::filesystem::remove(path);
      std::string found;
      for (const auto& d : diags.items) found += d.to_string() + "\n";
      INFO(found);
      REQUIRE(diags.error_count() == 0);
      trace::trace_index index(t);
      trace::summary_options o;
      o.select.step = std::int64_t(step);
      auto s = trace::summarize(index, o);

      auto m = p.metrics();
      REQUIRE(m.size() == 2);
      REQUIRE(s.stages.size() == 2);
      agreed = true;
      attempts += "step " + std::to_string(step) + ":";
      for (const auto& st : s.stages) {
        const double own = 100 * m.at(std::size_t(st.stage)).bubble_fraction();
        attempts += " stage " + std::to_string(st.stage) + " viewer " + std::to_string(st.bubble_pct) + "% own " +
                    std::to_string(own) + "%";
        if (!(std::abs(st.bubble_pct - own) <= bound)) agreed = false;
      }
      attempts += "\n";
    }
    INFO(attempts);
    CHECK(agreed);
  }
}

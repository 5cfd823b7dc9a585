// GPU work in the recorder (issue 7), on the CPU stand-in: a span per step on its
// stream's track, an arrow from the enqueuing handler to the span and one from the span
// to the completion handler's run, the tracks named; and nerve-trace reads the file.
#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <nlohmann/json.hpp>

#include "actors/runtime.hpp"
#include "apps/trace/analysis.hpp"
#include "apps/trace/reader.hpp"
#include "apps/trace/summary.hpp"
#include "gpu/device.hpp"
#include "gpu/layers/device_network.hpp"
#include "layers/presets.hpp"

using namespace nerve;

namespace {

struct sample_batch {
  std::vector<float> x;
  std::vector<std::int32_t> y;
};

sample_batch random_batch(std::size_t rows, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  sample_batch b;
  b.x.resize(rows * 784);
  for (auto& v : b.x) v = u(rng);
  for (std::size_t i = 0; i < rows; ++i) b.y.push_back(std::int32_t(rng() % 10));
  return b;
}

/// What the exported trace holds, counted.
struct trace_counts {
  std::map<std::string, std::string> thread_names;  // tid -> name
  int gpu_spans = 0, completions = 0;
  std::map<std::uint64_t, std::vector<std::pair<std::string, std::int64_t>>> flows;  // id -> (ph, tid)
  std::set<std::int64_t> span_tids, completion_tids;
};

trace_counts count(const nlohmann::json& j) {
  trace_counts c;
  for (const auto& e : j["traceEvents"]) {
    const auto ph = e["ph"].get<std::string>();
    const auto tid = e["tid"].get<std::int64_t>();
    if (ph == "M" && e["name"] == "thread_name") c.thread_names[std::to_string(tid)] = e["args"]["name"];
    if (ph == "X" && e["cat"] == "gpu") {
      ++c.gpu_spans;
      c.span_tids.insert(tid);
      CHECK(e["name"] == "train_step");
      CHECK(e["args"]["stream"] == 1);
      CHECK(e["args"]["device"] == 0);
      CHECK(e["dur"].get<double>() > 0);
    }
    if (ph == "X" && e["cat"] == "handler" && e["name"] == "completion") {
      ++c.completions;
      c.completion_tids.insert(tid);
    }
    if (ph == "s" || ph == "f") c.flows[e["id"].get<std::uint64_t>()].push_back({ph, tid});
  }
  return c;
}

/// Reads the file as `nerve-trace validate --strict` and `summary` do.
void check_viewer_accepts(const nlohmann::json& j, const std::string& name) {
  const auto path = (std::filesystem::temp_directory_path() / name).string();
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    REQUIRE(f);
    const auto text = j.dump();
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
  }
  trace::diagnostics diags;
  auto t = trace::read_trace_file(path, diags);
  std::filesystem::remove(path);
  std::ostringstream msgs;
  for (const auto& d : diags.items) msgs << d.to_string() << "\n";
  CAPTURE(msgs.str());
  CHECK(diags.error_count() == 0);
  CHECK(diags.warning_count() == 0);  // --strict: every flow ends, every track is well formed
  trace::trace_index index(t);
  auto s = trace::summarize(index, trace::summary_options{});
  CHECK(!s.actors.empty());
}

constexpr std::uint32_t stream_tid = 1000001;      // stream 1 of device 0
constexpr std::uint32_t completions_tid = 1000000;  // device 0's completions from outside any actor

}  // namespace

TEST_SUITE("trace.gpu") {
  TEST_CASE("device steps from outside any actor: a span per step, arrows in and out, named tracks") {
    constexpr int steps = 3;
    actors::recorder rec;
    rec.enable();
    boost::asio::io_context ctx;
    auto guard = boost::asio::make_work_guard(ctx);
    std::thread loop([&] { ctx.run(); });
    {
      gpu::device_options o;
      o.backend = gpu::backend_kind::standin;
      o.recorder = &rec;
      gpu::device dev(o);
      auto g = layers::make_preset("mlp", 1);
      gpu::device_network net(dev, g, {"sgd", 0.1}, ctx.get_executor(), {.max_batch = 8});
      auto b = random_batch(8, 3);
      for (int i = 0; i < steps; ++i) CHECK(net.train_step(b.x, b.y).get().samples == 8);
      // The completion handler records its run after it set the future: let the loop pass it.
      std::promise<void> passed;
      boost::asio::post(ctx, [&] { passed.set_value(); });
      passed.get_future().wait();
    }
    guard.reset();
    loop.join();

    auto j = rec.to_chrome_trace(nlohmann::json::array(), nlohmann::json::object());
    auto c = count(j);
    CHECK(c.gpu_spans == steps);
    CHECK(c.completions == steps);
    CHECK(c.span_tids == std::set<std::int64_t>{stream_tid});
    CHECK(c.completion_tids == std::set<std::int64_t>{completions_tid});
    CHECK(c.thread_names[std::to_string(stream_tid)] == "gpu stream 1 (cpu stand-in)");
    CHECK(c.thread_names[std::to_string(completions_tid)] == "gpu completions (cpu stand-in)");
    // 2 arrows per step: outside (tid 0) -> stream, stream -> completion track.
    REQUIRE(c.flows.size() == 2 * steps);
    int in = 0, out = 0;
    for (const auto& [id, ends] : c.flows) {
      REQUIRE(ends.size() == 2);
      CHECK(ends[0].first == "s");
      CHECK(ends[1].first == "f");
      if (ends[0].second == 0 && ends[1].second == stream_tid) ++in;
      if (ends[0].second == stream_tid && ends[1].second == completions_tid) ++out;
    }
    CHECK(in == steps);
    CHECK(out == steps);
    check_viewer_accepts(j, "nerve-gpu-trace-outside.json");
  }

  TEST_CASE("device steps enqueued by an actor: the arrow starts in its handler, the completion runs on its track") {
    constexpr int steps = 4;
    actors::runtime rt({.loops = 1, .record = true});
    gpu::device_options o;
    o.backend = gpu::backend_kind::standin;
    o.recorder = &rt.trace();
    o.counter = {[&rt] { rt.begin_work(); }, [&rt] { rt.end_work(); }};  // synchronize() waits for completions
    auto dev = std::make_unique<gpu::device>(o);
    auto g = layers::make_preset("mlp", 1);
    auto net = std::make_unique<gpu::device_network>(*dev, g, gpu::device_optimizer{"sgd", 0.1},
                                                     rt.loop(0).get_executor(), gpu::device_network_options{.max_batch = 8});
    auto b = random_batch(8, 4);

    struct go {};
    struct trainer : actors::actor {
      trainer(gpu::device_network& n, sample_batch& bt, int total) : actor("trainer") {
        // One step per message; the next message comes from the completion (posted to the loop).
        on<go>([this, &n, &bt, total](go&) {
          n.async_train_step(bt.x, bt.y, 1, -1, [this, total](std::error_code ec, gpu::device_step_result) {
            if (ec) ++failed;
            if (++done < total) (void)try_tell(go{});
          });
        });
      }
      int done = 0, failed = 0;  // the loop's thread writes them; read after synchronize()
    };
    auto t = rt.spawn<trainer>(*net, b, steps);
    rt.send(t, go{});
    rt.synchronize();
    CHECK(static_cast<trainer*>(t.get())->done == steps);
    CHECK(static_cast<trainer*>(t.get())->failed == 0);
    const auto actor_tid = std::int64_t(t.id());

    const auto path = (std::filesystem::temp_directory_path() / "nerve-gpu-trace-actor.json").string();
    rt.write_trace(path);
    std::ifstream in(path);
    auto j = nlohmann::json::parse(in);
    std::filesystem::remove(path);
    auto c = count(j);
    CHECK(c.gpu_spans == steps);
    CHECK(c.completions == steps);
    CHECK(c.completion_tids == std::set<std::int64_t>{actor_tid});
    CHECK(c.thread_names[std::to_string(stream_tid)] == "gpu stream 1 (cpu stand-in)");
    CHECK(c.thread_names[std::to_string(actor_tid)] == "trainer");
    int into_span = 0, out_of_span = 0, messages = 0;
    for (const auto& [id, ends] : c.flows) {
      REQUIRE(ends.size() == 2);
      if (ends[0].second == actor_tid && ends[1].second == stream_tid) ++into_span;
      else if (ends[0].second == stream_tid && ends[1].second == actor_tid) ++out_of_span;
      else ++messages;  // the actor's start closure, and the go messages
    }
    CHECK(into_span == steps);
    CHECK(out_of_span == steps);
    CHECK(messages == 1 + steps);  // start (to itself); go from the test, then from each completion but the last
    check_viewer_accepts(j, "nerve-gpu-trace-actor.json");
    net.reset();
    dev.reset();  // completion thread stopped before the loops go
    rt.shutdown();
  }
}

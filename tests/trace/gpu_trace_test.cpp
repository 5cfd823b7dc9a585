// GPU work in the recorder (issue 7), on the CPU stand-in: the layer actors of a network
// on the device, a span per completion wait on its stream's track, an arrow from the
// enqueuing handler to the span and one from the span to the completion handler's run,
// the tracks named; and nerve-trace reads the file.
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

#include <nlohmann/json.hpp>

#include "actors/runtime.hpp"
#include "apps/trace/analysis.hpp"
#include "apps/trace/reader.hpp"
#include "apps/trace/summary.hpp"
#include "gpu/device.hpp"
#include "gpu/layers/device_backend.hpp"
#include "layers/network.hpp"
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
  std::map<std::string, int> gpu_spans;  // by name
  int completions = 0;
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
      ++c.gpu_spans[e["name"]];
      c.span_tids.insert(tid);
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

constexpr std::int64_t stream_tid = 1000001;  // stream 1 of device 0

}  // namespace

TEST_SUITE("trace.gpu") {
  TEST_CASE("a network on the device: a span per completion wait, arrows from the enqueuing actor and back to it") {
    constexpr int steps = 3;
    constexpr std::size_t m = 2;
    actors::runtime rt({.loops = 1, .record = true});
    gpu::device_options o;
    o.backend = gpu::backend_kind::standin;
    o.recorder = &rt.trace();
    o.counter = {[&rt] { rt.begin_work(); }, [&rt] { rt.end_work(); }};  // synchronize() waits for completions
    auto dev = std::make_unique<gpu::device>(o);
    auto g = layers::make_preset("mlp", 1);
    auto be = std::make_shared<gpu::device_backend>(*dev, g, gpu::device_backend_options{[] { return layers::make_optimizer<float>("sgd", 0.1); }, 8});
    auto net = std::make_unique<layers::network>(rt, g, std::make_shared<layers::cross_entropy>(), layers::optimizer_factory{},
                                                 layers::network_options{.backend = be});
    for (int i = 0; i < steps; ++i) {
      auto b = random_batch(8, std::uint64_t(i));
      layers::tensor x(8, layers::shape{784});
      std::copy(b.x.begin(), b.x.end(), x.data());
      CHECK(net->train_step(std::move(x), layers::targets{b.y, {}}, m, std::uint64_t(i)).get().samples == 8);
    }
    rt.synchronize();

    // Who waits: each layer once a step (its update), the coordinator (the loss node) once a
    // micro-batch (its figures).
    std::map<std::int64_t, int> waits_of;
    for (auto& a : net->layer_actors()) waits_of[std::int64_t(a.id())] = steps;
    const auto path = (std::filesystem::temp_directory_path() / "nerve-gpu-trace-network.json").string();
    rt.write_trace(path);
    std::ifstream in(path);
    auto j = nlohmann::json::parse(in);
    std::filesystem::remove(path);
    auto c = count(j);
    std::int64_t coordinator_tid = -1;
    for (auto& [tid, name] : c.thread_names)
      if (name == "coordinator") coordinator_tid = std::stoll(tid);
    REQUIRE(coordinator_tid >= 0);
    waits_of[coordinator_tid] = steps * int(m);
    int waits = 0;
    for (auto& [tid, n] : waits_of) waits += n;
    CHECK(c.gpu_spans == std::map<std::string, int>{{"loss", steps * int(m)}, {"update", steps * 3}});  // fc1, relu1, fc2
    CHECK(c.completions == waits);
    CHECK(c.span_tids == std::set<std::int64_t>{stream_tid});
    CHECK(c.thread_names[std::to_string(stream_tid)] == "gpu stream 1 (cpu stand-in)");
    std::map<std::int64_t, int> into, out_of;  // actor tid -> arrows into / out of the stream's spans
    for (const auto& [id, ends] : c.flows) {
      REQUIRE(ends.size() == 2);
      if (ends[1].second == stream_tid) ++into[ends[0].second];
      if (ends[0].second == stream_tid) ++out_of[ends[1].second];
    }
    CHECK(into == waits_of);
    CHECK(out_of == waits_of);
    check_viewer_accepts(j, "nerve-gpu-trace-network.json");
    net.reset();
    be.reset();
    dev.reset();  // completion thread stopped before the loops go
    rt.shutdown();
  }
}

#include <doctest/doctest.h>

#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "actors/runtime.hpp"

using namespace nerve::actors;

namespace {
struct fwd_msg {
  static constexpr std::string_view kind = "forward";
  int micro_batch;
  std::vector<float> x;
  std::size_t payload_bytes() const { return x.size() * sizeof(float); }
};
struct relay : actor {
  address next;
  relay(std::string n, address nx) : actor(std::move(n)), next(std::move(nx)) {
    on<fwd_msg>([this](fwd_msg& m) {
      if (next) send(next, std::move(m));
    });
  }
};
}  // namespace

TEST_SUITE("actors.recorder") {
  TEST_CASE("off, nothing is recorded") {
    runtime rt({.loops = 1, .manual = true});
    auto b = rt.spawn<relay>("b", address{});
    rt.send(b, fwd_msg{0, {1, 2}});
    rt.run_until_idle();
    CHECK(rt.trace().size() == 0);
  }

  TEST_CASE("every send is linked by a flow id to its handling, with kind, micro-batch and bytes") {
    runtime rt({.loops = 2, .record = true});
    auto c = rt.spawn_on<relay>(1, "c", address{});
    auto b = rt.spawn_on<relay>(0, "b", c);
    for (int mb = 0; mb < 5; ++mb) rt.send(b, fwd_msg{mb, std::vector<float>(8, 1.f)});
    rt.synchronize();
    rt.shutdown();
    auto recs = rt.trace().snapshot();
    std::map<std::uint64_t, int> sends, handles;
    int fwd_sends = 0, fwd_handles = 0;
    std::set<std::int64_t> mbs;
    for (auto& r : recs) {
      if (r.kind == record_kind::send) ++sends[r.flow];
      if (r.kind == record_kind::handle) ++handles[r.flow];
      if (r.tag && r.tag->name == "forward") {
        if (r.kind == record_kind::send) {
          ++fwd_sends;
          CHECK(r.bytes == 32);
          mbs.insert(r.mb);
        }
        if (r.kind == record_kind::handle) {
          ++fwd_handles;
          CHECK(r.dur_ns >= 0);
          CHECK(r.value >= 0);  // queue wait
        }
      }
    }
    CHECK(fwd_sends == 10);  // 5 from outside to b, 5 from b to c
    CHECK(fwd_handles == 10);
    CHECK(mbs == std::set<std::int64_t>{0, 1, 2, 3, 4});
    for (auto& [flow, n] : sends) {
      CHECK(n == 1);
      CHECK(handles[flow] == 1);  // each send handled exactly once
    }
  }

  TEST_CASE("the export is a Chrome trace with named lanes and matching flow events") {
    runtime rt({.loops = 1, .manual = true, .record = true});
    auto c = rt.spawn<relay>("sink", address{});
    auto b = rt.spawn<relay>("source", c);
    rt.annotate(b.id(), 0, "net");
    rt.send(b, fwd_msg{7, {1.f}});
    rt.run_until_idle();
    const std::string path = "recorder_test_trace.json";
    rt.write_trace(path);
    std::ifstream in(path);
    auto j = nlohmann::json::parse(in);
    REQUIRE(j.contains("traceEvents"));
    std::map<std::string, int> phases;
    std::set<std::string> names;
    std::map<std::uint64_t, std::string> flow_phases;
    for (auto& e : j["traceEvents"]) {
      phases[e["ph"].get<std::string>()]++;
      if (e["ph"] == "M" && e["name"] == "thread_name") names.insert(e["args"]["name"].get<std::string>());
      if (e["ph"] == "s" || e["ph"] == "f") flow_phases[e["id"].get<std::uint64_t>()] += e["ph"].get<std::string>();
      if (e["ph"] == "X" && e["name"] == "forward") {
        CHECK(e["args"]["mb"] == 7);
        CHECK(e.contains("dur"));
      }
    }
    CHECK(names.count("source") == 1);
    CHECK(names.count("sink") == 1);
    CHECK(phases["X"] >= 2);
    for (auto& [id, ph] : flow_phases) CHECK(ph == "sf");
    CHECK(j["nerve"]["actors"].size() == 2);
    CHECK(j["nerve"]["actors"][1]["stage"] == 0);
    std::remove(path.c_str());
  }

  TEST_CASE("a recorder after another one holds its own records only, and runs never overlap") {
    // The first recorder fills more than one 2 MiB chunk; its chunks go back to the pool and
    // the second recorder writes into them: nothing of the first may show through.
    const int first = 40000, second = 1000;
    {
      runtime rt({.loops = 1, .manual = true, .record = true});
      auto sink = rt.spawn_with<relay>({.loop = 0, .capacity = first + 16, .supervisor = {}}, "sink", address{});
      for (int i = 0; i < first; ++i) rt.send(sink, fwd_msg{i, {}});
      rt.run_until_idle();
      CHECK(rt.trace().size() == 2 * (first + 1));  // and the start
      rt.shutdown();
    }
    runtime rt({.loops = 1, .manual = true, .record = true});
    auto sink = rt.spawn_with<relay>({.loop = 0, .capacity = second + 16, .supervisor = {}}, "sink", address{});
    for (int i = 0; i < second; ++i) rt.send(sink, fwd_msg{100000 + i, {}});
    rt.run_until_idle();
    auto recs = rt.trace().snapshot();
    CHECK(recs.size() == 2 * (second + 1));
    rt.shutdown();
    std::vector<record> runs;
    std::set<std::int64_t> mbs;
    for (auto& r : recs)
      if (r.kind == record_kind::handle && r.tag && r.tag->name == "forward") {
        runs.push_back(r);
        mbs.insert(r.mb);
      }
    REQUIRE(runs.size() == second);
    CHECK(mbs.size() == second);
    CHECK(*mbs.begin() == 100000);
    CHECK(*mbs.rbegin() == 100000 + second - 1);
    // Runs on one loop never overlap (1 ns: ticks to nanoseconds rounding).
    for (std::size_t i = 1; i < runs.size(); ++i) {
      const auto prev_end = runs[i - 1].ts_ns + runs[i - 1].dur_ns;
      CHECK(runs[i].ts_ns >= prev_end - 1);
    }
  }
}

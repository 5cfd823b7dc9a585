// One trace across ranks: run under `mpirun -np N` (N = 2 and 3 in ctest). Each rank's
// sender sends to the next rank's collector through `remote<T>` with tracing on, then
// every rank writes the merged trace and rank 0 checks it: one process per rank, the
// clock offsets in the metadata, exactly one arrow across ranks per message sent while
// tracing was on, each from the sending handler run to the handler run that took the
// value, and none going back in time. With NERVE_MPI_TRACE_OUT set, the file is kept
// there (ctest runs `nerve-trace validate` on it next).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <set>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "actors/runtime.hpp"
#include "bus/mpi/trace.hpp"
#include "bus/mpi/transport.hpp"
#include "bus/signal.hpp"

using namespace nerve::actors;
namespace mpi = nerve::bus::mpi;
using nlohmann::json;

namespace {

struct note {
  static constexpr std::string_view kind = "note";
  std::int32_t from = 0;
  std::int64_t seq = 0;
  std::vector<float> data;
};

}  // namespace

template <>
struct nerve::bus::mpi::codec<note> {
  static void write(const note& m, std::vector<std::byte>& frame) {
    frame_writer{frame}.put(m.from).put(m.seq).put(std::uint64_t(m.data.size()));
  }
  static std::span<const std::byte> payload(const note& m) { return std::as_bytes(std::span(m.data)); }
  static note read(std::span<const std::byte> frame, std::span<std::byte>& payload) {
    frame_reader r{frame};
    note m;
    m.from = r.get<std::int32_t>();
    m.seq = r.get<std::int64_t>();
    m.data.resize(r.get<std::uint64_t>());
    payload = std::as_writable_bytes(std::span(m.data));
    return m;
  }
};

namespace {

struct sender : actor {
  nerve::bus::signal<note> out{*this, "out"};
  int rank = 0;
  explicit sender(int r) : actor("sender"), rank(r) {
    on<std::int64_t>([this](std::int64_t& seq) { out.emit(note{rank, seq, std::vector<float>(std::size_t(seq % 5), 1.f)}); });
  }
};

// Fulfils a promise when `expected` notes have arrived (then takes the next promise).
struct collector : actor {
  std::int64_t got = 0, expected = 0;
  std::promise<void> done;
  collector() : actor("collector") {
    on<note>([this](note&) {
      if (++got == expected) done.set_value();
    });
  }
};

mpi::transport* world = nullptr;
runtime* world_rt = nullptr;

}  // namespace

TEST_SUITE("bus.mpi.trace") {
  TEST_CASE("merging shifts each rank onto rank 0's clock and keeps flow ids apart") {
    // Two ranks that both use the recorder's id 1 within themselves, and one arrow across.
    const std::uint64_t across = mpi::cross_rank_flow | 1;
    auto rank_trace = [&](int k, bool sends) {
      json events = json::array(
          {{{"ph", "M"}, {"name", "process_name"}, {"pid", 0}, {"tid", 0}, {"args", {{"name", "nerve rank 0"}}}},
           {{"ph", "s"}, {"cat", "msg"}, {"name", "m"}, {"id", 1}, {"pid", 0}, {"tid", 1}, {"ts", 1.0}},
           {{"ph", "f"}, {"bp", "e"}, {"cat", "msg"}, {"name", "m"}, {"id", 1}, {"pid", 0}, {"tid", 2}, {"ts", 2.0}},
           {{"ph", sends ? "s" : "f"}, {"cat", "msg"}, {"name", "x"}, {"id", across}, {"pid", 0}, {"tid", 1}, {"ts", 3.0}},
           {{"ph", "C"}, {"name", "mailbox"}, {"id", 7}, {"pid", 0}, {"tid", 1}, {"ts", 3.0}, {"args", {{"depth", 1}}}}});
      json nerve = {{"version", 1}, {"actors", json::array({{{"id", 1}, {"name", "a"}}})}, {"lost_records", k},
                    {"model", "mlp"}, {"stage_count", k}};
      return mpi::rank_trace{k, 1'000'000 + 500'000 * k, {{"traceEvents", events}, {"nerve", nerve}}};
    };
    // Rank 1's clock is 200 µs ahead of rank 0's; its recorder started 500 µs later on its own
    // clock: 300 µs later on rank 0's.
    const std::vector<mpi::clock_offset> offsets{{0, 0}, {200'000, 3'000}};
    mpi::merged_trace_stats stats;
    const auto merged = mpi::merge_rank_traces({rank_trace(0, true), rank_trace(1, false)}, offsets, &stats);
    CHECK(stats.ranks == 2);
    CHECK(stats.cross_rank_arrows == 1);
    std::map<std::pair<std::int64_t, std::string>, std::vector<json>> by;  // (pid, ph)
    for (const auto& e : merged["traceEvents"]) by[{e["pid"].get<std::int64_t>(), e["ph"].get<std::string>()}].push_back(e);
    CHECK(by[{1, "s"}].at(0)["ts"].get<double>() == doctest::Approx(301.0));
    CHECK(by[{0, "s"}].at(0)["ts"].get<double>() == doctest::Approx(1.0));
    // Ids: the two ranks' own id 1 differ; the arrow across keeps one id at both ends.
    const auto own0 = by[{0, "s"}].at(0)["id"], own1 = by[{1, "s"}].at(0)["id"];
    CHECK(own0 != own1);
    CHECK(by[{0, "s"}].at(1)["id"] == by[{1, "f"}].at(1)["id"]);
    CHECK(by[{0, "s"}].at(1)["id"].get<std::uint64_t>() < (std::uint64_t{1} << 53));
    CHECK(by[{1, "C"}].at(0)["id"] == 7);  // a counter's id is no flow id
    CHECK(by[{1, "M"}].at(0)["args"]["name"] == "rank 1");
    const auto& nerve = merged["nerve"];
    CHECK(nerve["model"] == "mlp");
    CHECK(!nerve.contains("stage_count"));
    CHECK(nerve["ranks"][1]["stage_count"] == 1);
    CHECK(nerve["ranks"][1]["offset_ns"] == 200'000);
    CHECK(nerve["ranks"][1]["rtt_ns"] == 3'000);
    CHECK(nerve["lost_records"] == 1);
    CHECK(nerve["clock"]["error_bound_ns"] == 1'500);
    CHECK(nerve["actors"][1]["pid"] == 1);
    CHECK_THROWS_AS(mpi::merge_rank_traces({rank_trace(0, true)}, offsets), std::invalid_argument);
  }

  TEST_CASE("the merged trace has one process per rank and one forward arrow per message across ranks") {
    const int n = world->size(), me = world->rank();
    auto& rt = *world_rt;
    const auto offsets = world->clock_offsets();  // at the start, as an app does
    REQUIRE(offsets.size() == std::size_t(n));

    auto c = rt.spawn<collector>();
    auto s = rt.spawn<sender>(me);
    auto& col = *static_cast<collector*>(c.get());
    world->listen<note>(/*channel*/ 3, c);
    static_cast<sender*>(s.get())->out.subscribe(std::make_shared<mpi::remote<note>>(*world, (me + 1) % n, 3));

    // First untraced: these must draw no arrow. Each phase sets up its wait before the
    // barrier, since the other ranks' notes may arrive as soon as it is passed.
    constexpr std::int64_t untraced = 10, traced = 40;
    auto phase = [&](std::int64_t first, std::int64_t count) {
      col.done = {};
      col.expected = first + count;
      auto f = col.done.get_future();
      world->barrier();  // every rank listens (and traces, or not) before any sends
      for (std::int64_t k = 0; k < count; ++k) rt.send(s, first + k);
      while (f.wait_for(std::chrono::milliseconds(20)) != std::future_status::ready) world->check();
      world->flush();
      world->barrier();  // every rank has all it was sent: the traffic has stopped
    };
    phase(0, untraced);
    rt.trace().enable();
    phase(untraced, traced);
    rt.synchronize();

    // Rank 0 names the file; only rank 0 writes it.
    std::string path;
    if (const char* keep = std::getenv("NERVE_MPI_TRACE_OUT"); keep && *keep) path = keep;
    else path = (std::filesystem::temp_directory_path() / ("nerve_mpi_trace_" + std::to_string(::getpid()) + ".json")).string();
    path = world->all_gather(path)[0];
    const json extra = {{"test", "mpi_trace"},
                        {"rank_note", me},
                        {"stages", json::array({{{"stage", me}, {"actors", {s.id()}}, {"loop", 0}, {"device", "cpu"}}})}};
    const auto stats = mpi::write_merged_trace(*world, rt, path, extra, offsets);
    if (me != 0) {
      CHECK(stats.events == 0);
      return;
    }
    CHECK(stats.ranks == std::size_t(n));
    CHECK(stats.cross_rank_arrows == std::size_t(n * traced));

    std::ifstream in(path);
    REQUIRE(in.good());
    const auto trace = json::parse(in);
    in.close();
    if (!std::getenv("NERVE_MPI_TRACE_OUT")) std::filesystem::remove(path);

    // One process per rank, named "rank k".
    std::map<std::int64_t, std::string> processes;
    for (const auto& e : trace["traceEvents"])
      if (e.value("ph", "") == "M" && e.value("name", "") == "process_name") processes[e["pid"]] = e["args"]["name"];
    REQUIRE(processes.size() == std::size_t(n));
    for (int k = 0; k < n; ++k) CHECK(processes[k] == "rank " + std::to_string(k));

    // The offsets as measured, per rank; `extra` merged (alike: top; different: per rank).
    const auto& nerve = trace["nerve"];
    REQUIRE(nerve["ranks"].size() == std::size_t(n));
    for (int k = 0; k < n; ++k) {
      const auto& r = nerve["ranks"][std::size_t(k)];
      CHECK(r["rank"] == k);
      CHECK(r["offset_ns"] == offsets[std::size_t(k)].offset_ns);
      CHECK(r["rtt_ns"] == offsets[std::size_t(k)].rtt_ns);
      if (n > 1) CHECK(r["rank_note"] == k);  // differs between ranks: kept per rank
    }
    CHECK(nerve["test"] == "mpi_trace");  // alike on every rank: at the top
    if (n == 1) CHECK(nerve["rank_note"] == 0);
    CHECK(nerve["stages"].size() == std::size_t(n));
    CHECK(nerve["actors"].size() >= std::size_t(3 * n));  // poller, collector, sender on each

    // Arrows: ends on the handler run that took the note, starts inside the run that sent it.
    struct end_point {
      double ts = 0;
      std::int64_t pid = -1, tid = -1;
      std::string name;
    };
    std::map<std::uint64_t, end_point> starts, ends;
    std::map<std::pair<std::int64_t, std::int64_t>, std::vector<std::pair<double, double>>> runs;  // (pid, tid) -> slices
    for (const auto& e : trace["traceEvents"]) {
      const auto ph = e.value("ph", "");
      if (ph == "s" || ph == "f") {
        auto& m = ph == "s" ? starts : ends;
        CHECK(m.count(e["id"].get<std::uint64_t>()) == 0);  // ids are unique after the merge
        m[e["id"].get<std::uint64_t>()] = {e["ts"].get<double>(), e["pid"], e["tid"], e["name"]};
      } else if (ph == "X" && e.value("cat", "") == "handler") {
        runs[{e["pid"], e["tid"]}].emplace_back(e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>());
      }
    }
    auto inside = [&](const end_point& p, bool at_start) {
      for (auto [a, b] : runs[{p.pid, p.tid}])
        if (at_start ? p.ts == a : p.ts >= a && p.ts <= b) return true;
      return false;
    };
    std::int64_t across = 0, backwards = 0, bound = 0;
    std::map<std::int64_t, std::int64_t> per_sender;
    // The arrows across ranks start on the sender (the same actor id on every rank: spawned
    // in the same order); the poller's own handing over of a note draws one within a rank.
    for (const auto& [id, st] : starts) {
      auto it = ends.find(id);
      if (st.tid != std::int64_t(s.id()) || st.name != "note") continue;
      REQUIRE(it != ends.end());
      ++across;
      ++per_sender[st.pid];
      CHECK(st.name == "note");
      CHECK(it->second.name == "note");
      CHECK(it->second.pid == (st.pid + 1) % n);
      if (it->second.ts < st.ts) ++backwards;
      bound += inside(st, false) && inside(it->second, true);
    }
    CHECK(across == n * traced);
    CHECK(backwards == 0);
    CHECK(bound == n * traced);
    for (int k = 0; k < n; ++k) CHECK(per_sender[k] == traced);
    // Every arrow across ranks has both ends (none left dangling).
    std::int64_t dangling = 0;
    for (const auto& [id, st] : starts) dangling += !ends.count(id);
    for (const auto& [id, en] : ends) dangling += !starts.count(id);
    CHECK(dangling == 0);
  }
}

int main(int argc, char** argv) {
  int rc = 0;
  {
    runtime rt({.loops = 2});
    {
      mpi::transport t(rt, 0);
      world = &t;
      world_rt = &rt;
      doctest::Context ctx(argc, argv);
      rc = ctx.run();
      world = nullptr;
    }
    rt.shutdown();
  }
  return rc;
}

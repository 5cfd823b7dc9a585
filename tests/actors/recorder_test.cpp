#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
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

// A poller's shape: turns it sends itself (kept out of the trace), each of which may hand
// a value on.
struct turn {
  static constexpr std::string_view kind = "turn";
  static constexpr bool traced = false;
  int left;
};
struct poller : actor {
  address to;
  explicit poller(address t) : actor("poller"), to(std::move(t)) {
    on<turn>([this](turn& next) {
      if (next.left % 4 == 0) send(to, fwd_msg{next.left, {1.f}});
      if (next.left > 0) send(self(), turn{next.left - 1});
    });
  }
};

// A payload and a micro-batch id too large for a packed record: kept whole.
struct huge_msg {
  static constexpr std::string_view kind = "huge";
  std::int64_t micro_batch;
  std::size_t payload_bytes() const { return std::size_t{5} << 30; }
};
struct huge_sink : actor {
  huge_sink() : actor("huge") {
    on<huge_msg>([](huge_msg&) {});
    on<fwd_msg>([](fwd_msg&) {});
  }
};

// Send stamping: `quick` runs send at once; `slow` runs work ~20 µs, then send.
struct quick_msg {};
struct slow_msg {};
struct note_msg {};
struct stamper : actor {
  address to;
  explicit stamper(address t) : actor("stamper"), to(std::move(t)) {
    on<quick_msg>([this](quick_msg&) { send(to, note_msg{}); });
    on<slow_msg>([this](slow_msg&) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(20);
      while (std::chrono::steady_clock::now() < until) {
      }
      send(to, note_msg{});
    });
  }
};
struct note_sink : actor {
  note_sink() : actor("notes") { on<note_msg>([](note_msg&) {}); }
};

// Shared timing: one message type whose runs are short unless `slow` (then 300 µs).
struct spin_msg {
  bool slow;
};
struct spinner : actor {
  spinner() : actor("spinner") {
    on<spin_msg>([](spin_msg& m) {
      if (!m.slow) return;
      const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(300);
      while (std::chrono::steady_clock::now() < until) {
      }
    });
  }
};
// Grouping depends on whether a type's last timed run was long, a flag on its tag that
// every runtime in the process shares: the grouping tests use types of their own, which no
// earlier test has run (slowly, under a sanitizer).
template <int N>
struct group_msg {
  static constexpr std::string_view kind = N == 1 ? "group1" : N == 2 ? "group2" : "group3";
  int micro_batch;
};
template <int N>
struct group_relay : actor {
  address next;
  group_relay(std::string n, address nx) : actor(std::move(n)), next(std::move(nx)) {
    on<group_msg<N>>([this](group_msg<N>& m) {
      if (next) send(next, std::move(m));
    });
  }
};
// Stops itself at its third group4 message; its on_stop sends a note, after the run, from
// the runtime's own code: the send carries the clock as the group left it.
struct group_msg4 {
  static constexpr std::string_view kind = "group4";
  int micro_batch;
};
struct stopping_relay : actor {
  address to;
  explicit stopping_relay(address t) : actor("stopping"), to(std::move(t)) {
    on<group_msg4>([this](group_msg4& m) {
      if (m.micro_batch == 2) stop();
    });
  }
  void on_stop() override { send(to, note_msg{}); }
};
// At its second group5 message, sends two to `inner` and steps the (manual) runtime from
// inside the handler: inner's drain nests in this one's.
struct group_msg5 {
  static constexpr std::string_view kind = "group5";
  int micro_batch;
};
struct nesting_relay : actor {
  runtime* rt;
  address inner;
  nesting_relay(runtime* r, address in) : actor("outer"), rt(r), inner(std::move(in)) {
    on<group_msg5>([this](group_msg5& m) {
      if (!inner || m.micro_batch != 1) return;
      send(inner, group_msg5{10});
      send(inner, group_msg5{11});
      rt->poll();
    });
  }
};
// Counts its toggle messages; at micro-batch `off_at` turns the runtime's recording off
// from inside the handler.
struct toggle_msg {
  static constexpr std::string_view kind = "toggle";
  int micro_batch;
};
struct toggling_sink : actor {
  runtime* rt;
  int off_at;
  int* handled;
  toggling_sink(runtime* r, int off, int* h) : actor("toggling"), rt(r), off_at(off), handled(h) {
    on<toggle_msg>([this](toggle_msg& m) {
      ++*handled;
      if (m.micro_batch == off_at) rt->trace().enable(false);
    });
  }
};
// Runs a fifth of `long_run` (plod: short, yet 8 in a row take longer than the
// threshold), quickly (dash), or 1.5 times `long_run` (trudge: a type that is always long).
struct plod_msg {
  static constexpr std::string_view kind = "plod";
  int micro_batch;
};
struct dash_msg {
  static constexpr std::string_view kind = "dash";
};
struct trudge_msg {
  static constexpr std::string_view kind = "trudge";
};
struct dash_trudger : actor {
  explicit dash_trudger(std::int64_t long_run) : actor("trudger") {
    on<plod_msg>([long_run](plod_msg&) { spin_for(long_run / 5); });
    on<dash_msg>([](dash_msg&) {});
    on<trudge_msg>([long_run](trudge_msg&) { spin_for(long_run * 3 / 2); });
  }
  static void spin_for(std::int64_t ticks) {
    const auto until = recorder::ticks() + ticks;
    while (recorder::ticks() < until) {
    }
  }
};
// At least 100 µs of recorder ticks (a power of two: at most 200 µs).
std::int64_t ticks_of_100us(const recorder& tr) {
  const auto t0 = recorder::ticks();
  std::int64_t n = 1;
  while (tr.ns_of_ticks(t0 + n) - tr.ns_of_ticks(t0) < 100'000) n *= 2;
  return n;
}
// The handler runs of `track` for messages of kind `kind`, in time order.
std::vector<record> runs_of(const std::vector<record>& recs, actor_id track, std::string_view kind) {
  std::vector<record> out;
  for (auto& r : recs)
    if (r.kind == record_kind::handle && r.track == track && r.tag && r.tag->name == kind) out.push_back(r);
  return out;
}
// Throws at micro-batch 3: what ran before it is handled, what comes after is dropped.
struct thrower : actor {
  int handled = 0;
  thrower() : actor("thrower") {
    on<fwd_msg>([this](fwd_msg& m) {
      if (m.micro_batch == 3) throw std::runtime_error("bad micro-batch 3");
      ++handled;
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

  TEST_CASE("a message kind marked untraced leaves no record; what its runs send is recorded") {
    runtime rt({.loops = 1, .manual = true, .record = true});
    auto c = rt.spawn<relay>("sink", address{});
    auto p = rt.spawn<poller>(c);
    rt.send(p, turn{20});
    rt.run_until_idle();
    int forwards = 0, turns = 0;
    std::map<std::uint64_t, int> flows;
    for (auto& r : rt.trace().snapshot()) {
      if (r.tag && r.tag->name == "turn") ++turns;
      if (r.tag && r.tag->name == "forward" && (r.kind == record_kind::send || r.kind == record_kind::handle)) {
        ++forwards;
        ++flows[r.flow];
        if (r.kind == record_kind::send) CHECK(r.track == p.id());  // sent by the poller, from an unrecorded run
      }
    }
    CHECK(turns == 0);
    CHECK(forwards == 2 * 6);  // left = 20, 16, ..., 0: six values, each sent and handled
    for (auto& [flow, n] : flows) CHECK(n == 2);
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
    // The first recorder fills more than one 2 MiB chunk (43,690 records each); its chunks
    // go back to the pool and the second recorder writes into them: nothing of the first
    // may show through.
    const int first = 100000, second = 1000;
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

  TEST_CASE("records whose fields do not pack are kept whole, linked like the others") {
    runtime rt({.loops = 1, .manual = true, .record = true});
    auto sink = rt.spawn<huge_sink>();
    const std::int64_t big_mb = std::int64_t{3} << 31;  // past int32
    for (int i = 0; i < 3; ++i) {
      rt.send(sink, fwd_msg{i, {1.f}});
      rt.send(sink, huge_msg{big_mb + i});
    }
    rt.run_until_idle();
    auto recs = rt.trace().snapshot();
    CHECK(recs.size() == 2 * (6 + 1));  // and the start
    std::map<std::uint64_t, int> sends, handles;
    std::set<std::int64_t> huge_mbs, fwd_mbs;
    std::map<std::uint64_t, std::int64_t> sent_at;
    for (auto& r : recs) {
      if (r.kind == record_kind::send) {
        ++sends[r.flow];
        sent_at[r.flow] = r.ts_ns;
      }
      if (r.kind != record_kind::handle || !r.tag) continue;
      ++handles[r.flow];
      if (r.tag->name == "huge") {
        CHECK(r.bytes == std::uint64_t{5} << 30);
        huge_mbs.insert(r.mb);
      } else if (r.tag->name == "forward") {
        CHECK(r.bytes == 4);
        fwd_mbs.insert(r.mb);
      }
    }
    CHECK(huge_mbs == std::set<std::int64_t>{big_mb, big_mb + 1, big_mb + 2});
    CHECK(fwd_mbs == std::set<std::int64_t>{0, 1, 2});
    REQUIRE(sends.size() == 7);
    for (auto& [flow, n] : sends) {
      CHECK(n == 1);
      CHECK(handles[flow] == 1);
    }
    // Sorted by time, packed and whole records interleave: every handling after its send.
    for (auto& r : recs)
      if (r.kind == record_kind::handle) CHECK(r.ts_ns >= sent_at[r.flow]);
  }

  TEST_CASE("a wide record early in a chunk leaves the records of later chunks where they are") {
    // A wide record takes a slot off its chunk's end, so that chunk ends one short: the
    // records after it, in the next chunk, must still be read from there.
    const int n = 50000;  // more than a chunk (43,690 records)
    runtime rt({.loops = 1, .manual = true, .record = true, .record_timing = recorder::timing::exact});  // no group records
    auto sink = rt.spawn_with<huge_sink>({.loop = 0, .capacity = n + 16, .supervisor = {}});
    rt.send(sink, huge_msg{std::int64_t{3} << 31});
    for (int i = 0; i < n; ++i) rt.send(sink, fwd_msg{i, {}});
    rt.run_until_idle();
    CHECK(rt.trace().size() == 2 * (n + 2));  // and the start
    std::set<std::int64_t> mbs;
    int huge = 0;
    for (auto& r : rt.trace().snapshot())
      if (r.kind == record_kind::handle && r.tag) {
        if (r.tag->name == "forward") mbs.insert(r.mb);
        if (r.tag->name == "huge") huge += r.mb == std::int64_t{3} << 31;
      }
    CHECK(huge == 1);
    CHECK(mbs.size() == n);
    CHECK(*mbs.begin() == 0);
    CHECK(*mbs.rbegin() == n - 1);
  }

  TEST_CASE("a send is stamped with its run's start after a short run of its type, with the clock after a long one") {
    runtime rt({.loops = 1, .manual = true, .record = true});
    auto notes = rt.spawn<note_sink>();
    auto st = rt.spawn<stamper>(notes);
    rt.run_until_idle();
    // One message at a time, so each run is the only one of its drain.
    for (int i = 0; i < 20; ++i) {
      rt.send(st, quick_msg{});
      rt.run_until_idle();
    }
    for (int i = 0; i < 3; ++i) {
      rt.send(st, slow_msg{});
      rt.run_until_idle();
    }
    auto recs = rt.trace().snapshot();
    auto& tr = rt.trace();
    const auto t0 = recorder::ticks();
    const double threshold_ns = static_cast<double>(tr.ns_of_ticks(t0 + long_run_ticks) - tr.ns_of_ticks(t0));
    struct run {
      std::int64_t start, dur;
      std::string_view kind;
    };
    std::vector<run> runs;            // the stamper's runs, in order
    std::vector<std::int64_t> stamps;  // its note sends, in order
    std::map<std::uint64_t, std::int64_t> note_sent;
    for (auto& r : recs) {
      if (r.kind == record_kind::handle && r.track == st.id() && r.tag) runs.push_back({r.ts_ns, r.dur_ns, r.tag->name});
      if (r.kind == record_kind::send && r.tag && r.tag->name == "note_msg") {
        stamps.push_back(r.ts_ns);
        note_sent[r.flow] = r.ts_ns;
      }
      if (r.kind == record_kind::handle && r.tag && r.tag->name == "note_msg") CHECK(r.ts_ns >= note_sent[r.flow]);
    }
    // The start's run first, then 20 quick and 3 slow, each sending one note.
    REQUIRE(runs.size() == 24);
    REQUIRE(stamps.size() == 23);
    int stamped = 0, timed_slow = 0;
    for (std::size_t k = 1; k < runs.size(); ++k) {
      const auto& r = runs[k];
      const auto s = stamps[k - 1];
      CHECK(s >= r.start);                // never before its run
      CHECK(s <= r.start + r.dur + 1);    // nor after it (1 ns: rounding)
      // The previous run of the same type decides (the first of a type counts as short).
      const run* prev = nullptr;
      for (std::size_t j = k - 1; j >= 1 && !prev; --j)
        if (runs[j].kind == r.kind) prev = &runs[j];
      const double prev_dur = prev ? static_cast<double>(prev->dur) : 0.0;
      if (prev_dur < 0.5 * threshold_ns) {
        CHECK(s == r.start);
        ++stamped;
      } else if (prev_dur > 2 * threshold_ns) {
        CHECK(s > r.start);  // its own clock read
        if (r.kind == "slow_msg") {
          CHECK(s >= r.start + 19'000);  // read after the 20 µs of work
          ++timed_slow;
        }
      }
    }
    CHECK(stamped >= 1);     // the first slow run, at least
    CHECK(timed_slow == 2);  // the second and third slow runs
  }

  TEST_CASE("short runs in a row share clock reads: groups of 8, spread evenly over their measured span") {
    runtime rt({.loops = 1, .manual = true, .record = true});
    rt.trace().set_long_run(std::int64_t{1} << 50);  // no run is long, however slow the build
    auto sink = rt.spawn<group_relay<1>>("sink", address{});
    rt.run_until_idle();  // the start, in a drain of its own
    for (int i = 0; i < 20; ++i) rt.send(sink, group_msg<1>{i});
    rt.run_until_idle();  // one drain: groups of 8, 8 and 4
    const auto recs = rt.trace().snapshot();
    const auto runs = runs_of(recs, sink.id(), "group1");
    REQUIRE(runs.size() == 20);
    CHECK(rt.trace().size() == 2 * 21);  // group records are not records of their own
    for (int i = 0; i < 20; ++i) {
      CAPTURE(i);
      CHECK(runs[i].mb == i);  // in the order handled
      CHECK(runs[i].aux2 == (i < 16 ? 8 : 4));
      // Back to back, none before its send; within a group, equal shares (1 ns: rounding).
      if (i > 0) CHECK(runs[i].ts_ns >= runs[i - 1].ts_ns + runs[i - 1].dur_ns - 1);
      if (i > 0 && i % 8 != 0 && i < 16) CHECK(std::abs(runs[i].dur_ns - runs[i - 1].dur_ns) <= 1);
    }
    std::map<std::uint64_t, std::int64_t> sent;
    for (auto& r : recs)
      if (r.kind == record_kind::send) sent[r.flow] = r.ts_ns;
    for (auto& r : runs) CHECK(r.ts_ns >= sent.at(r.flow));
    // The trace says which runs shared their timing.
    auto j = rt.trace().to_chrome_trace(nlohmann::json::array(), nlohmann::json::object());
    int shared8 = 0, shared4 = 0;
    for (auto& e : j["traceEvents"])
      if (e["ph"] == "X" && e["name"] == "group1") {
        const int n = e["args"].value("shared", 0);
        shared8 += n == 8;
        shared4 += n == 4;
      }
    CHECK(shared8 == 16);
    CHECK(shared4 == 4);
  }

  TEST_CASE("a send from a run in a group leaves that run's slice") {
    runtime rt({.loops = 1, .manual = true, .record = true});
    rt.trace().set_long_run(std::int64_t{1} << 50);
    auto last = rt.spawn<group_relay<2>>("last", address{});
    auto first = rt.spawn<group_relay<2>>("first", last);
    rt.run_until_idle();
    for (int i = 0; i < 16; ++i) rt.send(first, group_msg<2>{i});
    rt.run_until_idle();  // first: two groups of 8, each run sending on to last
    const auto recs = rt.trace().snapshot();
    std::map<std::int64_t, record> run_of;  // first's runs by micro-batch
    for (auto& r : runs_of(recs, first.id(), "group2")) run_of[r.mb] = r;
    REQUIRE(run_of.size() == 16);
    std::map<std::uint64_t, std::int64_t> handled;
    for (auto& r : runs_of(recs, last.id(), "group2")) handled[r.flow] = r.ts_ns;
    int sends = 0;
    for (auto& r : recs) {
      if (r.kind != record_kind::send || r.track != first.id() || r.peer != last.id()) continue;
      ++sends;
      const auto& run = run_of.at(r.mb);
      CAPTURE(r.mb);
      CHECK(run.aux2 == 8);
      CHECK(r.ts_ns >= run.ts_ns - 1);  // within the run that sent it (1 ns: rounding)
      CHECK(r.ts_ns <= run.ts_ns + run.dur_ns + 1);
      CHECK(r.ts_ns <= handled.at(r.flow));
    }
    CHECK(sends == 16);
  }

  TEST_CASE("a send after a group's last run, from the runtime's own code, leaves the group's end") {
    runtime rt({.loops = 1, .manual = true, .record = true});
    rt.trace().set_long_run(std::int64_t{1} << 50);
    auto notes = rt.spawn<note_sink>();
    auto a = rt.spawn<stopping_relay>(notes);
    rt.run_until_idle();
    for (int i = 0; i < 3; ++i) rt.send(a, group_msg4{i});
    rt.run_until_idle();  // one drain: a group of 3; the stop's note is sent after the third
    const auto recs = rt.trace().snapshot();
    const auto runs = runs_of(recs, a.id(), "group4");
    REQUIRE(runs.size() == 3);
    CHECK(runs[2].aux2 == 3);
    const record* note = nullptr;
    for (auto& r : recs)
      if (r.kind == record_kind::send && r.track == a.id() && r.tag && r.tag->name == tag_of<note_msg>()->name) note = &r;
    REQUIRE(note != nullptr);
    // At the group's end (its runs' even shares round to the nanosecond), not at a run's start.
    CHECK(note->ts_ns >= runs[2].ts_ns + runs[2].dur_ns - 1);
    CHECK(note->ts_ns <= runs[2].ts_ns + runs[2].dur_ns + 1);
    if (runs[2].dur_ns > 2) CHECK(note->ts_ns > runs[2].ts_ns);
  }

  TEST_CASE("a drain nested in a handler times its group apart from the group it nested in") {
    runtime rt({.loops = 1, .manual = true, .record = true});
    rt.trace().set_long_run(std::int64_t{1} << 50);
    auto inner = rt.spawn<nesting_relay>(&rt, address{});
    auto outer = rt.spawn<nesting_relay>(&rt, inner);
    rt.run_until_idle();
    for (int i = 0; i < 3; ++i) rt.send(outer, group_msg5{i});
    rt.run_until_idle();  // outer: a group of 3; inside its second run, inner: a group of 2
    const auto recs = rt.trace().snapshot();
    const auto o = runs_of(recs, outer.id(), "group5");
    const auto n = runs_of(recs, inner.id(), "group5");
    REQUIRE(o.size() == 3);
    REQUIRE(n.size() == 2);
    for (int i = 0; i < 3; ++i) {
      CAPTURE(i);
      CHECK(o[i].mb == i);
      CHECK(o[i].aux2 == 3);
      if (i > 0) CHECK(o[i].ts_ns >= o[i - 1].ts_ns + o[i - 1].dur_ns - 1);
    }
    for (int i = 0; i < 2; ++i) {
      CAPTURE(i);
      CHECK(n[i].mb == 10 + i);
      CHECK(n[i].aux2 == 2);
      // Within the outer group's span (the nested drain ran inside it).
      CHECK(n[i].ts_ns >= o[0].ts_ns - 1);
      CHECK(n[i].ts_ns + n[i].dur_ns <= o[2].ts_ns + o[2].dur_ns + 1);
    }
  }

  TEST_CASE("recording switched on and off mid-drain records exactly the runs of messages sent and handled while on") {
    runtime rt({.loops = 1, .manual = true});
    rt.trace().set_long_run(std::int64_t{1} << 50);
    int handled = 0;
    auto sink = rt.spawn<toggling_sink>(&rt, 6, &handled);
    rt.run_until_idle();
    for (int i = 0; i < 3; ++i) rt.send(sink, toggle_msg{i});  // sent unrecorded
    rt.trace().enable();
    for (int i = 3; i < 9; ++i) rt.send(sink, toggle_msg{i});  // stamped at the send
    // One drain, begun recording: 0-2 run unrecorded, 3-6 recorded in one group (6 turns
    // recording off inside its run, which is still recorded), 7-8 unrecorded although
    // stamped, and their first run ends the group.
    rt.run_until_idle();
    CHECK(handled == 9);
    const auto runs = runs_of(rt.trace().snapshot(), sink.id(), "toggle");
    REQUIRE(runs.size() == 4);
    for (int i = 0; i < 4; ++i) {
      CAPTURE(i);
      CHECK(runs[i].mb == 3 + i);
      CHECK(runs[i].aux2 == 4);
    }
  }

  TEST_CASE("past the record limit messages are counted as lost, and runs whose group record was lost keep a time") {
    runtime rt({.loops = 1, .manual = true, .record = true});
    rt.trace().set_long_run(std::int64_t{1} << 50);
    rt.trace().set_max_records(10);
    auto sink = rt.spawn<group_relay<3>>("sink", address{});
    rt.run_until_idle();  // the start: 1 record
    for (int i = 0; i < 20; ++i) rt.send(sink, group_msg<3>{i});
    rt.run_until_idle();  // 9 more fit; the second group's record finds the buffer full
    CHECK(rt.trace().size() == 2 * 10);
    CHECK(rt.trace().lost() == 11);
    const auto recs = rt.trace().snapshot();
    auto runs = runs_of(recs, sink.id(), "group3");
    REQUIRE(runs.size() == 9);
    std::sort(runs.begin(), runs.end(), [](const record& a, const record& b) { return a.mb < b.mb; });
    std::map<std::uint64_t, std::int64_t> sent;
    for (auto& r : recs)
      if (r.kind == record_kind::send) sent[r.flow] = r.ts_ns;
    for (int i = 0; i < 9; ++i) {
      CAPTURE(i);
      CHECK(runs[i].mb == i);
      CHECK(runs[i].ts_ns >= sent.at(runs[i].flow));
      CHECK(runs[i].aux2 == (i < 8 ? 8 : -1));  // the 9th: no group record, at its send, zero long
    }
    CHECK(runs[8].dur_ns == 0);
    CHECK(runs[8].ts_ns == sent.at(runs[8].flow));
  }

  TEST_CASE("timing::exact reads the clock after every run") {
    runtime rt({.loops = 1, .manual = true, .record = true});
    rt.trace().set_timing(recorder::timing::exact);
    auto sink = rt.spawn<relay>("sink", address{});
    for (int i = 0; i < 20; ++i) rt.send(sink, fwd_msg{i, {}});
    rt.run_until_idle();
    const auto runs = runs_of(rt.trace().snapshot(), sink.id(), "forward");
    REQUIRE(runs.size() == 20);
    for (auto& r : runs) CHECK(r.aux2 == -1);
    auto j = rt.trace().to_chrome_trace(nlohmann::json::array(), nlohmann::json::object());
    for (auto& e : j["traceEvents"])
      if (e["ph"] == "X") CHECK_FALSE(e["args"].contains("shared"));
  }

  TEST_CASE("a group that took long has the next runs timed one by one, which catch a long run exactly") {
    runtime rt({.loops = 1, .manual = true, .record = true});
    // Long from 100 µs: a sanitizer build's short runs stay far below it, the slow ones
    // (300 µs of work) above.
    auto& tr = rt.trace();
    const auto per_100us = ticks_of_100us(tr);
    tr.set_long_run(per_100us);
    auto sp = rt.spawn<spinner>();
    rt.run_until_idle();
    // One drain of 16: the 3rd run is slow inside a group of 8, so the group's span tells
    // only that one of them may have been long; the next 8 are timed alone, and the 11th,
    // slow too, shows its own 300 µs.
    for (int i = 0; i < 16; ++i) rt.send(sp, spin_msg{i == 2 || i == 10});
    rt.run_until_idle();
    const auto runs = runs_of(rt.trace().snapshot(), sp.id(), "spin_msg");
    REQUIRE(runs.size() == 16);
    std::int64_t group = 0;
    for (int i = 0; i < 8; ++i) {
      CHECK(runs[i].aux2 == 8);
      group += runs[i].dur_ns;
    }
    CHECK(group >= 299'000);
    for (int i = 8; i < 16; ++i) {
      CAPTURE(i);
      CHECK(runs[i].aux2 == -1);
      if (i == 10) CHECK(runs[i].dur_ns >= 299'000);
      else CHECK(runs[i].dur_ns < 299'000);
    }
    // The slow 3rd run shows its share of the group, not its own length: every run of the
    // group shows the same share (to the tick's rounding). An equality, not a bound, so a
    // preemption during the group (a loaded CI machine) does not break it.
    for (int i = 0; i < 8; ++i) {
      CAPTURE(i);
      CHECK(std::abs(runs[i].dur_ns - runs[2].dur_ns) <= 4);
    }
  }

  TEST_CASE("a loop whose short runs are slow groups them again once the runs timed alone have measured them") {
    runtime rt({.loops = 1, .manual = true, .record = true});
    auto& tr = rt.trace();
    const auto per_100us = ticks_of_100us(tr);
    tr.set_long_run(per_100us);
    auto p = rt.spawn<dash_trudger>(per_100us);  // no plod is long; 8 in a row are
    rt.run_until_idle();
    for (int i = 0; i < 96; ++i) rt.send(p, plod_msg{i});
    rt.run_until_idle();
    const auto runs = runs_of(tr.snapshot(), p.id(), "plod");
    REQUIRE(runs.size() == 96);
    // The first group spans more than the threshold, so the next 8 runs are timed alone;
    // they are short, and what they took is allowed for each run of a later group but one.
    for (int i = 0; i < 8; ++i) CHECK(runs[i].aux2 == 8);
    for (int i = 8; i < 16; ++i) CHECK(runs[i].aux2 == -1);
    // Without the allowance every other group is long, whatever the scheduler does: at
    // least 40 of the 80 runs after them are timed alone. With it, none is, but a
    // preemption of 80 µs or more inside a group still makes that group long (8 runs
    // alone), and inside a run timed alone marks its type long until the next (1 more).
    // Four such are allowed for: a loaded 2-core machine preempts every few ms.
    int alone = 0;
    for (int i = 16; i < 96; ++i) alone += runs[i].aux2 == -1;
    CHECK(alone <= 32);
  }

  TEST_CASE("an allowance measured while runs were slow shrinks until a long run in a group of fast ones is caught") {
    runtime rt({.loops = 1, .manual = true, .record = true});
    auto& tr = rt.trace();
    const auto per_100us = ticks_of_100us(tr);
    tr.set_long_run(per_100us);
    auto p = rt.spawn<dash_trudger>(per_100us);
    rt.run_until_idle();
    // 16 slow short runs: a long group, then 8 timed alone that make the allowance a fifth
    // of the threshold a run (7/5 of it for a group of 8).
    for (int i = 0; i < 16; ++i) rt.send(p, plod_msg{i});
    rt.run_until_idle();
    // Then rounds of 7 quick runs and a trudge. A group of them spans about 1.5 times the
    // threshold; less the first allowance (1.4 times it) that is below the threshold, so
    // no group is long until the allowance has shrunk to a third (about 65 groups); then
    // the next runs timed alone mark trudge long, and it is timed alone from there on.
    constexpr int rounds = 200;
    for (int r = 0; r < rounds; ++r) {
      for (int i = 0; i < 7; ++i) rt.send(p, dash_msg{});
      rt.send(p, trudge_msg{});
      if (r % 50 == 49) rt.run_until_idle();  // within the mailbox's 1,024
    }
    // (A preemption inside a group can make it long earlier, and catch trudge sooner; so
    // only the end is checked. Without the shrinking, only such a preemption could: on
    // a quiet machine every check below fails.)
    const auto trudges = runs_of(tr.snapshot(), p.id(), "trudge");
    REQUIRE(trudges.size() == rounds);
    for (int r = rounds - 50; r < rounds; ++r) {
      CAPTURE(r);
      CHECK(trudges[r].aux2 == -1);
      CHECK(trudges[r].dur_ns >= 100'000);
    }
  }

  TEST_CASE("the mailbox depth at each send counts what the receiver had not yet taken") {
    runtime rt({.loops = 1, .manual = true, .record = true});
    auto sink = rt.spawn<relay>("sink", address{});
    for (int i = 0; i < 5; ++i) rt.send(sink, fwd_msg{i, {}});
    rt.run_until_idle();
    for (int i = 5; i < 7; ++i) rt.send(sink, fwd_msg{i, {}});
    rt.run_until_idle();
    std::vector<std::int32_t> depths;
    for (auto& r : rt.trace().snapshot())
      if (r.kind == record_kind::send && r.tag && r.tag->name == "forward") depths.push_back(r.depth);
    CHECK(depths == std::vector<std::int32_t>{1, 2, 3, 4, 5, 1, 2});
    // The export draws them as the actor's mailbox counter.
    auto j = rt.trace().to_chrome_trace(nlohmann::json::array(), nlohmann::json::object());
    std::vector<int> counter;
    for (auto& e : j["traceEvents"])
      if (e["ph"] == "C" && e["name"] == "mailbox" && e["tid"] == sink.id()) counter.push_back(e["args"]["depth"].get<int>());
    CHECK(counter == std::vector<int>{1, 2, 3, 4, 5, 1, 2});
  }

  TEST_CASE("an urgent send reports the normal lane's depth, which can be 0") {
    runtime rt({.loops = 1, .manual = true, .record = true});
    auto sink = rt.spawn<relay>("sink", address{});
    rt.send(sink, fwd_msg{0, {}});
    rt.send(sink, fwd_msg{1, {}});
    rt.run_until_idle();
    rt.send(sink, fwd_msg{2, {}}, lane::urgent);  // nothing queued in the normal lane
    rt.send(sink, fwd_msg{3, {}});
    rt.send(sink, fwd_msg{4, {}}, lane::urgent);  // one normal message queued
    rt.run_until_idle();
    std::map<std::int64_t, std::int32_t> depth_of;  // micro-batch -> depth at its send
    for (auto& r : rt.trace().snapshot())
      if (r.kind == record_kind::send && r.tag && r.tag->name == "forward") depth_of[r.mb] = r.depth;
    CHECK(depth_of == std::map<std::int64_t, std::int32_t>{{0, 1}, {1, 2}, {2, 0}, {3, 1}, {4, 1}});
  }

  TEST_CASE("a handler that throws is recorded as its send and a failure, between the runs before it and the drops after") {
    for (const auto timing : {recorder::timing::shared, recorder::timing::exact}) {
      CAPTURE(static_cast<int>(timing));
      runtime rt({.loops = 1, .manual = true, .record = true, .record_timing = timing});
      rt.trace().set_long_run(std::int64_t{1} << 50);  // shared: the runs before it form one group
      auto t = rt.spawn<thrower>();
      for (int mb = 0; mb < 6; ++mb) rt.send(t, fwd_msg{mb, std::vector<float>(4, 1.f)});
      rt.run_until_idle();
      CHECK(t.stopped());
      REQUIRE(rt.error() != nullptr);
      CHECK_THROWS_WITH_AS(std::rethrow_exception(rt.error()), doctest::Contains("bad micro-batch 3"), actor_failure);
      auto recs = rt.trace().snapshot();
      std::map<std::int64_t, int> sends;  // by micro-batch
      std::vector<std::int64_t> handled;
      std::int64_t handled_end = 0, failure_ts = -1, failed_send_flow = -1;
      int failures = 0, drops = 0;
      for (auto& r : recs) {
        if (!r.tag || r.tag->name != "forward") continue;
        switch (r.kind) {
          case record_kind::send:
            ++sends[r.mb];
            CHECK(r.bytes == 16);
            if (r.mb == 3) failed_send_flow = static_cast<std::int64_t>(r.flow);
            break;
          case record_kind::handle:
            handled.push_back(r.mb);
            handled_end = std::max(handled_end, r.ts_ns + r.dur_ns);
            break;
          case record_kind::failure:
            ++failures;
            failure_ts = r.ts_ns;
            CHECK(r.track == t.id());
            break;
          case record_kind::drop:
            ++drops;
            CHECK(r.peer == t.id());
            break;
          default: break;
        }
      }
      std::sort(handled.begin(), handled.end());
      CHECK(handled == std::vector<std::int64_t>{0, 1, 2});
      CHECK(sends == std::map<std::int64_t, int>{{0, 1}, {1, 1}, {2, 1}, {3, 1}, {4, 1}, {5, 1}});
      CHECK(failed_send_flow > 0);
      CHECK(failures == 1);
      CHECK(drops == 2);
      CHECK(failure_ts >= handled_end);  // the failure comes after the runs before it, which stay timed
      rt.shutdown();
    }
  }
}

// placement::automatic: where actors start and how the runtime moves them between loops.
// Multi-loop tests: they wait on events, assert exact counts, and count moves.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "actors/runtime.hpp"
#include "test_util.hpp"

using namespace nerve::actors;

namespace {

/// A runtime of 2 loops whose migration decides often (small windows, short backoff),
/// so a test of 10^5..10^6 messages sees many moves. Heavy means 50 µs here, not 2: under
/// a sanitizer every run is 10-20x slower, and the light actors must stay light.
runtime_options eager(unsigned window = 32, unsigned max_backoff = 3) {
  runtime_options o;
  o.loops = 2;
  o.migration.window = window;
  o.migration.max_backoff = max_backoff;
  o.migration.heavy_ns = 50'000;
  return o;
}

unsigned here() { return detail::current_loop ? detail::current_loop->index : ~0u; }

/// Counts handler runs that overlap (two loops at once) or run off the actor's loop.
struct guard_counts {
  std::atomic<long> overlaps{0};
  std::atomic<long> wrong_loop{0};
  std::atomic<long> runs_on[2] = {0, 0};  // handler runs per loop
};
struct in_handler {
  std::atomic<int>& flag;
  guard_counts& c;
  in_handler(std::atomic<int>& f, guard_counts& counts, const actor& a) : flag(f), c(counts) {
    if (flag.exchange(1, std::memory_order_acq_rel) != 0) c.overlaps.fetch_add(1);
    if (here() != a.loop_index()) c.wrong_loop.fetch_add(1);
    if (here() < 2) c.runs_on[here()].fetch_add(1, std::memory_order_relaxed);
  }
  ~in_handler() { flag.store(0, std::memory_order_release); }
};

// ---- a random message graph ---------------------------------------------------------------

struct hop {
  std::uint32_t seq;  // per (sender, receiver) pair, from 1
};
struct wire {
  std::vector<address> all;
};

struct shared_state {
  std::uint64_t total = 0;               // handler runs that forward
  std::atomic<std::uint64_t> runs{0};
  guard_counts guards;
  std::atomic<long> out_of_order{0};
  nerve::test::event done;
};

/// Forwards each token to a random actor: mostly to its current friend (which changes with
/// the global phase, so the load keeps changing and actors keep moving), sometimes anywhere.
/// Numbers what it sends to each receiver and checks what it receives from each sender.
struct graph_node : actor {
  shared_state& st;
  std::vector<address> all;
  std::vector<std::uint32_t> sent_to, got_from;  // indexed by actor id
  std::mt19937 rng;
  std::atomic<int> inside{0};
  std::uint64_t handled = 0;
  unsigned index;
  graph_node(shared_state& s, unsigned i, unsigned seed) : actor("node-" + std::to_string(i)), st(s), rng(seed), index(i) {
    on<wire>([this](wire& w) {
      all = std::move(w.all);
      sent_to.assign(all.size() + 64, 0);
      got_from.assign(all.size() + 64, 0);
    });
    on<hop>([this](hop& h) {
      in_handler g(inside, st.guards, *this);
      ++handled;
      const auto from = sender();
      if (from != 0 && h.seq != ++got_from.at(from)) st.out_of_order.fetch_add(1);
      const auto r = st.runs.fetch_add(1, std::memory_order_relaxed) + 1;
      if (r == st.total) st.done.set();
      if (r >= st.total) return;
      const auto n = static_cast<unsigned>(all.size());
      const unsigned phase = static_cast<unsigned>(r / 20000);
      const unsigned to = rng() % 8 != 0 ? (index * 5 + phase * 3 + 1) % n : rng() % n;
      const auto& dest = all[to];
      send(dest, hop{++sent_to.at(dest.id())});
    });
  }
  void on_stop() override { all.clear(); }
};

// ---- ping-pong ----------------------------------------------------------------------------

struct ball {
  std::uint64_t left;
};
struct partner {
  address to;
};
struct player : actor {
  address peer;
  std::uint64_t handled = 0;
  nerve::test::event* done = nullptr;
  bool pin_me;
  explicit player(bool pin_self = false) : actor("player"), pin_me(pin_self) {
    if (pin_self) pin();
    on<partner>([this](partner& p) { peer = std::move(p.to); });
    on<ball>([this](ball& b) {
      ++handled;
      if (b.left == 0) {
        done->set();
        return;
      }
      send(peer, ball{b.left - 1});
    });
  }
  void on_stop() override { peer = {}; }
};

/// Plays `rounds` round trips between a and b (a serves); returns when they are done.
void rally(runtime& rt, const address& a, const address& b, std::uint64_t rounds) {
  nerve::test::event done;
  static_cast<player*>(a.get())->done = &done;
  static_cast<player*>(b.get())->done = &done;
  rt.send(a, partner{b});
  rt.send(b, partner{a});
  rt.synchronize();
  rt.send(b, ball{2 * rounds});  // b -> a -> b ...: 2 * rounds + 1 runs
  done.wait();
  rt.synchronize();
}

// ---- heavy work ---------------------------------------------------------------------------

void busy_for(std::chrono::microseconds d) {
  const auto end = std::chrono::steady_clock::now() + d;
  while (std::chrono::steady_clock::now() < end) {
  }
}

struct job {
  std::uint32_t n;
};
struct heavy_worker : actor {
  address sink;
  std::atomic<int> inside{0};
  guard_counts& guards;
  std::uint64_t handled = 0;
  heavy_worker(address s, guard_counts& g) : actor("heavy"), sink(std::move(s)), guards(g) {
    on<job>([this](job& j) {
      in_handler h(inside, guards, *this);
      ++handled;
      busy_for(std::chrono::microseconds(200));  // heavy: 4x eager()'s threshold
      send(sink, j);
    });
  }
};
struct tally : actor {
  std::uint64_t got = 0, expected;
  nerve::test::event* done;
  tally(std::uint64_t n, nerve::test::event* d) : actor("tally"), expected(n), done(d) {
    on<job>([this](job&) {
      if (++got == expected) done->set();
    });
  }
};
struct spawn_workers {
  unsigned n;
  address sink;
  guard_counts* guards;
};
struct start_jobs {
  std::uint32_t per_worker;
};
/// Spawns its workers from a handler (so they start on its loop) and feeds them.
struct migration_boss : actor {
  std::vector<address> workers;
  migration_boss() : actor("boss") {
    on<spawn_workers>([this](spawn_workers& s) {
      for (unsigned i = 0; i < s.n; ++i) workers.push_back(system().spawn<heavy_worker>(s.sink, *s.guards));
    });
    on<start_jobs>([this](start_jobs& s) {
      for (std::uint32_t k = 0; k < s.per_worker; ++k)
        for (auto& w : workers) send(w, job{k});
    });
  }
};

}  // namespace

TEST_SUITE("actors.migration") {
  TEST_CASE("a random message graph: every sender's order kept across moves, no handler on two loops at once") {
    auto opts = eager();
    opts.mailbox_capacity = 1 << 16;  // tokens pile up on popular nodes; nothing may be refused
    runtime rt(opts);
    shared_state st;
    st.total = static_cast<std::uint64_t>(1'000'000 * nerve::test::scale());
    constexpr unsigned n = 12, tokens = 32;
    std::vector<address> nodes;
    for (unsigned i = 0; i < n; ++i) nodes.push_back(rt.spawn<graph_node>(st, i, 1234 + i));
    for (auto& a : nodes) rt.send(a, wire{nodes});
    rt.synchronize();
    for (unsigned t = 0; t < tokens; ++t) rt.send(nodes[t % n], hop{0});
    st.done.wait();
    rt.synchronize();
    std::uint64_t handled = 0;
    for (auto& a : nodes) handled += static_cast<graph_node*>(a.get())->handled;
    // Each run below `total` forwards one token; the tokens in flight when it is reached
    // end where they land: exactly total + tokens - 1 runs.
    CHECK(handled == st.total + tokens - 1);
    CHECK(st.runs.load() == st.total + tokens - 1);
    CHECK(st.out_of_order.load() == 0);
    CHECK(st.guards.overlaps.load() == 0);
    CHECK(st.guards.wrong_loop.load() == 0);
    MESSAGE("moves: " << rt.migrations().affinity << " affinity, " << rt.migrations().balance << " balance");
    CHECK(rt.migrations().total() > 0);  // the test moved actors (what it is about)
    rt.shutdown();
  }

  TEST_CASE("a chatty pair spawned on different loops ends on one loop, then stays") {
    runtime rt(eager(64, 12));
    auto a = rt.spawn<player>();
    auto b = rt.spawn<player>();
    CHECK(a.loop() != b.loop());  // from outside: the loops in turn
    const auto rounds = static_cast<std::uint64_t>(50'000 * nerve::test::scale());
    rally(rt, a, b, rounds);
    CHECK(a.loop() == b.loop());
    const auto settled = rt.migrations().total();
    CHECK(settled >= 1);
    CHECK(settled <= 2);  // one moves; the epoch keeps the other from swapping at once
    rally(rt, a, b, rounds);
    CHECK(rt.migrations().total() == settled);  // no ping-pong of actors once settled
    CHECK(static_cast<player*>(a.get())->handled + static_cast<player*>(b.get())->handled == 2 * (2 * rounds + 1));
    rt.shutdown();
  }

  TEST_CASE("moves stop when the load changes: a new partner pulls once, an even split pulls nobody") {
    runtime rt(eager(64, 12));
    auto a = rt.spawn<player>();
    auto b = rt.spawn<player>();
    const auto rounds = static_cast<std::uint64_t>(40'000 * nerve::test::scale());
    rally(rt, a, b, rounds);
    const unsigned home = a.loop();
    // A partner pinned on the other loop: a (mobile) follows it, once.
    auto c = rt.spawn_on<player>(1 - home);
    const auto before = rt.migrations().total();
    rally(rt, a, c, rounds);
    CHECK(a.loop() == c.loop());
    CHECK(c.loop() == 1 - home);
    const auto after_c = rt.migrations().total();
    CHECK(after_c - before >= 1);
    CHECK(after_c - before <= 2);
    // Back to b (which may have stayed alone): at most a couple of moves, then none.
    rally(rt, a, b, rounds);
    CHECK(a.loop() == b.loop());
    const auto after_b = rt.migrations().total();
    MESSAGE("after c: " << after_c << " after b: " << after_b << " a moves " << a.get()->moves() << " b moves " << b.get()->moves());
    CHECK(after_b - after_c <= 2);
    rally(rt, a, b, rounds);
    rally(rt, a, b, rounds);
    CHECK(rt.migrations().total() == after_b);
    // Over all five rallies of a mobile actor whose partner changed twice: a handful of moves.
    CHECK(static_cast<player*>(a.get())->moves() <= 4);
    rt.shutdown();
  }

  TEST_CASE("an actor whose senders are split between two loops stays where it is") {
    runtime rt(eager(32, 12));
    // x gets the ball from two pinned partners, one per loop, in turn: no 3/4 majority.
    struct relay : actor {
      address p0, p1;
      std::uint64_t handled = 0;
      nerve::test::event* done;
      explicit relay(nerve::test::event* d) : actor("relay"), done(d) {
        on<wire>([this](wire& w) {
          p0 = w.all[0];
          p1 = w.all[1];
        });
        on<ball>([this](ball& b) {
          ++handled;
          if (b.left == 0) return done->set();
          send(handled % 2 ? p0 : p1, ball{b.left - 1});  // the partners in turn
        });
      }
      void on_stop() override { p0 = p1 = {}; }
    };
    nerve::test::event done;
    auto x = rt.spawn<relay>(&done);
    auto p0 = rt.spawn_on<player>(0);
    auto p1 = rt.spawn_on<player>(1);
    rt.send(x, wire{{p0, p1}});
    rt.send(p0, partner{x});
    rt.send(p1, partner{x});
    static_cast<player*>(p0.get())->done = &done;
    static_cast<player*>(p1.get())->done = &done;
    rt.synchronize();
    const auto n = static_cast<std::uint64_t>(100'000 * nerve::test::scale());
    rt.send(x, ball{2 * n});
    done.wait();
    rt.synchronize();
    CHECK(x.get()->moves() == 0);
    CHECK(rt.migrations().total() == 0);
    rt.shutdown();
  }

  TEST_CASE("pinned actors never move: pin(), spawn_on, spawn_options::pinned") {
    runtime rt(eager(16, 2));
    const auto rounds = static_cast<std::uint64_t>(30'000 * nerve::test::scale());
    SUBCASE("an actor that pins itself, against a partner pinned on the other loop") {
      auto a = rt.spawn<player>(true);
      auto b = rt.spawn_on<player>(1 - a.loop());
      const unsigned la = a.loop();
      CHECK(a.get()->pinned());
      rally(rt, a, b, rounds);
      CHECK(a.loop() == la);
      CHECK(a.get()->moves() == 0);
      CHECK(b.get()->moves() == 0);
      CHECK(rt.migrations().total() == 0);
    }
    SUBCASE("spawn_options::pinned, and a mobile partner that moves to it instead") {
      spawn_options o;
      o.pinned = true;
      auto a = rt.spawn_with<player>(o);
      auto b = rt.spawn<player>();
      const unsigned la = a.loop();
      CHECK(a.get()->pinned());
      CHECK(!b.get()->pinned());
      rally(rt, a, b, rounds);
      CHECK(a.loop() == la);
      CHECK(a.get()->moves() == 0);
      CHECK(b.loop() == la);  // migration was on: the mobile one went to the pinned one
      CHECK(b.get()->moves() >= 1);
    }
    rt.shutdown();
  }

  TEST_CASE("spawned from a handler, an actor starts on its spawner's loop") {
    runtime rt(eager());
    guard_counts guards;
    nerve::test::event done;
    auto sink = rt.spawn_on<tally>(0, 1, &done);
    auto b = rt.spawn_on<migration_boss>(1);
    rt.send(b, spawn_workers{3, sink, &guards});
    rt.synchronize();
    for (auto& w : static_cast<migration_boss*>(b.get())->workers) CHECK(w.loop() == 1);
    rt.shutdown();
  }

  TEST_CASE("heavy actors started on one loop spread to the idle one; light chatter does not pull them back") {
    auto opts = eager(16, 3);
    opts.mailbox_capacity = 1 << 14;  // the boss queues every job at once
    opts.batch = 2;  // a decision comes at the end of a drain: short drains, early decisions
    runtime rt(opts);
    guard_counts guards;
    nerve::test::event done;
    constexpr unsigned workers = 6;
    constexpr std::uint32_t per_worker = 200;  // 6 x 200 x 200 us: 0.24 s on one loop
    spawn_options so;
    so.loop = 0;
    so.capacity = std::size_t{workers} * per_worker + 16;
    auto sink = rt.spawn_with<tally>(so, std::uint64_t{workers} * per_worker, &done);
    so.capacity = 0;
    auto b = rt.spawn_with<migration_boss>(so);
    rt.send(b, spawn_workers{workers, sink, &guards});
    rt.synchronize();
    auto& ws = static_cast<migration_boss*>(b.get())->workers;
    for (auto& w : ws) CHECK(w.loop() == 0);  // all on the boss's loop
    rt.send(b, start_jobs{per_worker});
    done.wait();
    rt.synchronize();
    std::uint64_t handled = 0;
    for (auto& w : ws) handled += static_cast<heavy_worker*>(w.get())->handled;
    CHECK(handled == std::uint64_t{workers} * per_worker);
    CHECK(guards.overlaps.load() == 0);
    CHECK(guards.wrong_loop.load() == 0);
    const long on0 = guards.runs_on[0].load(), on1 = guards.runs_on[1].load();
    MESSAGE("jobs run on loop 0: " << on0 << ", on loop 1: " << on1 << "; moves: " << rt.migrations().balance
                                   << " balance, " << rt.migrations().affinity << " affinity");
    CHECK(on0 + on1 == static_cast<long>(handled));
    CHECK(rt.migrations().balance >= 1);
    CHECK(rt.migrations().affinity == 0);  // heavy actors are never packed
    // Equal workers end in an even split (4 / 2 still moves one; 3 / 3 does not).
    unsigned on_loop1 = 0;
    for (auto& w : ws) on_loop1 += w.loop();
    CHECK(on_loop1 == workers / 2);
    // Both loops worked: a fifth of the jobs at least on each (an even split is half).
    CHECK(on1 * 5 >= static_cast<long>(handled));
    CHECK(on0 * 5 >= static_cast<long>(handled));
    rt.shutdown();
  }

  TEST_CASE("a heavy actor does not move where the heavier loop would get heavier, though that loop idles") {
    // Rounds of one job per worker: loop 0 runs a (800 us) then b (200 us), loop 1 runs
    // c (400 us) and idles while b waits behind a. Moving a would make loop 1 the heavier
    // (1200 against 1000 us a round): it stays. (A rule that moved to any idle loop did,
    // and then moved a back and forth.) Moving b makes both lighter (800 and 600 us): it
    // may, once, when someone waits behind it at the end of its run (the driver, woken
    // by the round's end, if that comes first).
    runtime rt(eager(16, 3));
    struct round_done {};
    struct driver : actor {
      std::vector<address> workers;
      std::uint32_t rounds = 0, total;
      nerve::test::event* done;
      driver(std::uint32_t n, nerve::test::event* d) : actor("driver"), total(n), done(d) {
        on<round_done>([this](round_done&) {
          if (++rounds == total) return done->set();
          for (auto& w : workers) send(w, job{rounds});
        });
      }
      void on_stop() override { workers.clear(); }
    };
    struct timed_worker : actor {
      address to;
      std::chrono::microseconds cost;
      timed_worker(address t, std::chrono::microseconds c) : actor("timed"), to(std::move(t)), cost(c) {
        on<job>([this](job& j) {
          busy_for(cost);
          send(to, j);
        });
      }
    };
    struct gather : actor {
      address driver_at;
      unsigned per_round, got = 0;
      explicit gather(unsigned n) : actor("gather"), per_round(n) {
        on<partner>([this](partner& p) { driver_at = std::move(p.to); });
        on<job>([this](job&) {
          if (++got % per_round == 0) send(driver_at, round_done{});
        });
      }
      void on_stop() override { driver_at = {}; }
    };
    nerve::test::event done;
    const auto rounds = static_cast<std::uint32_t>(std::max(60.0, 150 * nerve::test::scale()));
    auto d = rt.spawn_on<driver>(0, rounds, &done);
    auto g = rt.spawn_on<gather>(1, 3u);
    rt.send(g, partner{d});
    // From outside, mobile actors go to the loops in turn: a on 0, c on 1, b on 0.
    auto a = rt.spawn<timed_worker>(g, std::chrono::microseconds(800));
    auto c = rt.spawn<timed_worker>(g, std::chrono::microseconds(400));
    auto b = rt.spawn<timed_worker>(g, std::chrono::microseconds(200));
    REQUIRE(a.loop() == 0);
    REQUIRE(b.loop() == 0);
    REQUIRE(c.loop() == 1);
    static_cast<driver*>(d.get())->workers = {a, b, c};
    rt.synchronize();
    rt.send(d, round_done{});  // round 1
    done.wait();
    rt.synchronize();
    MESSAGE("moves: " << rt.migrations().balance << " balance, " << rt.migrations().affinity << " affinity");
    CHECK(a.get()->moves() == 0);
    CHECK(c.get()->moves() == 0);
    CHECK(b.get()->moves() <= 1);
    CHECK(rt.migrations().affinity == 0);
    CHECK(a.loop() == 0);
    CHECK(c.loop() == 1);
    rt.shutdown();
  }

  TEST_CASE("manual mode and the other policies never move actors") {
    SUBCASE("manual") {
      auto o = eager(8, 1);
      o.manual = true;
      runtime rt(o);
      auto a = rt.spawn<player>();
      CHECK(a.get()->pinned());
      rt.shutdown();
    }
    SUBCASE("round_robin") {
      auto o = eager(8, 1);
      o.policy = placement::round_robin;
      runtime rt(o);
      auto a = rt.spawn<player>();
      auto b = rt.spawn<player>();
      rally(rt, a, b, 5000);
      CHECK(a.loop() != b.loop());
      CHECK(rt.migrations().total() == 0);
      rt.shutdown();
    }
    SUBCASE("migration off") {
      auto o = eager(8, 1);
      o.migration.enabled = false;
      runtime rt(o);
      auto a = rt.spawn<player>();
      CHECK(a.get()->pinned());
      rt.shutdown();
    }
  }
}

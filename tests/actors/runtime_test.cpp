#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <latch>
#include <map>
#include <random>
#include <vector>

#include "actors/runtime.hpp"
#include "test_util.hpp"

using namespace nerve::actors;

namespace {

struct token {
  int id;
  int hop;
  int ttl;
};

/// Forwards tokens to random neighbours until their TTL runs out; counts what it saw.
struct node : actor {
  std::vector<address> out;
  std::mt19937 rng;
  std::vector<std::pair<int, int>> seen;  // (token, hop): checked for exactness later
  explicit node(unsigned seed) : actor(), rng(seed) {
    on<token>([this](token& t) {
      seen.emplace_back(t.id, t.hop);
      if (t.ttl == 0) return;
      auto& to = out[rng() % out.size()];
      send(to, token{t.id, t.hop + 1, t.ttl - 1});
    });
  }
};

struct seq_msg {
  int from;
  int seq;
};

struct checker : actor {
  std::map<int, int> next;
  std::atomic<long> got{0};
  long violations = 0;
  checker() : actor("checker") {
    on<seq_msg>([this](seq_msg& m) {
      if (m.seq != next[m.from]) ++violations;
      next[m.from] = m.seq + 1;
      got.fetch_add(1, std::memory_order_relaxed);
    });
  }
};

struct burst {
  int count;
};

/// Sends `count` numbered messages to the checker when told to.
struct producer : actor {
  address target;
  int me;
  int seq = 0;
  producer(address t, int id) : actor("producer-" + std::to_string(id)), target(std::move(t)), me(id) {
    on<burst>([this](burst& b) {
      for (int i = 0; i < b.count; ++i) send(target, seq_msg{me, seq++});
    });
  }
};

}  // namespace

TEST_SUITE("actors.runtime") {
  TEST_CASE("no message is lost or duplicated: 1,000 actors, a random graph, 10^6 deliveries, 2 loops") {
    const int actors = 1000;
    const int tokens = 1000;
    const int ttl = static_cast<int>(999 * nerve::test::scale());
    runtime rt({.loops = 2, .mailbox_capacity = 2048});
    std::vector<address> nodes;
    for (int i = 0; i < actors; ++i) nodes.push_back(rt.spawn<node>(static_cast<unsigned>(i)));
    std::mt19937 rng(42);
    for (auto& n : nodes) {  // each node gets 4 random out-edges, wired before any message flows
      auto* p = static_cast<node*>(n.get());
      for (int k = 0; k < 4; ++k) p->out.push_back(nodes[rng() % nodes.size()]);
    }
    rt.synchronize();  // on_start of every node has run
    for (int t = 0; t < tokens; ++t) rt.send(nodes[rng() % nodes.size()], token{t, 0, ttl});
    rt.synchronize();

    // Every token visited exactly hops 0..ttl, once each.
    std::vector<std::vector<char>> hit(tokens, std::vector<char>(ttl + 1, 0));
    long total = 0, dup = 0;
    for (auto& n : nodes)
      for (auto [id, hop] : static_cast<node*>(n.get())->seen) {
        ++total;
        if (hit[id][hop]++) ++dup;
      }
    CHECK(total == static_cast<long>(tokens) * (ttl + 1));
    CHECK(dup == 0);
    rt.shutdown();
    CHECK(rt.error() == nullptr);
  }

  TEST_CASE("FIFO holds per sender-receiver pair across loops") {
    runtime rt({.loops = 2, .mailbox_capacity = 1 << 20});
    auto c = rt.spawn_on<checker>(1);
    std::vector<address> ps;
    for (int i = 0; i < 6; ++i) ps.push_back(rt.spawn_on<producer>(i % 2, c, i));
    const int per = static_cast<int>(20000 * nerve::test::scale());
    for (auto& p : ps) rt.send(p, burst{per / 2});
    for (auto& p : ps) rt.send(p, burst{per / 2});  // two bursts per producer, interleaved
    rt.synchronize();
    auto* ck = static_cast<checker*>(c.get());
    CHECK(ck->got.load() == 6L * (per / 2) * 2);
    CHECK(ck->violations == 0);
    for (auto& [from, next] : ck->next) CHECK(next == (per / 2) * 2);
  }

  TEST_CASE("submit returns a future that is ready when the handler has run") {
    runtime rt({.loops = 2});
    struct acc : actor {
      long sum = 0;
      acc() : actor("acc") {
        on<int>([this](int& v) { sum += v; });
      }
    };
    auto a = rt.spawn<acc>();
    std::vector<std::future<void>> fs;
    for (int i = 1; i <= 100; ++i) fs.push_back(rt.submit(a, i));
    for (auto& f : fs) f.get();
    CHECK(static_cast<acc*>(a.get())->sum == 5050);
  }

  TEST_CASE("synchronize waits for work counted with begin_work/end_work") {
    runtime rt({.loops = 1});
    std::atomic<bool> done{false};
    rt.begin_work();
    std::thread t([&] {
      done = true;
      rt.end_work();
    });
    rt.synchronize();
    CHECK(done.load());
    t.join();
  }

  TEST_CASE("manual mode steps the loop by hand, deterministically") {
    runtime rt({.loops = 2, .manual = true});
    struct ping : actor {
      address peer;
      std::vector<int>* log;
      ping(std::vector<int>* l) : actor("ping"), log(l) {
        on<int>([this](int& v) {
          log->push_back(v);
          if (v < 5) send(peer, v + 1);
        });
      }
    };
    std::vector<int> log;
    auto a = rt.spawn_on<ping>(0, &log);
    auto b = rt.spawn_on<ping>(1, &log);
    static_cast<ping*>(a.get())->peer = b;
    static_cast<ping*>(b.get())->peer = a;
    rt.send(a, 0);
    CHECK(log.empty());  // nothing runs until the test steps the loops
    rt.run_until_idle();
    CHECK(log == std::vector<int>{0, 1, 2, 3, 4, 5});
    CHECK(rt.idle());
  }

  TEST_CASE("an actor's batch: how many of its messages run before the loop's other actors") {
    // A spinner sends itself its next turn (a poller's shape); a peer on its loop waits for
    // one message. Its place in the log says when the spinner let it run.
    struct spinner : actor {
      std::vector<char>* log;
      spinner(std::vector<char>* l) : actor("spinner"), log(l) {
        on<int>([this](int& left) {
          log->push_back('s');
          if (left > 0) send(self(), left - 1);
        });
      }
    };
    struct peer : actor {
      std::vector<char>* log;
      peer(std::vector<char>* l) : actor("peer"), log(l) {
        on<int>([this](int&) { log->push_back('p'); });
      }
    };
    auto peer_at = [](unsigned batch) {
      runtime rt({.loops = 1, .manual = true});
      std::vector<char> log;
      spawn_options o;
      o.batch = batch;
      auto s = rt.spawn_with<spinner>(o, &log);
      auto p = rt.spawn<peer>(&log);
      rt.run_until_idle();  // both started
      rt.send(s, 10);
      rt.send(p, 0);
      rt.run_until_idle();
      REQUIRE(log.size() == 12);
      return std::find(log.begin(), log.end(), 'p') - log.begin();
    };
    CHECK(peer_at(0) == 11);  // the runtime's batch (64): all eleven turns first
    CHECK(peer_at(1) == 1);   // one turn, then the peer
    CHECK(peer_at(4) == 4);
  }

  TEST_CASE("sending to a stopped actor is a clear error") {
    runtime rt({.loops = 1});
    struct quiet : actor {
      quiet() : actor("quiet") {
        on<int>([](int&) {});
      }
    };
    auto a = rt.spawn<quiet>();
    rt.stop(a);
    rt.synchronize();
    CHECK(a.stopped());
    CHECK(rt.try_send(a, 1) == send_status::closed);
    CHECK_THROWS_WITH_AS(rt.send(a, 1), "send to stopped actor 'quiet'", send_error);
  }

  TEST_CASE("placement: explicit loops and round robin") {
    runtime rt({.loops = 3, .manual = true});
    struct idle_actor : actor {};
    CHECK(rt.spawn_on<idle_actor>(2).loop() == 2);
    std::vector<unsigned> loops;
    for (int i = 0; i < 6; ++i) loops.push_back(rt.spawn<idle_actor>().loop());
    CHECK(loops == std::vector<unsigned>{0, 1, 2, 0, 1, 2});
    CHECK_THROWS_AS(rt.spawn_on<idle_actor>(3), wiring_error);
  }

  TEST_CASE("shutdown with 10^5 messages in flight: cancel drops them, drain handles them, nothing leaks") {
    struct payload {
      std::shared_ptr<std::atomic<long>> alive;
      explicit payload(std::shared_ptr<std::atomic<long>> a) : alive(std::move(a)) { alive->fetch_add(1); }
      payload(payload&& o) noexcept = default;
      ~payload() {
        if (alive) alive->fetch_sub(1);
      }
    };
    struct slow : actor {
      std::atomic<long>* handled;
      explicit slow(std::atomic<long>* h) : actor("slow"), handled(h) {
        on<payload>([this](payload&) { handled->fetch_add(1, std::memory_order_relaxed); });
      }
    };
    const long n = static_cast<long>(100000 * nerve::test::scale());
    for (auto mode : {shutdown_mode::cancel, shutdown_mode::drain}) {
      CAPTURE(static_cast<int>(mode));
      auto alive = std::make_shared<std::atomic<long>>(0);
      std::atomic<long> handled{0};
      {
        runtime rt({.loops = 2, .mailbox_capacity = static_cast<std::size_t>(n)});
        std::vector<address> as;
        for (int i = 0; i < 4; ++i) as.push_back(rt.spawn<slow>(&handled));
        for (long i = 0; i < n; ++i) rt.send(as[i % 4], payload(alive));
        rt.shutdown(mode);
        if (mode == shutdown_mode::drain) CHECK(handled.load() == n);
        else CHECK(handled.load() <= n);
        CHECK(alive->load() == 0);  // every payload destroyed: handled or dropped, none leaked
      }
      CHECK(alive->load() == 0);
    }
  }
}

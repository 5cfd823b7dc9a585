#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <set>
#include <stdexcept>
#include <vector>

#include "actors/detail/actor_arena.hpp"
#include "actors/detail/segmented_vector.hpp"
#include "actors/runtime.hpp"
#include "test_util.hpp"

using namespace nerve::actors;
using nerve::actors::detail::actor_arena;

namespace {

std::atomic<long> constructed{0};
std::atomic<long> destroyed{0};

struct counted : actor {
  std::vector<address> peers;
  std::uint64_t got = 0;
  counted() {
    constructed.fetch_add(1, std::memory_order_relaxed);
    on<address>([this](address& a) { peers.push_back(std::move(a)); });
    on<std::uint64_t>([this](std::uint64_t&) { ++got; });
  }
  ~counted() override { destroyed.fetch_add(1, std::memory_order_relaxed); }
};

struct big_actor : actor {
  char payload[6000] = {};  // more than a slot: from operator new
};

struct alignas(128) over_aligned : actor {
  int x = 7;
};

struct throws_in_ctor : actor {
  throws_in_ctor() { throw std::runtime_error("no"); }
};

struct replier : actor {
  address to;
  explicit replier(address c) : to(std::move(c)) {
    on<std::uint64_t>([this](std::uint64_t& v) { send(to, v); });
  }
};

struct summer : actor {
  std::uint64_t got = 0, sum = 0;
  summer() {
    on<std::uint64_t>([this](std::uint64_t& v) {
      ++got;
      sum += v;
    });
  }
};

struct start_order : actor {
  std::vector<int> seen;
  void on_start() override { seen.push_back(-1); }
  start_order() {
    on<int>([this](int& v) { seen.push_back(v); });
  }
};

struct bad_start : actor {
  void on_start() override { throw std::runtime_error("bad start"); }
};

// Handles `stop_after` messages, then stops itself; records what it had handled when it
// was destroyed.
std::atomic<long> last_got_at_destruction{-1};
struct self_stopper : actor {
  std::uint64_t got = 0, stop_after;
  explicit self_stopper(std::uint64_t n) : stop_after(n) {
    on<std::uint64_t>([this](std::uint64_t&) {
      if (++got == stop_after) stop();
    });
  }
  ~self_stopper() override {
    last_got_at_destruction.store(static_cast<long>(got), std::memory_order_relaxed);
    destroyed.fetch_add(1, std::memory_order_relaxed);
  }
};

}  // namespace

TEST_SUITE("actors.arena") {
  TEST_CASE("slots are 64-byte aligned, sized in 64-byte steps and reused after free") {
    actor_arena a;
    void* p = a.allocate(100);
    void* q = a.allocate(100);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % 64 == 0);
    CHECK(reinterpret_cast<std::uintptr_t>(q) % 64 == 0);
    CHECK(static_cast<char*>(q) - static_cast<char*>(p) == 128);
    CHECK(a.live() == 2);
    a.deallocate(p, 100);
    CHECK(a.live() == 1);
    void* other = a.allocate(300);  // another class: not p's slot
    CHECK(other != p);
    CHECK(a.allocate(120) == p);  // same class (128 bytes): the freed slot
    CHECK(a.reused() == 1);
    a.deallocate(p, 120);
    a.deallocate(q, 100);
    a.deallocate(other, 300);
    CHECK(a.live() == 0);
  }

  TEST_CASE("objects bigger than a slot come from operator new") {
    actor_arena a;
    void* p = a.allocate(actor_arena::max_slot + 1);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % 64 == 0);
    CHECK(a.live() == 0);
    CHECK(a.blocks() == 0);
    a.deallocate(p, actor_arena::max_slot + 1);
  }

  TEST_CASE("many allocations span several blocks, each slot distinct") {
    actor_arena a;
    const std::size_t n = 20000;  // 20000 x 320 bytes: the 64 KiB block, then 2 MiB blocks
    std::vector<void*> ps;
    std::set<void*> distinct;
    for (std::size_t i = 0; i < n; ++i) {
      ps.push_back(a.allocate(300));
      distinct.insert(ps.back());
      static_cast<char*>(ps.back())[299] = 1;  // writable to its last byte
    }
    CHECK(distinct.size() == n);
    const std::size_t in_first = actor_arena::first_block / 320, per_block = actor_arena::block / 320;
    CHECK(a.blocks() == 1 + (n - in_first + per_block - 1) / per_block);
    for (auto* p : ps) a.deallocate(p, 300);
    CHECK(a.live() == 0);
    const auto blocks = a.blocks();
    for (std::size_t i = 0; i < n; ++i) ps[i] = a.allocate(300);  // all reused: no new block
    CHECK(a.blocks() == blocks);
    CHECK(a.reused() == n);
    for (auto* p : ps) a.deallocate(p, 300);
  }

  TEST_CASE("segmented_vector appends without moving earlier elements") {
    nerve::actors::detail::segmented_vector<std::uint64_t, 4> v;  // 16 per segment
    std::vector<const std::uint64_t*> where;
    for (std::uint64_t i = 0; i < 100; ++i) where.push_back(&v.push_back(i * 3));
    CHECK(v.size() == 100);
    for (std::uint64_t i = 0; i < 100; ++i) {
      CHECK(v[i] == i * 3);
      CHECK(where[i] == &v[i]);
    }
    auto taken = v.take();
    CHECK(v.empty());
    CHECK(taken.size() == 100);
    CHECK(taken[99] == 297);
  }

  TEST_CASE("a deleted actor's slot goes to the next spawn of the same size") {
    runtime rt({.loops = 1, .manual = true});
    auto a = rt.spawn<counted>();
    actor* first = a.get();
    rt.stop(a);
    rt.run_until_idle();
    const long before = destroyed.load();
    a = {};  // the last address: the actor is destroyed now
    CHECK(destroyed.load() == before + 1);
    auto b = rt.spawn<counted>();
    CHECK(b.get() == first);
    rt.send(b, std::uint64_t{1});
    rt.run_until_idle();
    CHECK(static_cast<counted*>(b.get())->got == 1);
    rt.shutdown();
  }

  TEST_CASE("an actor whose last address goes while it drains is destroyed by that drain, after it") {
    // A wake-up holds no reference: the runtime's own address is the last one here, and it
    // goes when the actor stops, in the middle of a drain (the actor is scheduled). The drain
    // finishes (dropping what was queued behind the stop) and then destroys the actor.
    runtime rt({.loops = 1, .manual = true});
    auto a = rt.spawn<self_stopper>(std::uint64_t{3});
    rt.run_until_idle();  // on_start
    for (std::uint64_t i = 0; i < 5; ++i) rt.send(a, i);
    const long before = destroyed.load();
    a = {};  // the runtime's address is the last
    CHECK(destroyed.load() == before);
    rt.run_until_idle();
    CHECK(destroyed.load() == before + 1);  // by the drain, not by the runtime's teardown
    CHECK(last_got_at_destruction.load() == 3);  // the two behind the stop were dropped, not handled
    rt.shutdown();
    CHECK(destroyed.load() == before + 1);  // once
  }

  TEST_CASE("addresses dropped on another thread while their actors drain: every actor destroyed once") {
    // Races the last release (this thread, or the actor's own stop on its loop) against the
    // drain going idle: exactly one of them destroys each actor (ASan sees a second one).
    const int n = nerve::test::scale() < 1 ? 500 : 4000;
    const long d0 = destroyed.load();
    {
      runtime rt({.loops = 2});
      for (int i = 0; i < n; ++i) {
        auto a = rt.spawn<self_stopper>(std::uint64_t{2});
        for (std::uint64_t k = 0; k < 4; ++k) (void)rt.try_send(a, k);  // 2 handled, the rest dropped or refused
        if (i % 2) rt.stop(a);
      }  // each address goes here, while its actor is likely still queued or draining
      rt.synchronize();
      rt.shutdown();
      // Stopped actors whose wake-up was still queued at the shutdown are left to the teardown.
      CHECK(destroyed.load() - d0 <= n);
    }
    CHECK(destroyed.load() - d0 == n);
  }

  TEST_CASE("big, over-aligned and throwing actors") {
    runtime rt({.loops = 1, .manual = true});
    auto big = rt.spawn<big_actor>();
    auto al = rt.spawn<over_aligned>();
    CHECK(reinterpret_cast<std::uintptr_t>(al.get()) % 128 == 0);
    CHECK(static_cast<over_aligned*>(al.get())->x == 7);
    CHECK_THROWS_AS(rt.spawn<throws_in_ctor>(), std::runtime_error);
    auto after = rt.spawn<counted>();  // the thrown one's slot was given back
    rt.run_until_idle();
    CHECK(rt.spawned() == 3);
    rt.shutdown();
  }

  TEST_CASE("100,000 spawns (10,000 sanitized), one message and one reply each, all counted") {
    const std::uint64_t n = nerve::test::scale() < 1 ? 10000 : 100000;
    runtime rt({.loops = 2});
    auto sum = rt.spawn_with<summer>({.loop = std::nullopt, .capacity = n + 16, .supervisor = {}});
    for (std::uint64_t i = 0; i < n; ++i) rt.send(rt.spawn<replier>(sum), i);
    rt.synchronize();
    auto* s = static_cast<summer*>(sum.get());
    CHECK(s->got == n);
    CHECK(s->sum == n * (n - 1) / 2);
    CHECK(rt.spawned() == n + 1);
    rt.shutdown();
  }

  TEST_CASE("destroying the runtime destroys every live actor once, whoever holds its address") {
    const long c0 = constructed.load(), d0 = destroyed.load();
    address kept;
    {
      runtime rt({.loops = 2});
      std::vector<address> all;
      for (int i = 0; i < 3000; ++i) all.push_back(rt.spawn<counted>());
      for (std::size_t i = 0; i < all.size(); ++i) {  // a ring of addresses: a cycle through every actor
        rt.send(all[i], address{all[(i + 1) % all.size()]});  // a copy: send moves from what it is given
        rt.send(all[i], std::uint64_t{i});
      }
      rt.synchronize();
      kept = all[17];
      CHECK(!kept.stopped());
    }
    CHECK(constructed.load() - c0 == 3000);
    CHECK(destroyed.load() - d0 == 3000);
    CHECK(kept.stopped());
    CHECK(kept.get() == nullptr);
  }

  TEST_CASE("on_start runs before messages sent right after spawn; a throwing one fails the actor") {
    runtime rt({.loops = 1, .manual = true});
    auto a = rt.spawn<start_order>();
    rt.send(a, 1);
    rt.send(a, 2);
    rt.run_until_idle();
    CHECK(static_cast<start_order*>(a.get())->seen == std::vector<int>{-1, 1, 2});
    auto b = rt.spawn<bad_start>();
    rt.run_until_idle();
    CHECK(b.stopped());
    REQUIRE(rt.error() != nullptr);
    CHECK_THROWS_WITH_AS(std::rethrow_exception(rt.error()), doctest::Contains("bad start"), actor_failure);
    rt.shutdown();
  }
}

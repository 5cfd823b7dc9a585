#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>

#include "actors/runtime.hpp"
#include "test_util.hpp"

using namespace nerve::actors;

namespace {
struct stress_item {
  long seq;
  std::vector<float> data;
};

/// A slow consumer: checks its own mailbox never holds more than its capacity.
struct consumer : actor {
  long expected = 0;
  long violations = 0;
  std::size_t max_seen = 0;
  consumer() : actor("consumer") {
    on<stress_item>([this](stress_item& it) {
      max_seen = std::max(max_seen, queued() + 1);  // +1: the one being handled
      if (it.seq != expected) ++violations;
      expected = it.seq + 1;
      volatile float s = 0;
      for (int r = 0; r < 20; ++r)
        for (float f : it.data) s = s + f;  // slower than the producer
    });
  }
};

struct go {};

/// A fast producer that respects back-pressure: try_send, and when full wait for room.
struct stress_producer : actor {
  address to;
  long total, next = 0;
  long refusals = 0;
  stress_producer(address t, long n) : actor("producer"), to(std::move(t)), total(n) {
    on<go>([this](go&) { pump(); });
  }
  void pump() {
    while (next < total) {
      stress_item it{next, std::vector<float>(256, 1.f)};
      if (try_send(to, std::move(it)) != send_status::ok) {
        ++refusals;
        when_writable(to, [this] { pump(); });  // resumes on our loop once there is room
        return;
      }
      ++next;
    }
  }
};
/// Sends one item; when the receiver is full, waits for room and then sends it.
struct patient_producer : actor {
  address to;
  bool waiting = false, resumed = false;
  explicit patient_producer(address t) : actor("patient"), to(std::move(t)) {
    on<go>([this](go&) {
      if (try_send(to, stress_item{1, {}}) == send_status::ok) return;
      waiting = true;
      when_writable(to, [this] {
        resumed = true;
        (void)try_send(to, stress_item{1, {}});
      });
    });
  }
};
}  // namespace

TEST_SUITE("actors.backpressure") {
  TEST_CASE("a producer waiting for room is work in flight: its runtime is not idle until the wake-up has run") {
    // The receiver lives in another (manual) runtime, so the two can be stepped apart: the
    // state between the receiver making room and the producer's wake-up, which a drain
    // otherwise passes through in an instant, holds still here.
    runtime prod({.loops = 1, .manual = true});
    runtime cons({.loops = 1, .manual = true});
    auto c = cons.spawn_with<consumer>(spawn_options{.capacity = 1});
    cons.run_until_idle();
    cons.send(c, stress_item{0, {}});  // full
    auto p = prod.spawn<patient_producer>(c);
    prod.send(p, go{});
    while (prod.poll() != 0) {
    }
    auto* pp = static_cast<patient_producer*>(p.get());
    REQUIRE(pp->waiting);
    CHECK_FALSE(pp->resumed);
    CHECK_FALSE(prod.idle());  // nothing queued on its loops, but a wake-up is owed
    cons.run_until_idle();     // item 0 handled; the drain sends the wake-up to the producer
    CHECK_FALSE(prod.idle());
    prod.run_until_idle();
    CHECK(pp->resumed);
    CHECK(prod.idle());
    cons.run_until_idle();
    CHECK(static_cast<consumer*>(c.get())->expected == 2);  // item 1 arrived after the wait
  }

  TEST_CASE("a fast producer against a slow consumer never holds more than the capacity") {
    const std::size_t cap = 16;
    const long n = static_cast<long>(50000 * nerve::test::scale());
    runtime rt({.loops = 2});
    auto c = rt.spawn_with<consumer>(spawn_options{.loop = 1, .capacity = cap});
    auto p = rt.spawn_on<stress_producer>(0, c, n);
    rt.send(p, go{});
    rt.synchronize();
    auto* cs = static_cast<consumer*>(c.get());
    CHECK(cs->expected == n);
    CHECK(cs->violations == 0);
    CHECK(cs->max_seen <= cap + 1);
    CHECK(static_cast<stress_producer*>(p.get())->refusals > 0);  // back-pressure really engaged
  }

  TEST_CASE("send_wait blocks an outside thread until there is room, then delivers in order") {
    const long n = static_cast<long>(20000 * nerve::test::scale());
    runtime rt({.loops = 1});
    auto c = rt.spawn_with<consumer>(spawn_options{.capacity = 4});
    for (long i = 0; i < n; ++i) rt.send_wait(c, stress_item{i, std::vector<float>(64, 1.f)});
    rt.synchronize();
    auto* cs = static_cast<consumer*>(c.get());
    CHECK(cs->expected == n);
    CHECK(cs->violations == 0);
    CHECK(cs->max_seen <= 5);
  }

  TEST_CASE("synchronize and send_wait refuse to run on a loop thread") {
    runtime rt({.loops = 1});
    struct bad : actor {
      bad() : actor("bad") {
        on<int>([this](int&) { system().synchronize(); });
      }
    };
    auto b = rt.spawn<bad>();
    rt.send(b, 1);
    CHECK_THROWS_WITH_AS(rt.synchronize(), doctest::Contains("would wait for itself"), actor_failure);
  }
}

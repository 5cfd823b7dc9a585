#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <limits>
#include <thread>
#include <utility>
#include <vector>

#include "actors/detail/mpsc_queue.hpp"
#include "actors/runtime.hpp"
#include "test_util.hpp"

using namespace nerve::actors;

namespace {
struct item : detail::mpsc_node {
  int producer = 0;
  int seq = 0;
};
}  // namespace

TEST_SUITE("actors.mailbox") {
  TEST_CASE("the MPSC queue keeps every producer's order and loses nothing") {
    detail::mpsc_queue q;
    constexpr int producers = 4, per = 20000;
    std::vector<item> items(producers * per);
    std::vector<std::thread> ts;
    for (int p = 0; p < producers; ++p)
      ts.emplace_back([&, p] {
        for (int i = 0; i < per; ++i) {
          auto& it = items[p * per + i];
          it.producer = p;
          it.seq = i;
          q.push(&it);
        }
      });
    std::vector<int> next(producers, 0);
    int got = 0;
    while (got < producers * per) {
      auto* n = q.pop();
      if (!n) {
        std::this_thread::yield();  // a push may be half done; the count says more will come
        continue;
      }
      auto* it = static_cast<item*>(n);
      REQUIRE(it->seq == next[it->producer]);
      ++next[it->producer];
      ++got;
    }
    for (auto& t : ts) t.join();
    CHECK(q.pop() == nullptr);
    for (int p = 0; p < producers; ++p) CHECK(next[p] == per);
  }

  TEST_CASE("urgent messages overtake normal ones") {
    runtime rt({.loops = 1, .manual = true});
    std::vector<int> order;
    struct rec : actor {
      explicit rec(std::vector<int>& o) : actor("rec") {
        on<int>([&o](int& v) { o.push_back(v); });
      }
    };
    auto a = rt.spawn<rec>(order);
    rt.send(a, 1);
    rt.send(a, 2);
    rt.send(a, 3);
    rt.send(a, 99, lane::urgent);
    rt.run_until_idle();
    CHECK(order == std::vector<int>{99, 1, 2, 3});
  }

  TEST_CASE("a full mailbox refuses the message and hands it back") {
    runtime rt({.loops = 1, .manual = true, .mailbox_capacity = 2});
    struct sink : actor {
      int n = 0;
      sink() : actor("sink") {
        on<std::vector<float>>([this](std::vector<float>&) { ++n; });
      }
    };
    auto a = rt.spawn<sink>();
    std::vector<float> v(10, 1.f);
    CHECK(rt.try_send(a, std::vector<float>(v)) == send_status::ok);
    CHECK(rt.try_send(a, std::vector<float>(v)) == send_status::ok);
    std::vector<float> third(7, 3.f);
    CHECK(rt.try_send(a, std::move(third)) == send_status::full);
    CHECK(third.size() == 7);  // nothing lost
    CHECK(a.get()->queued() == 2);
    // Urgent messages do not count against the capacity.
    CHECK_THROWS_WITH_AS(rt.send(a, std::vector<float>(v)), doctest::Contains("mailbox is full (capacity 2)"), send_error);
    rt.run_until_idle();
    CHECK(static_cast<sink*>(a.get())->n == 2);
    CHECK(rt.try_send(a, std::move(third)) == send_status::ok);
    rt.run_until_idle();
    CHECK(static_cast<sink*>(a.get())->n == 3);
  }

  TEST_CASE("messages are moved, never copied") {
    struct counted {
      int* copies;
      counted(int* c) : copies(c) {}
      counted(const counted& o) : copies(o.copies) { ++*copies; }
      counted(counted&&) noexcept = default;
      counted& operator=(counted&&) noexcept = default;
      counted& operator=(const counted& o) {
        copies = o.copies;
        ++*copies;
        return *this;
      }
    };
    int copies = 0;
    runtime rt({.loops = 1, .manual = true});
    struct fwd : actor {
      address next;
      int got = 0;
      explicit fwd(address n) : actor("fwd"), next(std::move(n)) {
        on<counted>([this](counted& c) {
          ++got;
          if (next) send(next, std::move(c));
        });
      }
    };
    auto last = rt.spawn<fwd>(address{});
    auto first = rt.spawn<fwd>(last);
    rt.send(first, counted{&copies});
    rt.run_until_idle();
    CHECK(static_cast<fwd*>(last.get())->got == 1);
    CHECK(copies == 0);
  }

  TEST_CASE("under contention every refused message comes back whole and every accepted one is handled once") {
    // Four outside threads race for a mailbox of 8 on a live loop: refusals happen both
    // in try_tell's early check and at the binding reservation after the envelope was
    // built; either way the payload must come back unchanged.
    constexpr std::size_t cap = 8;
    const int per = static_cast<int>(20000 * nerve::test::scale());
    runtime rt({.loops = 1, .mailbox_capacity = cap});
    struct sink : actor {
      std::vector<std::uint64_t> got;  // per producer: the sum of the accepted sequence numbers
      std::uint64_t bad = 0;
      sink() : actor("sink"), got(4, 0) {
        on<std::vector<std::uint64_t>>([this](std::vector<std::uint64_t>& v) {
          if (v.size() != 3 || v[2] != v[0] * 7 + v[1]) ++bad;
          else got[v[0]] += v[1];
          if (queued() > cap) ++bad;
        });
      }
    };
    auto a = rt.spawn<sink>();
    std::vector<std::uint64_t> sent(4, 0);
    std::atomic<std::uint64_t> refused{0}, damaged{0};
    std::vector<std::thread> ts;
    for (std::uint64_t p = 0; p < 4; ++p)
      ts.emplace_back([&, p] {
        for (int i = 0; i < per; ++i) {
          std::vector<std::uint64_t> m{p, static_cast<std::uint64_t>(i), p * 7 + static_cast<std::uint64_t>(i)};
          for (;;) {
            const auto s = rt.try_send(a, std::move(m));
            if (s == send_status::ok) break;
            refused.fetch_add(1, std::memory_order_relaxed);
            if (m.size() != 3 || m[0] != p || m[1] != static_cast<std::uint64_t>(i)) {
              damaged.fetch_add(1, std::memory_order_relaxed);
              break;
            }
            std::this_thread::yield();
          }
          sent[p] += static_cast<std::uint64_t>(i);
        }
      });
    for (auto& t : ts) t.join();
    rt.synchronize();
    auto* k = static_cast<sink*>(a.get());
    CHECK(damaged.load() == 0);
    CHECK(k->bad == 0);
    CHECK(k->got == sent);
    CHECK(refused.load() > 0);  // the mailbox really was full at times
    CHECK(a.get()->queued() == 0);
  }

  TEST_CASE("a message refused after its envelope was built is handed back whole") {
    // try_tell's early check passes (room for one), then, while the payload moves into its
    // envelope, another sender takes the last place: the binding reservation refuses, and
    // the payload must come back to the caller. The move blocks on an event, so the
    // interleaving is forced, not hoped for.
    struct gated {
      std::vector<int> data;
      nerve::test::event* entered = nullptr;
      nerve::test::event* go = nullptr;
      gated(std::vector<int> d, nerve::test::event* e, nerve::test::event* g) : data(std::move(d)), entered(e), go(g) {}
      gated(gated&& o) noexcept : data(std::move(o.data)), entered(std::exchange(o.entered, nullptr)), go(std::exchange(o.go, nullptr)) {
        if (entered) {
          entered->set();
          go->wait();
        }
      }
      gated& operator=(gated&& o) noexcept {
        data = std::move(o.data);
        entered = std::exchange(o.entered, nullptr);
        go = std::exchange(o.go, nullptr);
        return *this;
      }
    };
    runtime rt({.loops = 1, .manual = true, .mailbox_capacity = 1});
    struct sink : actor {
      int n = 0;
      sink() : actor("sink") {
        on<gated>([this](gated&) { ++n; });
        on<int>([this](int&) { ++n; });
      }
    };
    auto a = rt.spawn<sink>();
    nerve::test::event entered, go;
    gated m({1, 2, 3}, &entered, &go);
    send_status status = send_status::ok;
    std::thread t([&] { status = rt.try_send(a, std::move(m)); });
    entered.wait();                               // past the early check, moving into the envelope
    CHECK(rt.try_send(a, 7) == send_status::ok);  // takes the only place
    go.set();
    t.join();
    CHECK(status == send_status::full);
    CHECK(m.data == std::vector<int>{1, 2, 3});   // handed back
    CHECK(a.get()->queued() == 1);
    rt.run_until_idle();
    CHECK(static_cast<sink*>(a.get())->n == 1);
  }

  TEST_CASE("a handler may send to its own full mailbox: taking a message frees its room") {
    runtime rt({.loops = 1, .manual = true, .mailbox_capacity = 1});
    struct self_loop : actor {
      int left = 1000, handled = 0;
      self_loop() : actor("self-loop") {
        on<int>([this](int& v) {
          ++handled;
          if (--left > 0) send(self(), v + 1);  // the mailbox held this message a moment ago
        });
      }
    };
    auto a = rt.spawn<self_loop>();
    rt.send(a, 0);
    rt.run_until_idle();
    CHECK(static_cast<self_loop*>(a.get())->handled == 1000);
    CHECK(rt.error() == nullptr);
  }

  TEST_CASE("small, large and over-aligned messages all arrive intact") {
    // Envelopes up to 256 bytes come from per-thread free lists; larger and over-aligned
    // ones from the global allocator. All three kinds cross loops here, so blocks freed on
    // one thread are reused by it for messages the other allocated.
    struct alignas(64) wide {
      std::uint64_t v[8];
    };
    struct big {
      std::uint64_t v[100];
    };
    runtime rt({.loops = 2});
    struct check_sink : actor {
      std::uint64_t ok = 0, bad = 0;
      check_sink() : actor("sink") {
        on<std::uint64_t>([this](std::uint64_t& v) { ++(v % 97 == 13 ? ok : bad); });
        on<wide>([this](wide& w) {
          const bool aligned = reinterpret_cast<std::uintptr_t>(&w) % 64 == 0;
          ++(aligned && w.v[0] == w.v[7] ? ok : bad);
        });
        on<big>([this](big& b) { ++(b.v[0] == b.v[99] ? ok : bad); });
      }
    };
    struct source : actor {
      address to;
      explicit source(address t) : actor("source"), to(std::move(t)) {
        on<int>([this](int& n) {
          for (int i = 0; i < n; ++i) {
            send(to, std::uint64_t{97} * static_cast<std::uint64_t>(i) + 13);
            wide w{};
            w.v[0] = w.v[7] = static_cast<std::uint64_t>(i);
            send(to, w);
            big b{};
            b.v[0] = b.v[99] = static_cast<std::uint64_t>(i);
            send(to, b);
          }
        });
      }
    };
    auto sink_a = rt.spawn_with<check_sink>({.loop = 1, .capacity = 1 << 16, .supervisor = {}});
    auto src = rt.spawn_with<source>({.loop = 0, .capacity = 0, .supervisor = {}}, sink_a);
    for (int round = 0; round < 10; ++round) rt.send(src, 1000);
    rt.synchronize();
    REQUIRE(rt.error() == nullptr);
    CHECK(static_cast<check_sink*>(sink_a.get())->ok == 30000);
    CHECK(static_cast<check_sink*>(sink_a.get())->bad == 0);
  }

  TEST_CASE("a capacity beyond the 32-bit counts is clamped, not wrapped") {
    runtime rt({.loops = 1, .manual = true, .mailbox_capacity = std::numeric_limits<std::size_t>::max()});
    struct sink : actor {
      int n = 0;
      sink() : actor("sink") {
        on<int>([this](int&) { ++n; });
      }
    };
    auto a = rt.spawn<sink>();
    CHECK(a.get()->capacity() == (std::size_t{1} << 31) - 1);
    for (int i = 0; i < 5000; ++i) REQUIRE(rt.try_send(a, i) == send_status::ok);
    CHECK(a.get()->queued() == 5000);
    rt.run_until_idle();
    CHECK(static_cast<sink*>(a.get())->n == 5000);
    CHECK(a.get()->queued() == 0);
  }
}

#include <doctest/doctest.h>

#include <thread>
#include <vector>

#include "actors/detail/mpsc_queue.hpp"
#include "actors/runtime.hpp"

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
}

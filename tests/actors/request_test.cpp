#include <doctest/doctest.h>

#include <latch>

#include "actors/runtime.hpp"
#include "test_util.hpp"

using namespace nerve::actors;
using namespace std::chrono_literals;

namespace {
struct square {
  int x;
};
struct hold {
  int x;
};

struct server : actor {
  std::latch* gate;
  explicit server(std::latch* g) : actor("server"), gate(g) {
    on<square>([](square& s) { return s.x * s.x; });
    on<hold>([this](hold& h) {
      gate->wait();  // blocks this loop until the test opens the gate (an event, not a sleep)
      return h.x;
    });
  }
};

struct client : actor {
  address srv;
  std::promise<std::string> outcome;
  int answers = 0;
  explicit client(address server) : actor("client"), srv(std::move(server)) {
    on<square>([this](square& s) {
      request<int>(srv, square{s.x}, 5s, [this](result<int> r) {
        ++answers;
        outcome.set_value(r ? std::to_string(*r) : "error");
      });
    });
    on<hold>([this](hold& h) {
      request<int>(srv, hold{h.x}, 20ms, [this](result<int> r) {
        ++answers;
        try {
          r.value();
          outcome.set_value("answer");
        } catch (const request_timeout& e) {
          outcome.set_value(std::string("timeout: ") + e.what());
        }
      });
    });
  }
};
}  // namespace

TEST_SUITE("actors.request") {
  TEST_CASE("an actor's request gets the handler's return value") {
    std::latch gate(0);
    runtime rt({.loops = 2});
    auto s = rt.spawn_on<server>(0, &gate);
    auto c = rt.spawn_on<client>(1, s);
    auto f = static_cast<client*>(c.get())->outcome.get_future();
    rt.send(c, square{7});
    CHECK(f.get() == "49");
    rt.synchronize();
    CHECK(static_cast<client*>(c.get())->answers == 1);
  }

  TEST_CASE("a request times out when no answer comes in time, and the late answer is dropped") {
    std::latch gate(1);
    runtime rt({.loops = 2});
    auto s = rt.spawn_on<server>(0, &gate);
    auto c = rt.spawn_on<client>(1, s);
    auto f = static_cast<client*>(c.get())->outcome.get_future();
    rt.send(c, hold{3});
    CHECK(f.get() == "timeout: request to 'server' timed out");
    gate.count_down();  // now the server answers, too late
    rt.synchronize();
    CHECK(static_cast<client*>(c.get())->answers == 1);
  }

  TEST_CASE("ask from outside: value, timeout, and a stopped receiver") {
    std::latch gate(1);
    runtime rt({.loops = 1});
    auto s = rt.spawn<server>(&gate);
    CHECK(rt.ask<int>(s, square{12}, 5s).get() == 144);
    auto slow = rt.ask<int>(s, hold{1}, 10ms);
    CHECK_THROWS_AS(slow.get(), request_timeout);
    gate.count_down();
    rt.synchronize();
    rt.stop(s);
    rt.synchronize();
    CHECK_THROWS_WITH_AS(rt.ask<int>(s, square{2}, 1s).get(), "send to stopped actor 'server'", send_error);
  }

  TEST_CASE("a request to an actor without a handler fails the receiver and the requester hears of it") {
    runtime rt({.loops = 1});
    struct mute : actor {
      mute() : actor("mute") {}
    };
    auto m = rt.spawn<mute>();
    auto f = rt.ask<int>(m, square{2}, 5s);
    CHECK_THROWS_WITH_AS(f.get(), "actor 'mute' has no handler for message 'square'", wiring_error);
    CHECK_THROWS_AS(rt.synchronize(), actor_failure);
  }
}

namespace {
struct later {
  int x;
};
struct release {};
/// Answers `later` requests only when told to (a deferred reply).
struct procrastinator : actor {
  std::vector<deferred_reply<int>> owed;
  std::vector<int> xs;
  procrastinator() : actor("procrastinator") {
    on<later>([this](later& l) {
      owed.push_back(defer_reply<int>());
      xs.push_back(l.x);
    });
    on<release>([this](release&) {
      for (std::size_t i = 0; i < owed.size(); ++i) owed[i].deliver(xs[i] + 1);
      owed.clear();
    });
    on<square>([](square& s) { return std::to_string(s.x); });  // a string, not an int
  }
};
}  // namespace

TEST_SUITE("actors.request") {
  TEST_CASE("a handler can answer later with a deferred reply") {
    runtime rt({.loops = 2});
    auto p = rt.spawn<procrastinator>();
    auto a = rt.ask<int>(p, later{1}, 5s);
    auto b = rt.ask<int>(p, later{2}, 5s);
    rt.synchronize();
    CHECK(a.wait_for(0s) == std::future_status::timeout);  // not answered yet
    rt.send(p, release{});
    CHECK(a.get() == 2);
    CHECK(b.get() == 3);
  }

  TEST_CASE("an answer of the wrong type is a wiring error, and submit takes any answer") {
    runtime rt({.loops = 1});
    auto p = rt.spawn<procrastinator>();
    rt.submit(p, square{4}).get();  // returns a string; submit only waits for the handler
    auto f = rt.ask<int>(p, square{4}, 5s);
    CHECK_THROWS_WITH_AS(f.get(), "actor 'procrastinator' answers a request with 'basic_string<char>' but the requester waits for 'int'",
                         wiring_error);
  }

  TEST_CASE("a deferred reply dropped unanswered fails the request instead of hanging") {
    runtime rt({.loops = 1});
    auto p = rt.spawn<procrastinator>();
    auto a = rt.ask<int>(p, later{1}, 5s);
    rt.synchronize();
    rt.shutdown();
    p = address{};  // the last reference: the actor and the replies it owes are destroyed
    CHECK_THROWS_AS(a.get(), wiring_error);
  }
}

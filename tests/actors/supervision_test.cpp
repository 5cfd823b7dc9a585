#include <doctest/doctest.h>

#include <chrono>

#include "actors/runtime.hpp"
#include "test_util.hpp"

using namespace nerve::actors;

namespace {
struct boom {
  int at;
};

struct worker : actor {
  int handled = 0;
  worker() : actor("worker") {
    on<boom>([this](boom& b) {
      if (b.at == handled) throw std::runtime_error("bad input at " + std::to_string(b.at));
      ++handled;
    });
  }
};

struct boss : actor {
  std::promise<std::string> heard;
  boss() : actor("boss") {
    on<failure>([this](failure& f) {
      try {
        std::rethrow_exception(f.error);
      } catch (const std::exception& e) {
        heard.set_value(f.name + ": " + e.what());
      }
    });
  }
};
}  // namespace

TEST_SUITE("actors.supervision") {
  TEST_CASE("a throwing handler ends the run with that error, within a bounded time") {
    runtime rt({.loops = 2});
    std::vector<address> ws;
    for (int i = 0; i < 8; ++i) ws.push_back(rt.spawn<worker>());
    for (int round = 0; round < 1000; ++round)
      for (auto& w : ws) (void)rt.try_send(w, boom{round == 500 && w == ws[3] ? 500 : -1});
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH_AS(rt.synchronize(), "actor 'worker' failed: bad input at 500", actor_failure);
    const auto took = std::chrono::steady_clock::now() - t0;
    CHECK(took < std::chrono::seconds(1));
    // The run ended: every actor was stopped and refuses further messages.
    for (auto& w : ws) CHECK(rt.try_send(w, boom{-1}) == send_status::closed);
    rt.shutdown();
    CHECK(rt.error() != nullptr);
  }

  TEST_CASE("a supervisor receives its child's failure as a message") {
    runtime rt({.loops = 2});
    auto b = rt.spawn<boss>();
    auto w = rt.spawn_with<worker>(spawn_options{.supervisor = b});
    auto heard = static_cast<boss*>(b.get())->heard.get_future();
    rt.send(w, boom{-1});
    rt.send(w, boom{1});
    CHECK(heard.get() == "worker: actor 'worker' failed: bad input at 1");
    rt.synchronize();  // the supervisor handled it: the run goes on
    CHECK(rt.error() == nullptr);
    CHECK(w.stopped());
    CHECK_FALSE(b.stopped());
  }

  TEST_CASE("a supervisor without a failure handler escalates to the runtime") {
    runtime rt({.loops = 1});
    struct bystander : actor {};
    auto b = rt.spawn<bystander>();
    auto w = rt.spawn_with<worker>(spawn_options{.supervisor = b});
    rt.send(w, boom{0});
    CHECK_THROWS_WITH_AS(rt.synchronize(), "actor 'worker' failed: bad input at 0", actor_failure);
    CHECK(b.stopped());
  }

  TEST_CASE("an unknown message kind is a wiring error naming the actor and the kind") {
    runtime rt({.loops = 1, .manual = true});
    auto w = rt.spawn<worker>();
    rt.send(w, 3.5);
    CHECK_THROWS_WITH_AS(rt.synchronize(), "actor 'worker' failed: actor 'worker' has no handler for message 'double'",
                         actor_failure);
  }

  TEST_CASE("on_failure is told once, with the first error") {
    runtime rt({.loops = 2});
    std::atomic<int> calls{0};
    rt.on_failure([&](std::exception_ptr) { calls.fetch_add(1); });
    std::vector<address> ws;
    for (int i = 0; i < 4; ++i) ws.push_back(rt.spawn<worker>());
    for (auto& w : ws) rt.send(w, boom{0});
    CHECK_THROWS_AS(rt.synchronize(), actor_failure);
    CHECK(calls.load() == 1);
  }
}

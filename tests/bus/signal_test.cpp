#include <doctest/doctest.h>

#include "actors/runtime.hpp"
#include "bus/signal.hpp"

using namespace nerve::actors;
using namespace nerve::bus;

namespace {
struct reading {
  int value;
};

struct sensor : actor {
  nerve::bus::signal<reading> out{*this, "out"};
  sensor() : actor("sensor") {
    on<int>([this](int& v) { out.emit(reading{v}); });
  }
};

struct display : actor {
  std::vector<int> got;
  explicit display(std::string n) : actor(std::move(n)) {
    on<reading>([this](reading& r) { got.push_back(r.value); });
  }
};

struct deaf : actor {
  deaf() : actor("deaf") {
    on<double>([](double&) {});
  }
};
}  // namespace

TEST_SUITE("bus.signal") {
  TEST_CASE("emitting delivers to every subscriber, in order") {
    runtime rt({.loops = 2, .manual = true});
    auto s = rt.spawn<sensor>();
    auto a = rt.spawn<display>("a");
    auto b = rt.spawn<display>("b");
    auto& sig = static_cast<sensor*>(s.get())->out;
    sig.subscribe(a);
    sig.subscribe(b);
    CHECK(sig.subscribers() == 2);
    for (int i = 0; i < 5; ++i) rt.send(s, i);
    rt.run_until_idle();
    CHECK(static_cast<display*>(a.get())->got == std::vector<int>{0, 1, 2, 3, 4});
    CHECK(static_cast<display*>(b.get())->got == std::vector<int>{0, 1, 2, 3, 4});
  }

  TEST_CASE("subscribing an actor that cannot handle the signal's type is a wiring error") {
    runtime rt({.loops = 1, .manual = true});
    auto s = rt.spawn<sensor>();
    auto d = rt.spawn<deaf>();
    auto& sig = static_cast<sensor*>(s.get())->out;
    CHECK_THROWS_WITH_AS(sig.subscribe(d), "signal 'sensor.out' carries 'reading' but actor 'deaf' has no handler for it",
                         wiring_error);
    auto a = rt.spawn<display>("a");
    sig.subscribe(a);
    CHECK_THROWS_WITH_AS(sig.subscribe(a), "signal 'sensor.out': actor 'a' is already subscribed", wiring_error);
  }

  TEST_CASE("emitting on a signal with no subscribers is an error, not a silent drop") {
    runtime rt({.loops = 1, .manual = true});
    auto s = rt.spawn<sensor>();
    rt.send(s, 1);
    CHECK_THROWS_WITH_AS(rt.synchronize(),
                         "actor 'sensor' failed: signal 'sensor.out' emitted 'reading' but has no subscribers",
                         actor_failure);
  }
}

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

// A value that knows its port and counts how it was duplicated.
struct edge_value {
  int value = 0;
  std::uint32_t port = 99;
  int clones = 0;
  edge_value clone() const { return edge_value{value, port, clones + 1}; }
};

struct edge_source : actor {
  nerve::bus::signal<edge_value> out{*this, "out"};
  edge_source() : actor("source") {
    on<int>([this](int& v) { out.emit(edge_value{v}); });
  }
};

struct edge_sink : actor {
  std::vector<std::pair<std::uint32_t, int>> got;  // (port, value)
  int clones = 0;
  edge_sink() : actor("sink") {
    on<edge_value>([this](edge_value& v) {
      got.emplace_back(v.port, v.value);
      clones += v.clones;
    });
  }
};

// Stands in for a transport: keeps what it is handed, as a wire would.
struct recording_endpoint : nerve::bus::endpoint<edge_value> {
  std::vector<std::pair<std::uint32_t, int>> taken;
  void deliver(actor&, edge_value&& v) override { taken.emplace_back(v.port, v.value); }
  std::string name() const override { return "far end"; }
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
    CHECK_THROWS_WITH_AS(sig.subscribe(a), "signal 'sensor.out': actor 'a' is already subscribed on port 0", wiring_error);
  }

  TEST_CASE("emitting on a signal with no subscribers is an error, not a silent drop") {
    runtime rt({.loops = 1, .manual = true});
    auto s = rt.spawn<sensor>();
    rt.send(s, 1);
    CHECK_THROWS_WITH_AS(rt.synchronize(),
                         "actor 'sensor' failed: signal 'sensor.out' emitted 'reading' but has no subscribers",
                         actor_failure);
  }

  TEST_CASE("a subscription is an edge: one actor on two ports gets each value on both, stamped") {
    runtime rt({.loops = 1, .manual = true});
    auto src = rt.spawn<edge_source>();
    auto sink = rt.spawn<edge_sink>();
    auto& sig = static_cast<edge_source*>(src.get())->out;
    sig.subscribe(sink, 0);
    sig.subscribe(sink, 1);
    CHECK(sig.ports() == std::vector<std::uint32_t>{0, 1});
    rt.send(src, 7);
    rt.send(src, 8);
    rt.run_until_idle();
    auto* s = static_cast<edge_sink*>(sink.get());
    CHECK(s->got == std::vector<std::pair<std::uint32_t, int>>{{0, 7}, {1, 7}, {0, 8}, {1, 8}});
    CHECK(s->clones == 2);  // a clone for all but the last subscriber, which gets the value moved
    CHECK(sig.deliveries() == 4);
  }

  TEST_CASE("an endpoint subscriber takes its values through the transport seam, counted like local ones") {
    runtime rt({.loops = 1, .manual = true});
    auto src = rt.spawn<edge_source>();
    auto sink = rt.spawn<edge_sink>();
    auto far = std::make_shared<recording_endpoint>();
    auto& sig = static_cast<edge_source*>(src.get())->out;
    sig.subscribe(sink, 2);
    sig.subscribe(far, 5);
    CHECK_THROWS_AS(sig.subscribe(std::shared_ptr<nerve::bus::endpoint<edge_value>>{}), wiring_error);
    for (int i = 0; i < 3; ++i) rt.send(src, i);
    rt.run_until_idle();
    CHECK(static_cast<edge_sink*>(sink.get())->got == std::vector<std::pair<std::uint32_t, int>>{{2, 0}, {2, 1}, {2, 2}});
    CHECK(far->taken == std::vector<std::pair<std::uint32_t, int>>{{5, 0}, {5, 1}, {5, 2}});
    CHECK(sig.deliveries() == 6);
  }
}

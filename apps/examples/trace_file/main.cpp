// Recording what the actors did and writing it to a trace file.
//
//   main thread ──number──► squarer ──number──► summer     (1000 numbers)
//                           (loop 0)            (loop 1)
//   every send, receive and handler run is recorded ──► trace.json
//
// The file is the Chrome trace event format: open it in Perfetto (ui.perfetto.dev)
// or summarise it with `nerve-trace summary trace.json` (docs/trace.md). Here the
// example reads it back with nlohmann::json and counts the events.
#include <cstdio>
#include <fstream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "actors/runtime.hpp"

namespace na = nerve::actors;

struct number { long value; };
struct total {};

struct summer : na::actor {
  long sum = 0;
  summer() : na::actor("summer") {
    on<number>([this](number& n) { sum += n.value; });
    on<total>([this](total&) { return sum; });
  }
};
struct squarer : na::actor {
  na::address next;
  explicit squarer(na::address n) : na::actor("squarer"), next(std::move(n)) {
    on<number>([this](number& n) { send(next, number{n.value * n.value}); });
  }
};

int main() {
  na::runtime rt({.loops = 2, .record = true});  // or rt.trace().enable() later
  auto sink = rt.spawn_on<summer>(1);
  auto square = rt.spawn_on<squarer>(0, sink);
  for (long i = 1; i <= 1000; ++i) rt.send_wait(square, number{i});
  rt.synchronize();
  const long sum = rt.ask<long>(sink, total{}, std::chrono::seconds(1)).get();
  rt.trace().enable(false);
  rt.write_trace("trace.json");

  std::ifstream in("trace.json");
  const auto trace = nlohmann::json::parse(in);
  std::map<std::string, int> phases;
  for (const auto& e : trace.at("traceEvents")) ++phases[e.value("ph", "?")];
  std::printf("sum of squares 1..1000 = %ld\ntrace.json: %zu events (", sum, trace.at("traceEvents").size());
  for (const auto& [ph, n] : phases) std::printf(" %s:%d", ph.c_str(), n);
  std::printf(" )\n");
  return sum == 333833500 && phases["X"] >= 1000 ? 0 : 1;  // a span per handler run at least
}

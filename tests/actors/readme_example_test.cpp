// The README's example, compiled and run; a test checks that the README shows this code.
#include <doctest/doctest.h>

#include <fstream>
#include <sstream>
#include <string>

// [readme-example]
#include "actors/runtime.hpp"
using namespace nerve::actors;

struct add_one { int x; };                 // a message: any movable type
struct total { int sum = 0; };

struct adder : actor {                     // handlers run on the actor's loop, one at a time
  address next;
  explicit adder(address n) : actor("adder"), next(std::move(n)) {
    on<add_one>([this](add_one& m) { send(next, add_one{m.x + 1}); });
  }
};
struct summer : actor {
  int sum = 0;
  summer() : actor("summer") {
    on<add_one>([this](add_one& m) { sum += m.x; });
    on<total>([this](total&) { return sum; });   // a return value answers a request
  }
};

int run_example() {
  runtime rt({.loops = 2});                          // two event loops, two threads
  auto sink = rt.spawn_on<summer>(1);                // placed on loop 1
  auto first = rt.spawn_on<adder>(0, sink);          // on loop 0, wired to the sink
  for (int i = 0; i < 1000; ++i) rt.send_wait(first, add_one{i});  // waits if full
  rt.synchronize();                                  // every message handled
  return rt.ask<int>(sink, total{}, std::chrono::seconds(1)).get();  // 500500
}
// [readme-example]

TEST_CASE("the README example runs and sums 1..1000") { CHECK(run_example() == 500500); }

TEST_CASE("the README shows the example as compiled here") {
  auto slurp = [](const std::string& path) {
    std::ifstream f(path);
    REQUIRE_MESSAGE(f.good(), "cannot open " << path);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  };
  const std::string marker = "// [readme-example]\n";
  const std::string self = slurp(NERVE_SOURCE_DIR "/tests/actors/readme_example_test.cpp");
  const auto a = self.find(marker) + marker.size();
  const auto b = self.find(marker, a);
  const std::string code = self.substr(a, b - a);
  CHECK_MESSAGE(slurp(NERVE_SOURCE_DIR "/README.md").find(code) != std::string::npos,
                "README.md's example differs from tests/actors/readme_example_test.cpp");
}

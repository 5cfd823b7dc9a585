#include <doctest/doctest.h>

#include <numeric>
#include <random>

#include "actors/runtime.hpp"
#include "bus/all_reduce.hpp"
#include "bus/group.hpp"

using namespace nerve::actors;
using namespace nerve::bus;
using namespace std::chrono_literals;

namespace {
struct part {
  int value;
};
struct ask_rank {};

struct member : actor {
  int rank;
  std::vector<int> got;
  std::vector<std::vector<float>> sums;
  std::vector<std::uint64_t> keys;
  explicit member(int r_) : actor("member-" + std::to_string(r_)), rank(r_) {
    on<part>([this](part& p) { got.push_back(p.value); });
    on<ask_rank>([this](ask_rank&) { return rank * 10; });
    on<reduced>([this](reduced& r) {
      keys.push_back(r.key);
      sums.push_back(*r.sum);
    });
  }
};

/// Sends a contribution of its own when told which round.
struct contributor : actor {
  address reducer;
  unsigned rank;
  std::vector<float> data;
  contributor(address r, unsigned rk, std::vector<float> d)
      : actor("contributor-" + std::to_string(rk)), reducer(std::move(r)), rank(rk), data(std::move(d)) {
    on<std::uint64_t>([this](std::uint64_t& key) { send(reducer, contribution{key, rank, data}); });
  }
};

struct gatherer : actor {
  group g;
  std::promise<std::vector<int>> out;
  explicit gatherer(group gr) : actor("gatherer"), g(std::move(gr)) {
    on<int>([this](int&) {
      g.gather<int>(*this, ask_rank{}, 1s, [this](std::vector<result<int>> rs) {
        std::vector<int> v;
        for (auto& r : rs) v.push_back(r.value());
        out.set_value(v);
      });
    });
  }
};
}  // namespace

TEST_SUITE("bus.group") {
  TEST_CASE("broadcast, scatter and gather reach every member in rank order") {
    runtime rt({.loops = 2});
    group g("replicas");
    for (int r = 0; r < 4; ++r) g.add(rt.spawn<member>(r));
    g.broadcast(rt, part{7});
    g.scatter(rt, std::vector<part>{{0}, {1}, {2}, {3}});
    rt.synchronize();
    for (int r = 0; r < 4; ++r) CHECK(static_cast<member*>(g[r].get())->got == std::vector<int>{7, r});
    CHECK(g.gather<int>(rt, ask_rank{}, 1s) == std::vector<int>{0, 10, 20, 30});
    auto ga = rt.spawn<gatherer>(g);
    auto f = static_cast<gatherer*>(ga.get())->out.get_future();
    rt.send(ga, 1);
    CHECK(f.get() == std::vector<int>{0, 10, 20, 30});
    CHECK_THROWS_WITH_AS(g.scatter(rt, std::vector<part>{{0}}), "group 'replicas': scatter of 1 parts to 4 members",
                         wiring_error);
    CHECK_THROWS_AS(g.add(g[0]), wiring_error);
  }

  TEST_CASE("all-reduce sums in rank order: the same bits whatever the arrival order") {
    const int ranks = 4, len = 1000, rounds = 20;
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    std::vector<std::vector<float>> data(ranks, std::vector<float>(len));
    for (auto& d : data)
      for (auto& x : d) x = u(rng);
    std::vector<float> expect(data[0]);
    for (int r = 1; r < ranks; ++r)
      for (int i = 0; i < len; ++i) expect[i] += data[r][i];

    runtime rt({.loops = 2});
    group g("replicas");
    for (int r = 0; r < ranks; ++r) g.add(rt.spawn<member>(r));
    auto red = rt.spawn<all_reduce>("allreduce", g);
    std::vector<address> cs;
    for (int r = 0; r < ranks; ++r) cs.push_back(rt.spawn<contributor>(red, static_cast<unsigned>(r), data[r]));
    // Rounds overlap: all contributors are told about every round at once, in scrambled orders.
    for (std::uint64_t k = 0; k < rounds; ++k) {
      std::vector<int> order(ranks);
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      for (int r : order) rt.send(cs[r], std::uint64_t{k});
    }
    rt.synchronize();
    CHECK(static_cast<all_reduce*>(red.get())->rounds() == rounds);
    for (int r = 0; r < ranks; ++r) {
      auto* m = static_cast<member*>(g[r].get());
      REQUIRE(m->sums.size() == rounds);
      for (auto& s : m->sums) CHECK(s == expect);  // bitwise
    }
  }

  TEST_CASE("all-reduce refuses mismatched buffers and double contributions") {
    runtime rt({.loops = 1, .manual = true});
    group g("pair");
    g.add(rt.spawn<member>(0));
    g.add(rt.spawn<member>(1));
    auto red = rt.spawn<all_reduce>("allreduce", g);
    rt.send(red, contribution{0, 0, {1.f, 2.f}});
    rt.send(red, contribution{0, 1, {1.f}});
    CHECK_THROWS_WITH_AS(rt.synchronize(), doctest::Contains("round 0 got buffers of 2 and 1 floats"), actor_failure);
  }

  TEST_CASE("all-reduce over members that cannot take the result is a wiring error") {
    runtime rt({.loops = 1, .manual = true});
    struct other : actor {};
    group g("bad", {rt.spawn<other>()});
    CHECK_THROWS_WITH_AS(rt.spawn<all_reduce>("allreduce", g), doctest::Contains("has no handler for 'reduced'"),
                         wiring_error);
  }
}

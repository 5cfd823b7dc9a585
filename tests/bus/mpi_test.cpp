// The bus across processes: run under `mpirun -np N` (N = 2 and 3 in ctest). Every rank
// runs every case; a failed check on any rank fails the job.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <future>
#include <map>
#include <memory>

#include "actors/runtime.hpp"
#include "bus/all_reduce.hpp"
#include "bus/group.hpp"
#include "bus/mpi/all_reduce.hpp"
#include "bus/mpi/transport.hpp"
#include "bus/signal.hpp"
#include "layers/wire/mpi_codecs.hpp"

using namespace nerve::actors;
namespace mpi = nerve::bus::mpi;

namespace {

mpi::transport* world = nullptr;

// A message with a contiguous payload, as a layer's activations are.
struct blob {
  static constexpr std::string_view kind = "blob";
  std::int32_t from = 0;
  std::int64_t seq = 0;
  std::uint32_t port = 0;
  std::vector<float> data;
};

}  // namespace

// How a blob crosses the wire: its fixed fields in the frame, its floats in place.
template <>
struct nerve::bus::mpi::codec<blob> {
  static void write(const blob& b, std::vector<std::byte>& frame) {
    frame_writer{frame}.put(b.from).put(b.seq).put(b.port).put(std::uint64_t(b.data.size()));
  }
  static std::span<const std::byte> payload(const blob& b) { return std::as_bytes(std::span(b.data)); }
  static blob read(std::span<const std::byte> frame, std::span<std::byte>& payload) {
    frame_reader r{frame};
    blob b;
    b.from = r.get<std::int32_t>();
    b.seq = r.get<std::int64_t>();
    b.port = r.get<std::uint32_t>();
    b.data.resize(r.get<std::uint64_t>());
    payload = std::as_writable_bytes(std::span(b.data));  // the heap buffer: moving b keeps it
    return b;
  }
};

namespace {

// The payload of message `seq` from `rank`: sizes from empty to 1 Mi floats (4 MiB, past
// Open MPI's eager limit, so the rendezvous path is covered), contents that name both.
std::vector<float> pattern(int rank, std::int64_t seq) {
  static const std::size_t sizes[] = {0, 1, 7, 16384, 1u << 20, 3};
  const std::size_t n = sizes[std::size_t(seq) % std::size(sizes)];
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = float(rank * 1000003 + seq * 31 + std::int64_t(i % 4096));
  return v;
}

// A layer message's tensor for micro-batch k from `rank`: k rows of a 3×4×5 sample (k = 0:
// none), values that name both.
nerve::layers::tensor layer_tensor(int rank, std::int64_t k) {
  nerve::layers::tensor t(k, nerve::layers::shape({3, 4, 5}));
  for (std::int64_t i = 0; i < t.size(); ++i) t.data()[i] = float(rank) * 1e4f + float(k) * 100.f + float(i) * 1e-3f;
  return t;
}

struct sender : actor {
  nerve::bus::signal<blob> out{*this, "out"};
  sender() : actor("sender") {
    on<std::int64_t>([this](std::int64_t& seq) {
      out.emit(blob{world->rank(), seq, 0, pattern(world->rank(), seq)});
    });
  }
};

// Holds the receiver's loop until `gate` opens.
struct hold {
  std::shared_future<void> gate;
};

// Checks order and contents per source; fulfils `done` after `expected` messages.
struct collector : actor {
  std::map<int, std::int64_t> next;  // per source: the seq it must send next
  std::int64_t got = 0, expected = 0, bad = 0;
  std::uint32_t port_seen = 0;
  std::promise<void> done;
  explicit collector(std::int64_t n) : actor("collector"), expected(n) {
    on<blob>([this](blob& b) {
      auto& want = next[b.from];
      if (b.seq != want || b.data != pattern(b.from, b.seq)) ++bad;
      want = b.seq + 1;
      port_seen = b.port;
      if (++got == expected) done.set_value();
    });
    on<hold>([](hold& h) { h.gate.wait(); });
  }
};

}  // namespace

TEST_SUITE("bus.mpi") {
  TEST_CASE("messages cross to the next rank whole, in order, counted exactly") {
    const int n = world->size(), me = world->rank();
    const int to = (me + 1) % n, from = (me + n - 1) % n;
    constexpr std::int64_t count = 600;
    runtime rt({.loops = 1});
    auto c = rt.spawn<collector>(count);
    auto s = rt.spawn<sender>();
    auto& col = *static_cast<collector*>(c.get());
    auto f = col.done.get_future();
    world->listen<blob>(/*channel*/ 1, c);
    auto& out = static_cast<sender*>(s.get())->out;
    out.subscribe(std::make_shared<mpi::remote<blob>>(*world, to, 1), /*port*/ 5);
    const auto before = world->stats();
    world->barrier();  // every rank listens before any sends

    for (std::int64_t k = 0; k < count; ++k) rt.send(s, k);
    while (f.wait_for(std::chrono::milliseconds(20)) != std::future_status::ready) world->check();
    world->flush();
    world->barrier();

    CHECK(col.got == count);
    CHECK(col.bad == 0);
    CHECK(col.next.size() == 1);
    CHECK(col.next.begin()->first == from);
    CHECK(col.port_seen == 5);  // the bus stamped the port before the value left
    CHECK(out.deliveries() == std::uint64_t(count));
    const auto after = world->stats();
    CHECK(after.sent - before.sent == std::uint64_t(count));
    CHECK(after.received - before.received == std::uint64_t(count));
    std::uint64_t bytes = 0;
    for (std::int64_t k = 0; k < count; ++k) bytes += pattern(me, k).size() * sizeof(float);
    CHECK(after.bytes_sent - before.bytes_sent == bytes);
    rt.shutdown();
  }

  TEST_CASE("a full mailbox holds deliveries back, loses none, keeps their order") {
    // Rank 0 sends 200 messages to a collector on rank 1 whose mailbox holds 4 and whose
    // first handler run waits until the transport has met the full mailbox: it must retry,
    // not drop, and keep the order.
    if (world->size() < 2) return;
    const int me = world->rank();
    constexpr std::int64_t count = 200;
    runtime rt({.loops = 1, .mailbox_capacity = 4});
    std::promise<void> open;
    std::shared_future<void> gate = open.get_future().share();
    auto c = rt.spawn<collector>(me == 1 ? count : 0);
    auto& col = *static_cast<collector*>(c.get());
    auto s = rt.spawn<sender>();
    auto f = col.done.get_future();
    world->listen<blob>(2, c);
    auto& out = static_cast<sender*>(s.get())->out;
    if (me == 0) out.subscribe(std::make_shared<mpi::remote<blob>>(*world, 1, 2));
    const auto before = world->stats();  // before the barrier: rank 0 sends right after it
    // The collector's loop waits from before the barrier: sent after it, the hold could meet
    // a mailbox the poller had already filled (and `send` throws on a full one).
    if (me == 1) rt.send(c, hold{gate});
    world->barrier();
    if (me == 0) {
      for (std::int64_t k = 0; k < count; ++k) rt.send_wait(s, k);
      world->flush();
    }
    if (me == 1) {
      while (world->stats().full_retries == before.full_retries) world->check();
      open.set_value();
      while (f.wait_for(std::chrono::milliseconds(20)) != std::future_status::ready) world->check();
    } else {
      open.set_value();
    }
    world->barrier();
    if (me == 1) {
      CHECK(col.got == count);
      CHECK(col.bad == 0);
      CHECK(world->stats().received - before.received == std::uint64_t(count));
      CHECK(world->stats().full_retries > before.full_retries);
    }
    rt.shutdown();
  }
}

TEST_SUITE("bus.mpi.setup") {
  TEST_CASE("agree passes equal values and names every rank that differs") {
    CHECK_NOTHROW(world->agree("the model", "mlp"));
    if (world->size() < 2) return;
    const std::string mine = world->rank() == 1 ? "lenet" : "mlp";
    try {
      world->agree("the model", mine);
      FAIL("the ranks differ: agree must throw on every rank");
    } catch (const std::invalid_argument& e) {
      CHECK(std::string(e.what()) ==
            "the ranks disagree on the model: rank 0 has 'mlp', rank 1 has 'lenet' (start every rank with the same "
            "arguments)");
    }
  }

  TEST_CASE("a layer's forwards and gradients cross ranks with their fields, shapes and bits") {
    namespace nl = nerve::layers;
    const int n = world->size(), me = world->rank();
    const int to = (me + 1) % n;
    struct layer_stub : actor {
      nerve::bus::signal<nl::forward_msg> out{*this, "out"};
      nerve::bus::signal<nl::backward_msg> grad{*this, "grad"};
      layer_stub() : actor("layer") {
        on<std::int64_t>([this](std::int64_t& k) {
          auto t = layer_tensor(world->rank(), k);
          out.emit(nl::forward_msg{k, 7, 0, 4, k % 2 == 0, 0.125 * double(k), nl::value(t.clone())});
          grad.emit(nl::backward_msg{k, 7, 0, nl::value(std::move(t))});
        });
      }
    };
    struct receiver : actor {
      std::vector<nl::forward_msg> fwd;
      std::vector<nl::backward_msg> bwd;
      std::promise<void> done;
      std::size_t want;
      explicit receiver(std::size_t w) : actor("receiver"), want(w) {
        on<nl::forward_msg>([this](nl::forward_msg& m) {
          fwd.push_back(std::move(m));
          check();
        });
        on<nl::backward_msg>([this](nl::backward_msg& m) {
          bwd.push_back(std::move(m));
          check();
        });
      }
      void check() {
        if (fwd.size() == want && bwd.size() == want) done.set_value();
      }
    };
    constexpr std::int64_t count = 6;
    runtime rt({.loops = 1});
    auto rec = rt.spawn<receiver>(std::size_t(count));
    auto& got = *static_cast<receiver*>(rec.get());
    auto f = got.done.get_future();
    world->listen<nl::forward_msg>(20, rec);
    world->listen<nl::backward_msg>(21, rec);
    auto src = rt.spawn<layer_stub>();
    auto& stub = *static_cast<layer_stub*>(src.get());
    stub.out.subscribe(std::make_shared<mpi::remote<nl::forward_msg>>(*world, to, 20), /*port*/ 2);
    stub.grad.subscribe(std::make_shared<mpi::remote<nl::backward_msg>>(*world, to, 21), /*port*/ 1);
    world->barrier();
    for (std::int64_t k = 0; k < count; ++k) rt.send(src, k);
    while (f.wait_for(std::chrono::milliseconds(20)) != std::future_status::ready) world->check();
    world->flush();
    world->barrier();
    const int from = (me + n - 1) % n;
    for (std::int64_t k = 0; k < count; ++k) {
      const auto& m = got.fwd[std::size_t(k)];
      CHECK(m.micro_batch == k);
      CHECK(m.step == 7);
      CHECK(m.port == 2);  // stamped by the bus before it left
      CHECK(m.micro_batches == 4);
      CHECK(m.train == (k % 2 == 0));
      CHECK(m.lr == 0.125 * double(k));
      const auto want = layer_tensor(from, k);
      const auto& b = got.bwd[std::size_t(k)];
      CHECK(b.micro_batch == k);
      CHECK(b.port == 1);
      for (const auto* v : {&m.x, &b.grad}) {
        if (k == 0) {
          CHECK(v->empty());
          continue;
        }
        REQUIRE(v->host.batch() == k);
        CHECK(v->host.sample_shape().dims() == std::vector<std::int64_t>{3, 4, 5});
        CHECK(std::equal(want.data(), want.data() + want.size(), v->host.data()));
      }
    }
    rt.shutdown();
  }

  TEST_CASE("all-reduce across ranks: the bits of the in-process one, rounds interleaved") {
    const int n = world->size(), me = world->rank();
    constexpr std::uint64_t rounds = 12;
    // Member m lives on rank (m + 1) % n, so member order is not rank order.
    std::vector<int> ranks(std::size_t(n), 0);
    for (int m = 0; m < n; ++m) ranks[std::size_t(m)] = (m + 1) % n;
    const auto mine = std::uint32_t((me + n - 1) % n);
    // Member m's part of round k: floats over many magnitudes, so the order of the sum shows.
    auto part = [](int m, std::uint64_t k) {
      std::mt19937 rng(std::uint32_t(1000 * m + k));
      std::uniform_real_distribution<float> u(-1.f, 1.f);
      std::vector<float> v(3 + 4099 * (k % 3));
      for (auto& x : v) x = u(rng) * std::pow(10.f, float(int(rng() % 9) - 4));
      return v;
    };
    struct member : actor {
      std::map<std::uint64_t, std::vector<float>> sums;
      std::promise<void> done;
      std::uint64_t want;
      explicit member(std::uint64_t w) : actor("member"), want(w) {
        on<nerve::bus::reduced>([this](nerve::bus::reduced& r) {
          if (!sums.emplace(r.key, *r.sum).second) FAIL("round " << r.key << " reduced twice");
          if (sums.size() == want) done.set_value();
        });
      }
    };
    // In process: every member here, summed by bus::all_reduce.
    std::map<std::uint64_t, std::vector<float>> want;
    {
      runtime rt({.loops = 1});
      nerve::bus::group g("replicas");
      for (int m = 0; m < n; ++m) g.add(rt.spawn<member>(rounds));
      auto red = rt.spawn<nerve::bus::all_reduce>("in process", g);
      for (std::uint64_t k = 0; k < rounds; ++k)
        for (int m = n - 1; m >= 0; --m) rt.send(red, nerve::bus::contribution{k, unsigned(m), part(m, k)});
      rt.synchronize();
      want = static_cast<member*>(g[0].get())->sums;
      rt.shutdown();
    }
    REQUIRE(want.size() == rounds);
    // Across ranks: one member per rank, rounds sent in an order that differs by rank.
    runtime rt({.loops = 1});
    auto local = rt.spawn<member>(rounds);
    auto& mem = *static_cast<member*>(local.get());
    auto f = mem.done.get_future();
    auto red = mpi::spawn_all_reduce(rt, 0, *world, /*channel*/ 40, ranks, mine, local, "grads");
    world->barrier();  // every rank listens before any part leaves
    std::vector<std::uint64_t> order(rounds);
    for (std::uint64_t k = 0; k < rounds; ++k) order[k] = k;
    std::shuffle(order.begin(), order.end(), std::mt19937(std::uint32_t(me + 7)));
    for (auto k : order) rt.send(red, nerve::bus::contribution{k, mine, part(int(mine), k)});
    while (f.wait_for(std::chrono::milliseconds(20)) != std::future_status::ready) world->check();
    world->flush();
    world->barrier();
    CHECK(static_cast<mpi::all_reduce*>(red.get())->rounds() == rounds);
    for (std::uint64_t k = 0; k < rounds; ++k) CHECK(mem.sums.at(k) == want.at(k));  // bitwise
    // Wiring this rank as another rank's member, or a member that does not exist, is refused.
    if (n > 1)
      CHECK_THROWS_WITH_AS(mpi::all_reduce("bad", *world, 41, ranks, mine == 0 ? 1u : 0u, local),
                           doctest::Contains("not on this rank"), nerve::actors::wiring_error);
    const auto beyond = "member " + std::to_string(n) + " of " + std::to_string(n);
    CHECK_THROWS_WITH_AS(mpi::all_reduce("bad", *world, 41, ranks, std::uint32_t(n), local),
                         doctest::Contains(beyond.c_str()), nerve::actors::wiring_error);
    rt.shutdown();
  }

  TEST_CASE("clock offsets: one vector on every rank, within half a round trip of the truth") {
    const auto off = world->clock_offsets();
    REQUIRE(off.size() == std::size_t(world->size()));
    CHECK(off[0].offset_ns == 0);
    // steady_clock is the host's CLOCK_MONOTONIC, which every rank of one host shares (the
    // namespaces of scripts/mpi-hosts too): the truth is 0, and what is measured is the
    // method's error, which must stay within half the round trip it reports.
    std::string mine;
    for (std::size_t r = 1; r < off.size(); ++r) {
      CHECK(off[r].rtt_ns > 0);
      CHECK(std::abs(off[r].offset_ns) <= off[r].rtt_ns / 2 + 1000);
      mine += std::to_string(off[r].offset_ns) + "/" + std::to_string(off[r].rtt_ns) + ",";
    }
    CHECK_NOTHROW(world->agree("the clock offsets", mine));
  }
}

int main(int argc, char** argv) {
  int rc = 0;
  {
    mpi::transport t;
    world = &t;
    doctest::Context ctx(argc, argv);
    rc = ctx.run();
    world = nullptr;
  }
  return rc;
}

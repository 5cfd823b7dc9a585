// The messaging workloads on the nerve runtime. Each repeat builds a fresh runtime, wires
// its actors, times only the message phase, validates exact counts after shutdown (when
// every loop thread has been joined, so plain counters are safe to read) and throws on
// any mismatch. A run that fails, or does not finish within its timeout, ends with an
// error: the thread that waits for it never waits forever.
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <new>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "actors/runtime.hpp"
#include "apps/bench/messaging.hpp"

namespace nerve::bench {
namespace {

namespace na = nerve::actors;
using clock_type = std::chrono::steady_clock;

struct go {};
struct peer {
  na::address to;
};

void check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("validation failed: " + what);
}

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

static_assert(max_inflight <= na::runtime_options{}.mailbox_capacity,
              "--inflight is capped at what a mailbox of the default capacity holds");

/// The end of a repeat's timed phase: the workload's last actor reaches it, or the run's
/// first failure does (an actor that throws stops every actor, and the last one would
/// never report). Declared before the runtime, so that it outlives every actor that
/// holds it.
class finish_line {
 public:
  /// Any thread: the workload completed.
  void reach() { set(done_); }
  /// Sends the runtime's first failure here. Before anything is spawned.
  void watch(na::runtime& rt) {
    rt.on_failure([this](std::exception_ptr) { set(failed_); });
  }
  /// Waits for the workload or a failure (then the caller's shutdown rethrows it); throws
  /// when `p.timeout_s` passes first, naming the workload.
  void wait(const run_params& p) {
    std::unique_lock lk(mu_);
    const auto over = [this] { return done_ || failed_; };
    if (p.timeout_s == 0) {
      cv_.wait(lk, over);
    } else if (!cv_.wait_for(lk, std::chrono::seconds(p.timeout_s), over)) {
      std::string what = p.workload;
      if (p.workload == "chain" || p.workload == "fan") what += " inflight=" + std::to_string(p.inflight);
      throw std::runtime_error(what + " threads=" + std::to_string(p.threads) + ": not finished within --timeout " +
                               std::to_string(p.timeout_s) + " s (count " + std::to_string(p.count) +
                               "); the run was stopped");
    }
  }

 private:
  void set(bool& flag) {
    std::lock_guard lk(mu_);
    flag = true;
    cv_.notify_all();
  }
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false, failed_ = false;
};

/// Which loop actor `i` of `n` goes on: auto = none named (the runtime's default placement,
/// which moves actors), spread = round robin, packed = contiguous blocks. A named loop pins.
std::optional<unsigned> loop_for(const run_params& p, unsigned i, unsigned n) {
  if (p.placement == "auto") return std::nullopt;
  if (p.placement == "packed") return static_cast<unsigned>(static_cast<std::uint64_t>(i) * p.threads / n);
  return i % p.threads;
}

template <class A, class... Args>
na::address spawn_at(na::runtime& rt, std::optional<unsigned> loop, Args&&... args) {
  return rt.spawn_with<A>({.loop = loop, .capacity = 0, .supervisor = {}}, std::forward<Args>(args)...);
}

nlohmann::json migration_notes(na::runtime& rt) {
  const auto m = rt.migrations();
  return {{"affinity", m.affinity}, {"balance", m.balance}};
}

/// The loop of actor `i` of a communicating pair (pingpong, oneway, payload): spread = one
/// per loop, every message crosses loops; packed = the pair shares loop 0 (what a placement
/// that co-locates chatty partners does; a work-stealing scheduler such as CAF's ends up
/// running such a pair on one thread too).
std::optional<unsigned> pair_loop(const run_params& p, unsigned i) {
  if (p.placement == "auto") return std::nullopt;
  return p.placement == "packed" ? 0 : i % p.threads;
}

na::runtime_options options_for(const run_params& p) {
  return {.loops = p.threads,
          .record = p.record,
          .record_timing = p.record_exact ? na::recorder::timing::exact : na::recorder::timing::shared};
}

nlohmann::json recorder_notes(na::runtime& rt) {
  if (!rt.trace().enabled()) return nlohmann::json::object();
  return {{"records", rt.trace().size()}, {"lost_records", rt.trace().lost()}};
}

// ---- pingpong -----------------------------------------------------------------------------

struct ball {
  std::uint64_t n;
};

struct pong_actor : na::actor {
  na::address ping;
  std::uint64_t handled = 0;
  pong_actor() : actor("pong") {
    on<peer>([this](peer& m) { ping = std::move(m.to); });
    on<ball>([this](ball& b) {
      ++handled;
      send(ping, b);
    });
  }
  void on_stop() override { ping = {}; }  // breaks the ping <-> pong reference cycle
};

struct ping_actor : na::actor {
  na::address pong;
  std::uint64_t total, handled = 0;
  finish_line* done;
  ping_actor(na::address p, std::uint64_t n, finish_line* d) : actor("ping"), pong(std::move(p)), total(n), done(d) {
    on<go>([this](go&) { send(pong, ball{1}); });
    on<ball>([this](ball& b) {
      ++handled;
      if (b.n != handled) fail(std::make_exception_ptr(std::runtime_error("pingpong: out of order")));
      if (b.n == total) done->reach();
      else send(pong, ball{b.n + 1});
    });
  }
};

sample run_pingpong(const run_params& p) {
  finish_line done;
  na::runtime rt(options_for(p));
  done.watch(rt);
  auto pong = spawn_at<pong_actor>(rt, pair_loop(p, 1));
  auto ping = spawn_at<ping_actor>(rt, pair_loop(p, 0), pong, p.count, &done);
  rt.send(pong, peer{ping});
  rt.synchronize();
  auto t0 = clock_type::now();
  rt.send(ping, go{});
  done.wait(p);
  sample s{.seconds = seconds_since(t0), .units = p.count};
  s.extra = recorder_notes(rt);
  s.extra["migrations"] = migration_notes(rt);
  rt.shutdown();
  if (auto e = rt.error()) std::rethrow_exception(e);
  check(static_cast<ping_actor*>(ping.get())->handled == p.count, "ping handled every round trip");
  check(static_cast<pong_actor*>(pong.get())->handled == p.count, "pong handled every round trip");
  return s;
}

// ---- oneway and payload -------------------------------------------------------------------

struct block {
  std::vector<float> data;
  std::size_t payload_bytes() const { return data.size() * sizeof(float); }
};

template <class M>
M make_message(std::uint64_t i) {
  if constexpr (std::is_same_v<M, int>) return static_cast<int>(i & 0xffff);
  else return block{std::vector<float>(payload_floats, static_cast<float>(i & 0xfff))};
}

template <class M>
std::uint64_t value_of(const M& m) {
  if constexpr (std::is_same_v<M, int>) return static_cast<std::uint64_t>(m);
  else return m.data.size() == payload_floats ? static_cast<std::uint64_t>(m.data.back()) : ~0ull;
}

template <class M>
struct consumer_actor : na::actor {
  std::uint64_t total, got = 0, bad = 0;
  finish_line* done;
  consumer_actor(std::uint64_t n, finish_line* d) : actor("consumer"), total(n), done(d) {
    on<M>([this](M& m) {
      // FIFO from one sender: the values arrive in the order they were sent.
      if (value_of(m) != (got & (std::is_same_v<M, int> ? 0xffff : 0xfff))) ++bad;
      if (++got == total) done->reach();
    });
  }
};

/// Sends until the consumer's mailbox is full, then waits for room (back-pressure).
template <class M>
struct producer_actor : na::actor {
  na::address to;
  std::uint64_t total, sent = 0, stalls = 0;
  producer_actor(na::address c, std::uint64_t n) : actor("producer"), to(std::move(c)), total(n) {
    on<go>([this](go&) { pump(); });
  }
  void pump() {
    while (sent < total) {
      M m = make_message<M>(sent);
      auto s = try_send(to, std::move(m));
      if (s == na::send_status::full) {
        ++stalls;
        when_writable(to, [this] { pump(); });
        return;
      }
      if (s != na::send_status::ok) throw std::runtime_error("producer: consumer closed");
      ++sent;
    }
  }
};

template <class M>
sample run_oneway(const run_params& p) {
  finish_line done;
  na::runtime rt(options_for(p));
  done.watch(rt);
  auto consumer = spawn_at<consumer_actor<M>>(rt, pair_loop(p, 1), p.count, &done);
  auto producer = spawn_at<producer_actor<M>>(rt, pair_loop(p, 0), consumer, p.count);
  rt.synchronize();
  auto t0 = clock_type::now();
  rt.send(producer, go{});
  done.wait(p);
  sample s{.seconds = seconds_since(t0), .units = p.count};
  s.extra = recorder_notes(rt);
  s.extra["migrations"] = migration_notes(rt);
  s.extra["producer_stalls"] = static_cast<producer_actor<M>*>(producer.get())->stalls;
  rt.shutdown();
  if (auto e = rt.error()) std::rethrow_exception(e);
  auto* c = static_cast<consumer_actor<M>*>(consumer.get());
  check(c->got == p.count, "consumer got every message");
  check(c->bad == 0, "messages arrived in order with their payload");
  return s;
}

// ---- chain --------------------------------------------------------------------------------

struct token {
  std::uint32_t id;
};

/// One link of the ring. The last link counts a delivery end to end and re-injects the
/// token at the first link while circuits remain.
struct link_actor : na::actor {
  na::address next;
  std::uint64_t handled = 0;
  bool last;
  std::uint64_t circuits = 0, injected = 0, completed = 0;
  finish_line* done = nullptr;
  link_actor(na::address n, bool is_last, std::uint64_t c, std::uint64_t initially_injected, finish_line* d)
      : actor("link"), next(std::move(n)), last(is_last), circuits(c), injected(initially_injected), done(d) {
    on<peer>([this](peer& m) { next = std::move(m.to); });
    on<token>([this](token& t) {
      ++handled;
      if (!last) {
        send(next, t);
        return;
      }
      ++completed;
      if (injected < circuits) {
        ++injected;
        send(next, t);
      } else if (completed == circuits) {
        done->reach();
      }
    });
  }
  void on_stop() override { next = {}; }  // breaks the ring's reference cycle
};

sample run_chain(const run_params& p) {
  finish_line done;
  na::runtime rt(options_for(p));
  done.watch(rt);
  const std::uint64_t circuits = p.count / chain_length;
  const unsigned k = p.inflight;
  std::vector<na::address> links(chain_length);
  for (unsigned i = chain_length; i-- > 0;) {
    const bool last = i == chain_length - 1;
    links[i] = spawn_at<link_actor>(rt, loop_for(p, i, chain_length), last ? na::address{} : links[i + 1], last,
                                       circuits, std::uint64_t{k}, &done);
  }
  rt.send(links.back(), peer{links.front()});
  rt.synchronize();
  auto t0 = clock_type::now();
  for (unsigned i = 0; i < k; ++i) rt.send(links.front(), token{i});
  done.wait(p);
  sample s{.seconds = seconds_since(t0), .units = circuits * chain_length};
  s.extra = recorder_notes(rt);
  s.extra["migrations"] = migration_notes(rt);
  rt.shutdown();
  if (auto e = rt.error()) std::rethrow_exception(e);
  for (auto& l : links) check(static_cast<link_actor*>(l.get())->handled == circuits, "every link handled every circuit");
  return s;
}

// ---- fan ----------------------------------------------------------------------------------

struct work {
  std::uint32_t round;
};
struct round_done {
  std::uint32_t round;
};

struct worker_actor : na::actor {
  na::address sink;
  std::uint64_t handled = 0, work_iters;
  double work_sum = 0;
  worker_actor(na::address s, std::uint64_t iters) : actor("worker"), sink(std::move(s)), work_iters(iters) {
    on<work>([this](work& w) {
      ++handled;
      if (work_iters) work_sum += burn(work_iters, w.round);
      send(sink, w);
    });
  }
};

struct sink_actor : na::actor {
  na::address source;
  std::vector<std::uint8_t> arrived;
  std::uint64_t handled = 0;
  explicit sink_actor(std::uint64_t rounds) : actor("sink"), arrived(rounds, 0) {
    on<peer>([this](peer& m) { source = std::move(m.to); });
    on<work>([this](work& w) {
      ++handled;
      if (++arrived[w.round] == fan_width) send(source, round_done{w.round});
    });
  }
};

struct source_actor : na::actor {
  std::vector<na::address> workers;
  std::uint64_t rounds, started = 0, completed = 0;
  unsigned inflight;
  finish_line* done;
  source_actor(std::vector<na::address> ws, std::uint64_t n, unsigned k, finish_line* d)
      : actor("source"), workers(std::move(ws)), rounds(n), inflight(k), done(d) {
    on<go>([this](go&) {
      for (unsigned i = 0; i < inflight && started < rounds; ++i) start_round();
    });
    on<round_done>([this](round_done&) {
      ++completed;
      if (started < rounds) start_round();
      else if (completed == rounds) done->reach();
    });
  }
  void start_round() {
    auto r = static_cast<std::uint32_t>(started++);
    for (auto& w : workers) send(w, work{r});
  }
};

sample run_fan(const run_params& p) {
  finish_line done;
  na::runtime rt(options_for(p));
  done.watch(rt);
  // Actors 0 source, 1..8 workers, 9 sink (placement numbering).
  const unsigned n = fan_width + 2;
  auto sink = rt.spawn_with<sink_actor>({.loop = loop_for(p, n - 1, n), .capacity = std::size_t{fan_width} * p.inflight + 64, .supervisor = {}},
                                        p.count);
  std::vector<na::address> workers;
  for (unsigned i = 0; i < fan_width; ++i) workers.push_back(spawn_at<worker_actor>(rt, loop_for(p, i + 1, n), sink, p.work_iters));
  auto source = spawn_at<source_actor>(rt, loop_for(p, 0, n), workers, p.count, p.inflight, &done);
  rt.send(sink, peer{source});
  rt.synchronize();
  auto t0 = clock_type::now();
  rt.send(source, go{});
  done.wait(p);
  sample s{.seconds = seconds_since(t0), .units = p.count};
  s.extra = recorder_notes(rt);
  s.extra["migrations"] = migration_notes(rt);
  rt.shutdown();
  if (auto e = rt.error()) std::rethrow_exception(e);
  for (auto& w : workers) check(static_cast<worker_actor*>(w.get())->handled == p.count, "every worker handled every round");
  auto* sk = static_cast<sink_actor*>(sink.get());
  check(sk->handled == p.count * fan_width, "the sink got every worker's answer");
  for (auto a : sk->arrived) check(a == fan_width, "every round completed exactly once");
  check(static_cast<source_actor*>(source.get())->completed == p.count, "the source saw every round complete");
  return s;
}

// ---- many ---------------------------------------------------------------------------------

struct collector_actor : na::actor {
  std::uint64_t total, got = 0, sum = 0;
  finish_line* done;
  collector_actor(std::uint64_t n, finish_line* d) : actor("collector"), total(n), done(d) {
    on<std::uint64_t>([this](std::uint64_t& v) {
      sum += v;
      if (++got == total) done->reach();
    });
  }
};

struct member_actor : na::actor {
  na::address collector;
  explicit member_actor(na::address c) : collector(std::move(c)) {
    on<std::uint64_t>([this](std::uint64_t& v) { send(collector, v); });
  }
};

sample run_many(const run_params& p) {
  sample s;
  s.rss_before_mib = proc_status_mib("VmRSS");
  finish_line done;
  na::runtime rt(options_for(p));
  done.watch(rt);
  auto t0 = clock_type::now();
  // Every reply goes to one collector: its mailbox must hold them all.
  auto collector = rt.spawn_with<collector_actor>({.loop = std::nullopt, .capacity = p.count + 16, .supervisor = {}}, p.count, &done);
  std::uint64_t spawned = 0;
  try {
    for (; spawned < p.count; ++spawned) rt.send(rt.spawn<member_actor>(collector), std::uint64_t{spawned});
  } catch (const std::bad_alloc&) {
    // The runtime is left as it was before the spawn that failed; its destructor stops
    // and destroys the actors spawned so far.
    throw std::runtime_error("many: out of memory after spawning " + std::to_string(spawned) + " of " +
                             std::to_string(p.count) + " actors (RSS " + std::to_string(proc_status_mib("VmRSS")) +
                             " MiB)");
  }
  done.wait(p);
  s.seconds = seconds_since(t0);
  s.units = p.count;
  s.peak_rss_mib = proc_status_mib("VmHWM");
  s.extra = recorder_notes(rt);
  auto t1 = clock_type::now();
  rt.shutdown();
  s.extra["shutdown_seconds"] = seconds_since(t1);
  if (auto e = rt.error()) std::rethrow_exception(e);
  auto* c = static_cast<collector_actor*>(collector.get());
  check(c->got == p.count, "every actor replied");
  check(c->sum == p.count * (p.count - 1) / 2, "every actor replied exactly once");
  return s;
}

sample run(const run_params& p) {
  if (p.workload == "pingpong") return run_pingpong(p);
  if (p.workload == "oneway") return run_oneway<int>(p);
  if (p.workload == "payload") return run_oneway<block>(p);
  if (p.workload == "chain") return run_chain(p);
  if (p.workload == "fan") return run_fan(p);
  if (p.workload == "many") return run_many(p);
  throw std::invalid_argument("unknown workload '" + p.workload + "'");
}

}  // namespace

const messaging_backend& backend() {
  // many: each member is an arena slot, a cell, its handler and its registry entry (an
  // address and the name's record); its message and its reply are envelopes (freed once
  // handled, but the replies can all wait in the collector's mailbox at once).
  static const messaging_backend b{"nerve", true, {"auto", "spread", "packed"}, &run,
                                   na::detail::actor_arena::slot_size(sizeof(member_actor)) + sizeof(na::detail::actor_cell) +
                                       sizeof(std::function<void()>) + sizeof(na::address) + sizeof(std::string) +
                                       sizeof(na::typed_envelope<std::uint64_t>)};
  return b;
}

}  // namespace nerve::bench

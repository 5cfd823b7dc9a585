// The messaging workloads on the C++ Actor Framework 0.17 (Debian libcaf-dev), for the
// side-by-side table. Same workloads, sizes, validation and output as messaging_nerve.cpp.
// CAF places actors itself (work-stealing scheduler), so there is no --placement, and
// its mailboxes are unbounded, so the producers of oneway/payload never wait for room.
// Counts are read after the actor system is destroyed (all workers joined).
#include <chrono>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "apps/bench/messaging.hpp"

namespace nerve::bench {
namespace {

using clock_type = std::chrono::steady_clock;
using go_atom = caf::atom_constant<caf::atom("go")>;
using wire_atom = caf::atom_constant<caf::atom("wire")>;
using work_atom = caf::atom_constant<caf::atom("work")>;
using done_atom = caf::atom_constant<caf::atom("done")>;

void check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("validation failed: " + what);
}

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

/// A configured actor system (scheduler.max-threads = the benchmark's threads).
struct caf_system {
  explicit caf_system(unsigned threads) : sys(configure(cfg, threads)) {}
  static caf::actor_system_config& configure(caf::actor_system_config& c, unsigned threads) {
    c.set("scheduler.max-threads", static_cast<std::size_t>(threads));
    return c;
  }
  caf::actor_system_config cfg;
  caf::actor_system sys;
};

void stop_all(const std::vector<caf::actor>& actors) {
  for (auto& a : actors) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
}

// ---- pingpong -----------------------------------------------------------------------------

struct pingpong_state {
  std::uint64_t total = 0, ping_handled = 0, pong_handled = 0, bad = 0;
  std::promise<void> done;
};

caf::behavior pong_fn(caf::event_based_actor* self, pingpong_state* st) {
  auto ping = std::make_shared<caf::actor>();
  return {
      [=](wire_atom, caf::actor p) { *ping = std::move(p); },
      [=](std::uint64_t n) {
        ++st->pong_handled;
        self->send(*ping, n);
      },
  };
}

caf::behavior ping_fn(caf::event_based_actor* self, caf::actor pong, pingpong_state* st) {
  return {
      [=](go_atom) { self->send(pong, std::uint64_t{1}); },
      [=](std::uint64_t n) {
        if (n != ++st->ping_handled) ++st->bad;
        if (n == st->total) st->done.set_value();
        else self->send(pong, n + 1);
      },
  };
}

sample run_pingpong(const run_params& p) {
  pingpong_state st;
  st.total = p.count;
  sample s;
  {
    caf_system c(p.threads);
    auto pong = c.sys.spawn(pong_fn, &st);
    auto ping = c.sys.spawn(ping_fn, pong, &st);
    caf::anon_send(pong, wire_atom::value, ping);
    auto t0 = clock_type::now();
    caf::anon_send(ping, go_atom::value);
    st.done.get_future().wait();
    s = {.seconds = seconds_since(t0), .units = p.count};
    stop_all({ping, pong});
  }
  check(st.ping_handled == p.count && st.pong_handled == p.count && st.bad == 0, "every round trip, in order");
  return s;
}

// ---- oneway and payload -------------------------------------------------------------------

struct oneway_state {
  std::uint64_t total = 0, got = 0, bad = 0;
  std::promise<void> done;
};

caf::behavior int_consumer_fn(caf::event_based_actor*, oneway_state* st) {
  return {[=](int v) {
    if (static_cast<std::uint64_t>(v) != (st->got & 0xffff)) ++st->bad;
    if (++st->got == st->total) st->done.set_value();
  }};
}

caf::behavior int_producer_fn(caf::event_based_actor* self, caf::actor to, std::uint64_t n) {
  return {[=](go_atom) {
    for (std::uint64_t i = 0; i < n; ++i) self->send(to, static_cast<int>(i & 0xffff));
  }};
}

caf::behavior block_consumer_fn(caf::event_based_actor*, oneway_state* st) {
  return {[=](const std::vector<float>& v) {
    if (v.size() != payload_floats || static_cast<std::uint64_t>(v.back()) != (st->got & 0xfff)) ++st->bad;
    if (++st->got == st->total) st->done.set_value();
  }};
}

caf::behavior block_producer_fn(caf::event_based_actor* self, caf::actor to, std::uint64_t n) {
  return {[=](go_atom) {
    for (std::uint64_t i = 0; i < n; ++i) {
      std::vector<float> v(payload_floats, static_cast<float>(i & 0xfff));
      self->send(to, std::move(v));
    }
  }};
}

sample run_oneway(const run_params& p, bool payload) {
  oneway_state st;
  st.total = p.count;
  sample s;
  {
    caf_system c(p.threads);
    auto consumer = payload ? c.sys.spawn(block_consumer_fn, &st) : c.sys.spawn(int_consumer_fn, &st);
    auto producer = payload ? c.sys.spawn(block_producer_fn, consumer, p.count) : c.sys.spawn(int_producer_fn, consumer, p.count);
    auto t0 = clock_type::now();
    caf::anon_send(producer, go_atom::value);
    st.done.get_future().wait();
    s = {.seconds = seconds_since(t0), .units = p.count};
    stop_all({producer, consumer});
  }
  check(st.got == p.count, "consumer got every message");
  check(st.bad == 0, "messages arrived in order with their payload");
  return s;
}

// ---- chain --------------------------------------------------------------------------------

struct chain_state {
  std::uint64_t circuits = 0, injected = 0, completed = 0;
  std::vector<std::uint64_t> handled = std::vector<std::uint64_t>(chain_length, 0);
  std::promise<void> done;
};

caf::behavior link_fn(caf::event_based_actor* self, caf::actor next, unsigned index, chain_state* st) {
  auto nx = std::make_shared<caf::actor>(std::move(next));
  const bool last = index == chain_length - 1;
  return {
      [=](wire_atom, caf::actor n) { *nx = std::move(n); },
      [=](std::uint32_t t) {
        ++st->handled[index];
        if (!last) {
          self->send(*nx, t);
          return;
        }
        ++st->completed;
        if (st->injected < st->circuits) {
          ++st->injected;
          self->send(*nx, t);
        } else if (st->completed == st->circuits) {
          st->done.set_value();
        }
      },
  };
}

sample run_chain(const run_params& p) {
  chain_state st;
  st.circuits = p.count / chain_length;
  st.injected = p.inflight;
  sample s;
  {
    caf_system c(p.threads);
    std::vector<caf::actor> links(chain_length);
    for (unsigned i = chain_length; i-- > 0;)
      links[i] = c.sys.spawn(link_fn, i == chain_length - 1 ? caf::actor{} : links[i + 1], i, &st);
    caf::anon_send(links.back(), wire_atom::value, links.front());
    auto t0 = clock_type::now();
    for (unsigned i = 0; i < p.inflight; ++i) caf::anon_send(links.front(), std::uint32_t{i});
    st.done.get_future().wait();
    s = {.seconds = seconds_since(t0), .units = st.circuits * chain_length};
    stop_all(links);
  }
  for (auto h : st.handled) check(h == st.circuits, "every link handled every circuit");
  return s;
}

// ---- fan ----------------------------------------------------------------------------------

struct fan_state {
  std::uint64_t rounds = 0, started = 0, completed = 0, sink_handled = 0;
  unsigned inflight = 1;
  std::vector<std::uint64_t> worker_handled = std::vector<std::uint64_t>(fan_width, 0);
  std::uint64_t work_iters = 0;
  std::vector<double> work_sum = std::vector<double>(fan_width, 0.0);
  std::vector<std::uint8_t> arrived;
  std::promise<void> done;
};

caf::behavior sink_fn(caf::event_based_actor* self, fan_state* st) {
  auto source = std::make_shared<caf::actor>();
  return {
      [=](wire_atom, caf::actor s) { *source = std::move(s); },
      [=](work_atom, std::uint32_t r) {
        ++st->sink_handled;
        if (++st->arrived[r] == fan_width) self->send(*source, done_atom::value, r);
      },
  };
}

caf::behavior worker_fn(caf::event_based_actor* self, caf::actor sink, unsigned index, fan_state* st) {
  return {[=](work_atom, std::uint32_t r) {
    ++st->worker_handled[index];
    if (st->work_iters) st->work_sum[index] += burn(st->work_iters, r);
    self->send(sink, work_atom::value, r);
  }};
}

caf::behavior source_fn(caf::event_based_actor* self, std::vector<caf::actor> workers, fan_state* st) {
  auto start_round = [=] {
    auto r = static_cast<std::uint32_t>(st->started++);
    for (auto& w : workers) self->send(w, work_atom::value, r);
  };
  return {
      [=](go_atom) {
        for (unsigned i = 0; i < st->inflight && st->started < st->rounds; ++i) start_round();
      },
      [=](done_atom, std::uint32_t) {
        ++st->completed;
        if (st->started < st->rounds) start_round();
        else if (st->completed == st->rounds) st->done.set_value();
      },
  };
}

sample run_fan(const run_params& p) {
  fan_state st;
  st.rounds = p.count;
  st.inflight = p.inflight;
  st.work_iters = p.work_iters;
  st.arrived.assign(p.count, 0);
  sample s;
  {
    caf_system c(p.threads);
    auto sink = c.sys.spawn(sink_fn, &st);
    std::vector<caf::actor> workers;
    for (unsigned i = 0; i < fan_width; ++i) workers.push_back(c.sys.spawn(worker_fn, sink, i, &st));
    auto source = c.sys.spawn(source_fn, workers, &st);
    caf::anon_send(sink, wire_atom::value, source);
    auto t0 = clock_type::now();
    caf::anon_send(source, go_atom::value);
    st.done.get_future().wait();
    s = {.seconds = seconds_since(t0), .units = p.count};
    workers.push_back(sink);
    workers.push_back(source);
    stop_all(workers);
  }
  for (auto h : st.worker_handled) check(h == p.count, "every worker handled every round");
  check(st.sink_handled == p.count * fan_width, "the sink got every worker's answer");
  for (auto a : st.arrived) check(a == fan_width, "every round completed exactly once");
  check(st.completed == p.count, "the source saw every round complete");
  return s;
}

// ---- many ---------------------------------------------------------------------------------

struct many_state {
  std::uint64_t total = 0, got = 0, sum = 0;
  std::promise<void> done;
};

caf::behavior collector_fn(caf::event_based_actor*, many_state* st) {
  return {[=](std::uint64_t v) {
    st->sum += v;
    if (++st->got == st->total) st->done.set_value();
  }};
}

caf::behavior member_fn(caf::event_based_actor* self, caf::actor collector) {
  return {[=](std::uint64_t v) { self->send(collector, v); }};
}

sample run_many(const run_params& p) {
  many_state st;
  st.total = p.count;
  sample s;
  s.rss_before_mib = proc_status_mib("VmRSS");
  {
    caf_system c(p.threads);
    std::vector<caf::actor> members;
    members.reserve(p.count + 1);
    auto t0 = clock_type::now();
    auto collector = c.sys.spawn(collector_fn, &st);
    for (std::uint64_t i = 0; i < p.count; ++i) {
      members.push_back(c.sys.spawn(member_fn, collector));
      caf::anon_send(members.back(), std::uint64_t{i});
    }
    st.done.get_future().wait();
    s.seconds = seconds_since(t0);
    s.units = p.count;
    s.peak_rss_mib = proc_status_mib("VmHWM");
    auto t1 = clock_type::now();
    members.push_back(collector);
    stop_all(members);
    members.clear();
    s.extra["shutdown_started"] = seconds_since(t1);
  }
  check(st.got == p.count, "every actor replied");
  check(st.sum == p.count * (p.count - 1) / 2, "every actor replied exactly once");
  return s;
}

sample run(const run_params& p) {
  if (p.workload == "pingpong") return run_pingpong(p);
  if (p.workload == "oneway") return run_oneway(p, false);
  if (p.workload == "payload") return run_oneway(p, true);
  if (p.workload == "chain") return run_chain(p);
  if (p.workload == "fan") return run_fan(p);
  if (p.workload == "many") return run_many(p);
  throw std::invalid_argument("unknown workload '" + p.workload + "'");
}

}  // namespace

const messaging_backend& backend() {
  static const messaging_backend b{"caf", false, {"scheduler"}, &run};
  return b;
}

}  // namespace nerve::bench

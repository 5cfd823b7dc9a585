// nerve-bench-mpi distributed: the bus across processes against bare MPI, in one command
// (run under `mpirun -np 2`).
//
//   latency:    a tensor of --size-kib goes rank 0 → rank 1 → rank 0, --iterations times:
//               bare MPI_Send/MPI_Recv into a ready buffer, then bus signals between two
//               actors (remote<T> endpoints, the progress thread, the mailboxes).
//   bandwidth:  --stream-mib tensors rank 0 → rank 1, --stream-count of them, then one
//               small answer back; bare MPI_Isend/MPI_Recv against bus signals.
//
// Repeats alternate bare and bus so a noisy neighbour hits both; medians are reported with
// the ratio bus / bare. Rank 0 prints (text or --json); the other ranks print nothing.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <mpi.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "actors/runtime.hpp"
#include "apps/bench/subcommand.hpp"
#include "apps/common/options.hpp"
#include "bus/mpi/transport.hpp"
#include "bus/signal.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

/// A tensor as the bus carries one: a heap buffer left uninitialised until written (a
/// received one is filled by MPI), its size.
struct buffer_msg {
  static constexpr std::string_view kind = "buffer";
  std::int64_t seq = 0;
  std::size_t bytes = 0;
  std::unique_ptr<std::byte[]> data;
  static buffer_msg make(std::int64_t seq, std::size_t bytes) {
    return {seq, bytes, std::unique_ptr<std::byte[]>(new std::byte[bytes])};
  }
  buffer_msg clone() const {  // fan-out (not used here: one subscriber per signal)
    auto c = make(seq, bytes);
    std::memcpy(c.data.get(), data.get(), bytes);
    return c;
  }
};

}  // namespace

template <>
struct nerve::bus::mpi::codec<buffer_msg> {
  static void write(const buffer_msg& m, std::vector<std::byte>& frame) { frame_writer{frame}.put(m.seq).put(m.bytes); }
  static std::span<const std::byte> payload(const buffer_msg& m) { return {m.data.get(), m.bytes}; }
  static buffer_msg read(std::span<const std::byte> frame, std::span<std::byte>& payload) {
    frame_reader r{frame};
    const auto seq = r.get<std::int64_t>();
    auto m = buffer_msg::make(seq, r.get<std::size_t>());
    payload = {m.data.get(), m.bytes};
    return m;
  }
};

namespace {

namespace mpi = nerve::bus::mpi;
using namespace nerve::actors;

struct options {
  std::size_t size_kib = 64;
  int iterations = 2000;
  std::size_t stream_mib = 4;
  int stream_count = 64;
  int repeats = 5;
  bool poller_thread = false;
  bool json = false;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : (v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]));
}

// ---- bare MPI -----------------------------------------------------------------------

/// Seconds per round trip of `bytes` between ranks 0 and 1.
double bare_ping_pong(std::size_t bytes, int iterations) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::vector<std::byte> buf(bytes);
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = clock_type::now();
  for (int i = 0; i < iterations; ++i) {
    if (rank == 0) {
      MPI_Send(buf.data(), int(bytes), MPI_BYTE, 1, 0, MPI_COMM_WORLD);
      MPI_Recv(buf.data(), int(bytes), MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else if (rank == 1) {
      MPI_Recv(buf.data(), int(bytes), MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      MPI_Send(buf.data(), int(bytes), MPI_BYTE, 0, 0, MPI_COMM_WORLD);
    }
  }
  const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
  MPI_Barrier(MPI_COMM_WORLD);
  return s / iterations;
}

/// Bytes per second of `count` messages of `bytes` from rank 0 to rank 1.
double bare_stream(std::size_t bytes, int count) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::vector<std::vector<std::byte>> bufs(static_cast<std::size_t>(count), std::vector<std::byte>(bytes));
  std::vector<MPI_Request> reqs(std::size_t(count), MPI_REQUEST_NULL);
  char ack = 0;
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = clock_type::now();
  if (rank == 0) {
    for (int i = 0; i < count; ++i)
      MPI_Isend(bufs[std::size_t(i)].data(), int(bytes), MPI_BYTE, 1, 0, MPI_COMM_WORLD, &reqs[std::size_t(i)]);
    MPI_Waitall(count, reqs.data(), MPI_STATUSES_IGNORE);
    MPI_Recv(&ack, 1, MPI_CHAR, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  } else if (rank == 1) {
    for (int i = 0; i < count; ++i)
      MPI_Recv(bufs[std::size_t(i)].data(), int(bytes), MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    MPI_Send(&ack, 1, MPI_CHAR, 0, 1, MPI_COMM_WORLD);
  }
  const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
  MPI_Barrier(MPI_COMM_WORLD);
  return double(bytes) * count / s;
}

// ---- the bus ------------------------------------------------------------------------

/// Rank 0's end: sends `count` messages, each on the answer to the previous one (latency)
/// or all at once (bandwidth, answered once at the end).
struct player : actor {
  nerve::bus::signal<buffer_msg> out{*this, "out"};
  std::size_t bytes = 0;
  int count = 0, got = 0;
  bool stream = false;
  std::promise<void> done;
  player() : actor("player") {
    on<int>([this](int&) {  // start
      if (stream)
        for (int i = 0; i < count; ++i) out.emit(buffer_msg::make(i, bytes));
      else
        out.emit(buffer_msg::make(0, bytes));
    });
    on<buffer_msg>([this](buffer_msg& m) {
      if (stream || ++got == count) return done.set_value();
      m.seq = got;
      out.emit(std::move(m));  // the received tensor goes back: no allocation on this side
    });
  }
};

/// Rank 1's end: answers each message (latency) or the last (bandwidth).
struct echo : actor {
  nerve::bus::signal<buffer_msg> out{*this, "out"};
  int count = 0, got = 0;
  bool stream = false;
  echo() : actor("echo") {
    on<buffer_msg>([this](buffer_msg& m) {
      ++got;
      if (!stream) return out.emit(std::move(m));
      if (got == count) out.emit(buffer_msg::make(0, 1));
    });
  }
};

/// One bus run: seconds per round trip (latency) or bytes per second (stream).
double bus_run(std::size_t bytes, int count, bool stream, bool own_thread) {
  runtime rt({.loops = 1, .mailbox_capacity = std::size_t(std::max(count, 16))});
  double result = 0;
  {
    // MPI is up already: the transport adds its communicator and its poller, on the loop of
    // the actors (no thread switch per message) unless --poller-thread (a runtime of its own).
    auto t = own_thread ? std::make_unique<mpi::transport>() : std::make_unique<mpi::transport>(rt, 0);
    const int rank = t->rank();
    if (rank == 0) {
      auto p = rt.spawn<player>();
      auto& pl = *static_cast<player*>(p.get());
      pl.bytes = bytes;
      pl.count = count;
      pl.stream = stream;
      auto f = pl.done.get_future();
      t->listen<buffer_msg>(0, p);
      pl.out.subscribe(std::make_shared<mpi::remote<buffer_msg>>(*t, 1, 0));
      t->barrier();
      const auto t0 = clock_type::now();
      rt.send(p, 0);
      while (f.wait_for(std::chrono::milliseconds(50)) != std::future_status::ready) t->check();
      const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
      result = stream ? double(bytes) * count / s : s / count;
    } else if (rank == 1) {
      auto e = rt.spawn<echo>();
      auto& ec = *static_cast<echo*>(e.get());
      ec.count = count;
      ec.stream = stream;
      t->listen<buffer_msg>(0, e);
      ec.out.subscribe(std::make_shared<mpi::remote<buffer_msg>>(*t, 0, 0));
      t->barrier();
    } else {
      t->barrier();
    }
    t->flush();
    t->barrier();  // rank 1's last answer has been taken before anyone tears down
  }  // the transport stops before the loop it polls on
  rt.shutdown();
  return result;
}

void run(const options& o) {
  int initialised = 0;
  MPI_Initialized(&initialised);
  bool owns = false;
  if (!initialised) {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    owns = true;
  }
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size < 2) {
    if (owns) MPI_Finalize();
    throw std::runtime_error("distributed: run it under mpirun with 2 ranks (mpirun -np 2 nerve-bench-mpi distributed)");
  }
  const std::size_t small = o.size_kib * 1024, large = o.stream_mib * 1024 * 1024;
  std::vector<double> bare_lat, bus_lat, bare_bw, bus_bw;
  for (int r = 0; r < o.repeats; ++r) {
    if (rank == 0 && !o.json) std::fprintf(stderr, "\rrepeat %d/%d", r + 1, o.repeats);
    bare_lat.push_back(bare_ping_pong(small, o.iterations));
    bus_lat.push_back(bus_run(small, o.iterations, false, o.poller_thread));
    bare_bw.push_back(bare_stream(large, o.stream_count));
    bus_bw.push_back(bus_run(large, o.stream_count, true, o.poller_thread));
  }
  if (rank == 0) {
    if (!o.json) std::fprintf(stderr, "\n");
    char host[MPI_MAX_PROCESSOR_NAME];
    int n = 0;
    MPI_Get_processor_name(host, &n);
    const double bl = median(bare_lat), ul = median(bus_lat), bb = median(bare_bw), ub = median(bus_bw);
    nlohmann::json j{{"benchmark", "distributed"},
                     {"ranks", size},
                     {"host", std::string(host, std::size_t(n))},
                     {"repeats", o.repeats},
                     {"poller", o.poller_thread ? "thread" : "loop"},
                     {"latency", {{"bytes", small}, {"iterations", o.iterations}, {"bare_us", bl * 1e6},
                                  {"bus_us", ul * 1e6}, {"bus_over_bare", ul / bl}}},
                     {"bandwidth", {{"bytes", large}, {"count", o.stream_count}, {"bare_gib_s", bb / (1 << 30)},
                                    {"bus_gib_s", ub / (1 << 30)}, {"bus_over_bare", ub / bb}}}};
    if (o.json) {
      std::printf("%s\n", j.dump(2).c_str());
    } else {
      std::printf("nerve-bench-mpi distributed: %d ranks on %s, median of %d repeats\n", size, host, o.repeats);
      std::printf("  round trip of %zu KiB:  bare MPI %8.2f us   bus %8.2f us   bus/bare %.2fx\n", o.size_kib,
                  bl * 1e6, ul * 1e6, ul / bl);
      std::printf("  stream of %zu MiB:      bare MPI %8.2f GiB/s bus %8.2f GiB/s bus/bare %.2f\n", o.stream_mib,
                  bb / (1 << 30), ub / (1 << 30), ub / bb);
    }
  }
  if (owns) MPI_Finalize();
}

void add_distributed(CLI::App& app) {
  auto o = std::make_shared<options>();
  auto* sub = app.add_subcommand("distributed", "The bus between MPI ranks against bare MPI (run under mpirun -np 2)");
  sub->add_option("--size-kib", o->size_kib, "Tensor of the round trips (KiB)")
      ->capture_default_str()
      ->transform(nerve::apps::whole_in<std::size_t>(1, 1 << 20));
  sub->add_option("--iterations", o->iterations, "Round trips per repeat")
      ->capture_default_str()
      ->transform(nerve::apps::whole_in<int>(1, 10000000));
  sub->add_option("--stream-mib", o->stream_mib, "Tensor of the stream (MiB)")
      ->capture_default_str()
      ->transform(nerve::apps::whole_in<std::size_t>(1, 1024));
  sub->add_option("--stream-count", o->stream_count, "Tensors per stream repeat")
      ->capture_default_str()
      ->transform(nerve::apps::whole_in<int>(1, 100000));
  sub->add_option("--repeats,-r", o->repeats, "Repeats; the median is reported")
      ->capture_default_str()
      ->transform(nerve::apps::whole_in<int>(1, 1000));
  sub->add_flag("--poller-thread", o->poller_thread, "Poll MPI on a loop of its own, not on the actors' loop");
  sub->add_flag("--json", o->json, "Print one JSON object (rank 0)");
  sub->callback([o] { run(*o); });
}

const nerve::bench::subcommand_registration reg{"distributed", &add_distributed};

}  // namespace

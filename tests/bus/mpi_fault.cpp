// A job that loses a rank mid-traffic, run by mpi_fault_test.sh under mpirun.
//   mpi_fault kill:   rank 1 is SIGKILLed after 100 of rank 0's messages arrived
//   mpi_fault throw:  rank 1's receiving actor throws on message 100
//   mpi_fault channel: rank 0 sends to a channel nothing on rank 1 listens to; rank 1's
//                      transport stops with an error naming it
// Rank 0 keeps sending and then waits for an answer that never comes: only the job's end
// (mpirun taking every rank down) stops it. The script checks how and how fast it ends.
#include <csignal>
#include <cstdio>
#include <cstring>
#include <future>
#include <stdexcept>
#include <string>

#include "actors/runtime.hpp"
#include "bus/mpi/transport.hpp"
#include "bus/signal.hpp"

namespace {
struct tick_msg {
  static constexpr std::string_view kind = "tick";
  std::int64_t seq = 0;
};
}  // namespace

template <>
struct nerve::bus::mpi::codec<tick_msg> {
  static void write(const tick_msg& m, std::vector<std::byte>& f) { frame_writer{f}.put(m.seq); }
  static std::span<const std::byte> payload(const tick_msg&) { return {}; }
  static tick_msg read(std::span<const std::byte> f, std::span<std::byte>&) { return {frame_reader{f}.get<std::int64_t>()}; }
};

namespace {
using namespace nerve::actors;
struct source : actor {
  nerve::bus::signal<tick_msg> out{*this, "out"};
  source() : actor("source") {
    on<std::int64_t>([this](std::int64_t& n) {
      for (std::int64_t k = 0; k < n; ++k) out.emit(tick_msg{k});
    });
  }
};
struct sink : actor {
  bool throw_at_100 = false;
  std::promise<void> ended;  // set when the actor stops (here: fails)
  void on_stop() override { ended.set_value(); }
  sink() : actor("sink") {
    on<tick_msg>([this](tick_msg& m) {
      if (m.seq != 100) return;
      if (throw_at_100) throw std::runtime_error("layer fc2 failed on micro-batch 100");
      std::raise(SIGKILL);
    });
  }
};
}  // namespace

int main(int argc, char** argv) {
  const bool do_throw = argc > 1 && std::strcmp(argv[1], "throw") == 0;
  const bool wrong_channel = argc > 1 && std::strcmp(argv[1], "channel") == 0;
  runtime rt({.loops = 1});
  int code = 0;
  {
    nerve::bus::mpi::transport t(rt, 0);
    auto src = rt.spawn<source>();
    auto snk = rt.spawn<sink>();
    static_cast<sink*>(snk.get())->throw_at_100 = do_throw;
    t.listen<tick_msg>(0, snk);
    if (t.rank() == 0) static_cast<source*>(src.get())->out.subscribe(std::make_shared<nerve::bus::mpi::remote<tick_msg>>(t, 1, wrong_channel ? 424242 : 0));
    t.barrier();
    if (t.rank() == 0) rt.send(src, std::int64_t{1000});
    auto ended = static_cast<sink*>(snk.get())->ended.get_future();
    try {
      if (t.rank() == 1 && wrong_channel) t.barrier();  // rank 0 never comes: the transport's error ends the wait
      else if (t.rank() == 1) ended.wait();  // the sink fails (throw) or the process dies (kill)
      rt.synchronize();  // rethrows the sink's failure
      t.check();
      if (t.rank() == 0) std::promise<void>().get_future().wait();  // only the job's end stops rank 0
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank %d: error: %s\n", t.rank(), e.what());
      code = 1;
    }
    if (code) std::_Exit(code);  // a failed rank leaves at once; mpirun ends the others
  }
  return code;
}

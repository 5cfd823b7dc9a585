#pragma once
/// \file
/// `nerve-bench messaging`: the messaging workloads, independent of the actor framework.
///
/// `messaging.cpp` owns the command line, repeats, medians, the child process for `many`
/// and the JSON; a backend (`messaging_nerve.cpp`, `messaging_caf.cpp`) runs one repeat of
/// one workload. Each executable links exactly one backend, so `nerve-bench` and
/// `nerve-bench-caf` share the command line and the JSON shape.

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace nerve::bench {

/// The workloads, in the order `--workload all` runs them.
///   pingpong  two actors bounce one message: round trips/s
///   oneway    one producer sends ints to one consumer (bounded mailbox, back-pressure): messages/s
///   payload   like oneway, each message a freshly filled 64 KiB std::vector<float>, moved: messages/s
///   chain     8 actors in a ring, `inflight` tokens circulating: deliveries/s (one hop = one delivery)
///   fan       source -> 8 workers -> sink, `inflight` rounds at once: rounds/s
///   many      spawn 100,000 actors, one message each, every one replies to a collector: seconds, peak RSS
inline const std::vector<std::string>& workload_names() {
  static const std::vector<std::string> names{"pingpong", "oneway", "payload", "chain", "fan", "many"};
  return names;
}

/// Size of the payload workload's messages.
inline constexpr std::size_t payload_floats = 64 * 1024 / sizeof(float);
/// Actors in the chain; workers in the fan.
inline constexpr unsigned chain_length = 8;
inline constexpr unsigned fan_width = 8;
/// The most tokens (chain) or rounds (fan) in flight: a nerve mailbox's default capacity
/// (`actors::runtime_options::mailbox_capacity`). Every token can end up queued at one
/// link, every round's work at one worker; one more and a send finds the mailbox full.
inline constexpr unsigned max_inflight = 1024;

/// One repeat of one workload.
struct run_params {
  std::string workload;
  unsigned threads = 1;
  unsigned inflight = 1;       ///< chain and fan
  std::uint64_t count = 0;     ///< round trips, messages, deliveries, rounds or actors
  bool record = false;         ///< nerve: the recorder on
  bool record_exact = false;   ///< nerve: recorder::timing::exact (a clock read after every run)
  std::string placement;       ///< nerve: "auto" (the runtime's default), "spread" or "packed"
  std::uint64_t work_iters = 0;  ///< fan: iterations of `burn` each worker runs per message (--work-us)
  unsigned timeout_s = 0;        ///< a repeat not finished after this many seconds throws (0: never)
};

/// Real work for the heavy fan: a dependent chain of multiply-adds the compiler cannot
/// drop (`--work-us` is turned into iterations once per process, `burn_iters_per_us`).
inline double burn(std::uint64_t iters, double seed = 1.0) {
  double x = seed;
  for (std::uint64_t i = 0; i < iters; ++i) x = x * 0.999999 + 1e-7;
  asm volatile("" : "+x"(x));
  return x;
}
/// Iterations of `burn` per microsecond on this machine (measured once, ~20 ms).
double burn_iters_per_us();

/// What one repeat measured. The backend validates its own counts and throws on a mismatch.
struct sample {
  double seconds = 0;          ///< the timed phase only (setup and teardown excluded)
  std::uint64_t units = 0;     ///< completed units (== count when validated)
  double peak_rss_mib = 0;     ///< many: VmHWM of the process at the end
  double rss_before_mib = 0;   ///< many: VmRSS before the workload started
  nlohmann::json extra = nlohmann::json::object();  ///< backend notes (records written, ...)
};

/// The backend linked into this executable.
struct messaging_backend {
  const char* framework;           ///< "nerve" or "caf"
  bool supports_record;            ///< has a message recorder whose cost `--record` measures
  std::vector<std::string> placements;  ///< accepted `--placement` values; first is the default
  sample (*run)(const run_params& p);
  /// `many`: a lower bound of the memory one of its actors takes (the actor, its share of
  /// the registry, its message); 0: unknown. A count whose actors cannot fit in the
  /// memory the process may use is refused before anything is spawned.
  std::uint64_t bytes_per_actor = 0;
};
const messaging_backend& backend();

/// Memory of this process from /proc/self/status, in MiB (`VmHWM`, `VmRSS`); 0 if unreadable.
double proc_status_mib(const char* field);

}  // namespace nerve::bench

// `messaging` subcommand: command line, repeats and medians, the fresh child process that
// `many` runs in (so its peak RSS is its own), the recorder on/off comparison, and output.
#include "apps/bench/messaging.hpp"

#include <pthread.h>
#include <sched.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <CLI/CLI.hpp>

#include "apps/bench/subcommand.hpp"
#include "apps/common/options.hpp"

extern char** environ;

namespace nerve::bench {

double proc_status_mib(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string key = std::string(field) + ":";
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) {
      std::istringstream s(line.substr(key.size()));
      double kib = 0;
      s >> kib;
      return kib / 1024.0;
    }
  }
  return 0;
}

double burn_iters_per_us() {
  // The fastest of a few 2 ms runs: the rate of an undisturbed core.
  constexpr std::uint64_t iters = 400'000;
  double best = 0;
  for (int r = 0; r < 7; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    volatile double sink = burn(iters);
    (void)sink;
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    if (us > 0) best = std::max(best, static_cast<double>(iters) / us);
  }
  return best;
}

namespace {

/// The machine's cross-core latency right now: nanoseconds per round trip of one cache line
/// between two threads on the first two CPUs this process may use (20,000 round trips).
/// On the shared build VM it moves between about 60 and about 350 ns from one second to
/// the next (the host moves the vCPUs between cores); every workload whose hops cross
/// loops moves with it, so each result carries the probe taken before and after it.
/// 0 when fewer than two CPUs are available.
double core_round_trip_ns() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0 || CPU_COUNT(&allowed) < 2) return 0;
  int cpus[2], found = 0;
  for (int c = 0; c < CPU_SETSIZE && found < 2; ++c)
    if (CPU_ISSET(c, &allowed)) cpus[found++] = c;
  auto pin = [](int c) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(c, &one);
    (void)pthread_setaffinity_np(pthread_self(), sizeof one, &one);
  };
  constexpr int n = 20000;
  alignas(64) std::atomic<int> line{0};
  double ns = 0;
  std::thread probe([&] {
    pin(cpus[0]);
    while (line.load(std::memory_order_acquire) != -1) {
    }
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {
      line.store(2 * i + 1, std::memory_order_release);
      while (line.load(std::memory_order_acquire) != 2 * i + 2) {
      }
    }
    ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / n;
  });
  std::thread echo([&] {
    pin(cpus[1]);
    line.store(-1, std::memory_order_release);
    for (int i = 0; i < n; ++i) {
      while (line.load(std::memory_order_acquire) != 2 * i + 1) {
      }
      line.store(2 * i + 2, std::memory_order_release);
    }
  });
  probe.join();
  echo.join();
  return ns;
}

struct messaging_options {
  std::string workload = "all";
  unsigned inflight = 0;  // 0: the workload's default (chain: 64; `all` runs chain at 1 and 64)
  unsigned threads = 0;   // 0: hardware threads
  unsigned repeats = 5;
  double scale = 1.0;
  std::uint64_t count = 0;
  std::string placement;
  double work_us = 0;     // fan: real work per message in each worker
  unsigned timeout_s = 60;
  bool json = false;
  bool record = false;
  std::string record_timing = "shared";
  bool quiet = false;
  bool child = false;  // internal: run one repeat of `many` here and print the sample as JSON
};

struct job {
  std::string workload;
  unsigned inflight;
  std::uint64_t count;
};

const char* unit_of(const std::string& w) {
  if (w == "pingpong") return "round_trips";
  if (w == "chain") return "deliveries";
  if (w == "fan") return "rounds";
  if (w == "many") return "actors";
  return "messages";
}

std::uint64_t default_count(const std::string& w, unsigned inflight) {
  if (w == "pingpong") return 200'000;
  if (w == "oneway") return 2'000'000;
  if (w == "payload") return 50'000;
  if (w == "chain") return inflight <= 1 ? 400'000 : 1'600'000;
  if (w == "fan") return 50'000;  // heavy (--work-us): scaled down in add()
  if (w == "many") return 100'000;
  throw std::invalid_argument("unknown workload '" + w + "'");
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  auto n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

void progress(const messaging_options& o, const std::string& line) {
  if (!o.quiet) std::cerr << "[" << backend().framework << "] " << line << std::endl;
}

std::string human(double per_s) {
  char buf[64];
  if (per_s >= 1e6) std::snprintf(buf, sizeof buf, "%.3f M", per_s / 1e6);
  else if (per_s >= 1e3) std::snprintf(buf, sizeof buf, "%.1f k", per_s / 1e3);
  else std::snprintf(buf, sizeof buf, "%.1f", per_s);
  return buf;
}

// ---- `many` in a fresh process ----------------------------------------------------------

struct child_outcome {
  bool timed_out = false;
  sample s;
};

child_outcome run_child(const messaging_options& o, const run_params& p) {
  std::vector<std::string> args{"/proc/self/exe", "messaging", "--child", "--workload", p.workload,
                                "--threads", std::to_string(p.threads), "--count", std::to_string(p.count),
                                "--timeout", std::to_string(o.timeout_s), "--quiet"};
  if (backend().placements.size() > 1) args.insert(args.end(), {"--placement", p.placement});
  if (p.record) args.push_back("--record");
  if (p.record_exact) args.insert(args.end(), {"--record-timing", "exact"});
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  posix_spawn_file_actions_addclose(&fa, fds[1]);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, "/proc/self/exe", &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    throw std::runtime_error(std::string("cannot start the child for 'many': ") + std::strerror(rc));
  }
  std::string out;
  char buf[4096];
  for (;;) {
    auto n = read(fds[0], buf, sizeof buf);
    if (n > 0) out.append(buf, static_cast<std::size_t>(n));
    else if (n == 0 || errno != EINTR) break;
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  child_outcome r;
  if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM) {
    r.timed_out = true;
    return r;
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw std::runtime_error("the child running '" + p.workload + "' failed (status " + std::to_string(status) + ")");
  auto j = nlohmann::json::parse(out);
  r.s.seconds = j.at("seconds");
  r.s.units = j.at("units");
  r.s.peak_rss_mib = j.at("peak_rss_mib");
  r.s.rss_before_mib = j.at("rss_before_mib");
  r.s.extra = j.value("extra", nlohmann::json::object());
  return r;
}

int run_as_child(const messaging_options& o, const run_params& p) {
  // Killed by SIGALRM when it runs away; the parent reports a timeout.
  if (o.timeout_s) alarm(o.timeout_s);
  auto s = backend().run(p);
  nlohmann::json j{{"seconds", s.seconds}, {"units", s.units}, {"peak_rss_mib", s.peak_rss_mib},
                   {"rss_before_mib", s.rss_before_mib}, {"extra", s.extra}};
  std::cout << j.dump() << std::endl;
  return 0;
}

// ---- one job: repeats, medians ------------------------------------------------------------

nlohmann::json run_job(const messaging_options& o, const job& jb, unsigned threads) {
  const auto& be = backend();
  run_params p;
  p.workload = jb.workload;
  p.threads = threads;
  p.inflight = jb.inflight;
  p.count = jb.count;
  p.placement = o.placement.empty() ? be.placements.front() : o.placement;
  p.record_exact = o.record_timing == "exact";
  if (jb.workload == "fan" && o.work_us > 0) p.work_iters = static_cast<std::uint64_t>(std::llround(o.work_us * burn_iters_per_us()));
  const bool in_child = jb.workload == "many";
  p.timeout_s = in_child ? 0 : o.timeout_s;  // the child is killed by its alarm instead
  const bool compare_record = o.record;

  auto once = [&](bool record) -> std::optional<sample> {
    run_params q = p;
    q.record = record;
    if (!in_child) return be.run(q);
    auto c = run_child(o, q);
    if (c.timed_out) return std::nullopt;
    return c.s;
  };

  std::vector<double> per_s, secs, rss, rss_before, per_s_off, secs_off;
  nlohmann::json extra = nlohmann::json::object();
  bool timed_out = false;
  std::string label = jb.workload + (jb.workload == "chain" || jb.workload == "fan" ? " inflight=" + std::to_string(jb.inflight) : "") +
                      (jb.workload == "fan" && o.work_us > 0 ? " work-us=" + std::to_string(o.work_us) : "") +
                      " threads=" + std::to_string(threads);
  const double rtt_before = core_round_trip_ns();
  for (unsigned r = 0; r < o.repeats; ++r) {
    // With --record, off and on alternate within each repeat so drift on a shared machine hits both alike.
    if (compare_record) {
      auto off = once(false);
      if (!off) {
        timed_out = true;
        break;
      }
      per_s_off.push_back(static_cast<double>(off->units) / off->seconds);
      secs_off.push_back(off->seconds);
    }
    auto s = once(compare_record);
    if (!s) {
      timed_out = true;
      progress(o, label + " repeat " + std::to_string(r + 1) + ": timed out after " + std::to_string(o.timeout_s) + " s");
      break;
    }
    per_s.push_back(static_cast<double>(s->units) / s->seconds);
    secs.push_back(s->seconds);
    rss.push_back(s->peak_rss_mib);
    rss_before.push_back(s->rss_before_mib);
    extra = s->extra;
    std::string line = label + " repeat " + std::to_string(r + 1) + "/" + std::to_string(o.repeats) + ": " +
                       human(per_s.back()) + unit_of(jb.workload) + "/s";
    if (compare_record) line += " (recorder off: " + human(per_s_off.back()) + "/s)";
    if (in_child) line += ", " + std::to_string(s->seconds) + " s, peak RSS " + std::to_string(s->peak_rss_mib) + " MiB";
    progress(o, line);
  }

  nlohmann::json j{{"framework", be.framework},
                   {"workload", jb.workload},
                   {"threads", threads},
                   {"count", jb.count},
                   {"unit", unit_of(jb.workload)},
                   {"repeats", per_s.size()},
                   {"median_per_s", median(per_s)},
                   {"median_seconds", median(secs)},
                   {"samples_per_s", per_s},
                   {"validated", !per_s.empty()}};
  j["core_round_trip_ns"] = {rtt_before, core_round_trip_ns()};
  if (jb.workload == "chain" || jb.workload == "fan") j["inflight"] = jb.inflight;
  if (jb.workload == "fan" && o.work_us > 0) {
    j["work_us"] = o.work_us;
    j["work_iters"] = p.work_iters;
  }
  if (jb.workload == "chain") j["end_to_end_per_s"] = median(per_s) / chain_length;
  if (!be.placements.empty()) j["placement"] = p.placement;
  if (in_child) {
    j["peak_rss_mib"] = rss.empty() ? 0.0 : *std::max_element(rss.begin(), rss.end());
    j["median_peak_rss_mib"] = median(rss);
    j["rss_before_mib"] = median(rss_before);
  }
  if (timed_out) {
    j["timed_out"] = true;
    j["timeout_s"] = o.timeout_s;
  }
  if (compare_record) {
    double on = median(per_s), off = median(per_s_off);
    j["record"] = true;
    j["record_timing"] = o.record_timing;
    j["median_per_s_off"] = off;
    j["samples_per_s_off"] = per_s_off;
    j["record_ratio"] = off > 0 ? on / off : 0.0;           // throughput on / off
    j["record_cost"] = off > 0 ? 1.0 - on / off : 0.0;      // fraction of throughput lost
    // Each repeat runs off, then on, back to back: the median of those pairs' ratios
    // cancels the drift of a shared machine that medians taken apart keep.
    std::vector<double> ratios;
    for (std::size_t i = 0; i < per_s.size() && i < per_s_off.size(); ++i)
      if (per_s_off[i] > 0) ratios.push_back(per_s[i] / per_s_off[i]);
    j["record_cost_paired"] = ratios.empty() ? 0.0 : 1.0 - median(ratios);
  }
  if (!extra.empty()) j["extra"] = extra;
  return j;
}

void print_text(const nlohmann::json& j) {
  std::string w = j["workload"];
  if (j.contains("inflight")) w += "/" + std::to_string(j["inflight"].get<unsigned>());
  if (j.contains("work_us")) w += " work-us=" + std::to_string(j["work_us"].get<double>()).substr(0, 4);
  std::printf("%-6s %-12s threads=%-2u ", j["framework"].get<std::string>().c_str(), w.c_str(), j["threads"].get<unsigned>());
  if (j.value("timed_out", false) && j["repeats"].get<unsigned>() == 0) {
    std::printf("timed out after %u s\n", j["timeout_s"].get<unsigned>());
    return;
  }
  std::printf("%s %s/s", human(j["median_per_s"]).c_str(), j["unit"].get<std::string>().c_str());
  if (j["workload"] == "many")
    std::printf("  %.3f s  peak RSS %.1f MiB", j["median_seconds"].get<double>(), j["peak_rss_mib"].get<double>());
  if (j.contains("record"))
    std::printf("  recorder off %s/s, on/off %.3f (cost %.1f%%; median of paired repeats %.1f%%)",
                human(j["median_per_s_off"]).c_str(), j["record_ratio"].get<double>(),
                100.0 * j["record_cost"].get<double>(), 100.0 * j["record_cost_paired"].get<double>());
  std::printf("  (median of %u)\n", j["repeats"].get<unsigned>());
}

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / (1024.0 * 1024 * 1024));
  return buf;
}

/// Refuses a `many` count whose actors cannot fit in what this process may use: the
/// machine's memory, and the address space `ulimit -v` (RLIMIT_AS) leaves it. Each actor
/// takes at least `backend().bytes_per_actor`; a count that passes may still run out
/// (the bound is low), and then ends with an error, not a crash.
void check_many_fits(std::uint64_t count) {
  const std::uint64_t each = backend().bytes_per_actor;
  if (each == 0) return;
  const long double need = static_cast<long double>(count) * each;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  const std::string what = "--count " + std::to_string(count) + ": 'many' needs at least " +
                           gib(static_cast<double>(need)) + " for " + std::to_string(count) + " actors (" +
                           std::to_string(each) + " bytes each)";
  if (pages > 0 && page > 0 && need > static_cast<long double>(pages) * page)
    throw std::invalid_argument(what + ", more than this machine's memory (" + gib(static_cast<double>(pages) * page) + ")");
  rlimit as{};
  if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) {
    const double used = proc_status_mib("VmSize") * 1024 * 1024;
    const double left = std::max(0.0, static_cast<double>(as.rlim_cur) - used);
    if (need > left)
      throw std::invalid_argument(what + ", more than the address space left under ulimit -v (" + gib(left) + " of " +
                                  gib(static_cast<double>(as.rlim_cur)) + ")");
  }
}

void run_messaging(const messaging_options& o) {
  const auto& be = backend();
  if (o.record && !be.supports_record)
    throw std::invalid_argument(std::string("--record: the ") + be.framework + " harness has no recorder");
  if (!o.placement.empty() && std::find(be.placements.begin(), be.placements.end(), o.placement) == be.placements.end())
    throw std::invalid_argument("--placement '" + o.placement + "' is not one of this harness's placements");
  const unsigned threads = o.threads ? o.threads : std::max(1u, std::thread::hardware_concurrency());

  std::vector<job> jobs;
  auto add = [&](const std::string& w, unsigned inflight) {
    auto n = o.count ? o.count : static_cast<std::uint64_t>(std::llround(static_cast<double>(default_count(w, inflight)) * o.scale));
    if (w == "fan" && o.work_us > 0 && !o.count)  // 8 x work_us per round on one loop: about 1 s
      n = std::max<std::uint64_t>(1, static_cast<std::uint64_t>(std::llround(o.scale * 1e6 / (fan_width * o.work_us))));
    if (w == "chain") n = std::max<std::uint64_t>(n - n % chain_length, std::uint64_t{chain_length} * inflight);
    n = std::max<std::uint64_t>(n, inflight);
    if (w == "many") check_many_fits(n);
    jobs.push_back({w, inflight, n});
  };
  if (o.workload == "all") {
    for (auto& w : workload_names()) {
      if (w == "chain" && o.inflight == 0) {
        add(w, 1);
        add(w, 64);
      } else {
        add(w, o.inflight ? o.inflight : (w == "chain" ? 64 : 1));
      }
    }
  } else {
    if (std::find(workload_names().begin(), workload_names().end(), o.workload) == workload_names().end())
      throw std::invalid_argument("unknown workload '" + o.workload + "'");
    add(o.workload, o.inflight ? o.inflight : (o.workload == "chain" ? 64 : 1));
  }

  if (o.child) {
    if (jobs.size() != 1) throw std::invalid_argument("--child runs one workload");
    run_params p{jobs[0].workload, threads, jobs[0].inflight, jobs[0].count, o.record, o.record_timing == "exact",
                 o.placement.empty() ? be.placements.front() : o.placement, 0};
    run_as_child(o, p);
    return;
  }

  nlohmann::json results = nlohmann::json::array();
  for (auto& jb : jobs) {
    auto j = run_job(o, jb, threads);
    if (!o.json) print_text(j);
    results.push_back(std::move(j));
  }
  if (o.json) {
    if (o.workload == "all") {
      nlohmann::json all{{"framework", be.framework}, {"threads", threads}, {"workload", "all"}, {"results", results}};
      std::cout << all.dump(2) << std::endl;
    } else {
      std::cout << results[0].dump(2) << std::endl;
    }
  }
}

void add_messaging(CLI::App& app) {
  auto opts = std::make_shared<messaging_options>();
  auto* sub = app.add_subcommand("messaging", "Message-passing workloads (pingpong, oneway, payload, chain, fan, many)");
  std::string names = "all";
  for (auto& w : workload_names()) names += ", " + w;
  sub->add_option("--workload,-w", opts->workload, "Workload: " + names)->capture_default_str();
  sub->add_option("--inflight", opts->inflight,
                  "chain: tokens circulating; fan: rounds in flight (default: chain 64, fan 1; 'all' runs chain at 1 and "
                  "64). At most " + std::to_string(max_inflight) +
                      ": every token can wait in one link's mailbox, every round in one worker's")
      ->transform(nerve::apps::whole_in(1u, max_inflight, std::to_string(max_inflight) + " (a mailbox's capacity)"));
  sub->add_option("--threads,-t", opts->threads, "Worker threads / event loops (default: hardware threads)")
      ->transform(nerve::apps::whole_in(1u, 256u));
  sub->add_option("--repeats,-r", opts->repeats, "Repeats; the median is reported")
      ->capture_default_str()
      ->transform(nerve::apps::whole_in(1u, 1000u));
  sub->add_option("--scale", opts->scale, "Multiply every workload's default size (quick runs: 0.1)")
      ->capture_default_str()
      ->transform(nerve::apps::real_in(0.001, 1000));
  sub->add_option("--count", opts->count,
                  "Exact size: round trips, messages, deliveries, rounds or actors (overrides --scale); many: refused "
                  "when that many actors cannot fit in the machine's memory or under ulimit -v")
      ->transform(nerve::apps::whole_in<std::uint64_t>(1, 10'000'000'000));
  const auto& be = backend();
  if (be.placements.size() > 1) {
    std::string ps;
    for (auto& p : be.placements) ps += (ps.empty() ? "" : ", ") + p;
    sub->add_option("--placement", opts->placement,
                    "Actors on loops: " + ps + " (default " + be.placements.front() +
                        "; auto = the runtime's default placement and migration, no hint; spread = round robin, every hop crosses loops; packed = neighbours share a loop: chain and fan in "
                        "contiguous blocks, the pingpong/oneway/payload pair on one loop)");
  }
  sub->add_option("--work-us", opts->work_us,
                  "fan: microseconds of real work (a calibrated compute loop) per message in each worker (default 0); "
                  "the default size becomes about 1 s of work on one loop")
      ->transform(nerve::apps::real_in(0, 1e6, " µs"));
  sub->add_option("--timeout", opts->timeout_s,
                  "Seconds a repeat may run (0: never): many's child process is then killed and the repeat reported "
                  "as timed out; any other workload is stopped and ends with an error naming it")
      ->capture_default_str()
      ->transform(nerve::apps::whole_in(0u, 86400u, "86400 (a day)"));
  sub->add_flag("--json", opts->json, "Print one JSON object (with 'all': an object holding the list 'results')");
  sub->add_flag("--record", opts->record,
                be.supports_record ? "Run each repeat with the recorder off and on; report both and the ratio"
                                   : "(not supported by this harness)");
  if (be.supports_record)
    sub->add_option("--record-timing", opts->record_timing,
                    "With --record: how handler runs are timed: shared (short runs in a row share a clock read, the "
                    "default) or exact (a clock read after every run)")
        ->check(CLI::IsMember({"shared", "exact"}))
        ->capture_default_str();
  sub->add_flag("--quiet,-q", opts->quiet, "No progress lines on stderr");
  sub->add_flag("--child", opts->child, "internal: one repeat in this process, sample as JSON")->group("");
  sub->callback([opts] { run_messaging(*opts); });
}

const subcommand_registration registration{"messaging", &add_messaging};

}  // namespace
}  // namespace nerve::bench

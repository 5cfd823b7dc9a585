// gpu_bench: completion latency of the two waiting backends and GEMM throughput,
// as JSON on stdout. The lead folds it into `nerve-bench gpu`.
//
//   gpu_bench [--quick] [--standin]
//
// Latency, per backend (poller, blocking):
//   idle_round_trip: record an event on an idle stream -> handler running on an
//                    io_context thread (includes cudaEventRecord and the wake-up).
//   gated_<hold>us:  a one-thread kernel spins on pinned memory; the host waits
//                    <hold> us (so the poller has backed off as far as it will),
//                    takes t0 and opens the gate; t1 is taken first thing in the
//                    handler on the loop. t1 - t0 bounds "event completes -> handler
//                    runs" from above (it adds the flag's trip over PCIe and the
//                    kernel's exit).
// GEMM: row-major C = op(A)·op(B) through cuBLAS fp32 (and TF32 where marked),
//   GFLOP/s = 2mnk / time, time = mean over repetitions after warm-up.
#include "gpu/blas.hpp"
#include "gpu/device.hpp"
#include "gpu/kernels.hpp"
#include "gpu/memory.hpp"
#include "gpu/testing.hpp"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <latch>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace nerve;
using clock_type = std::chrono::steady_clock;

namespace {

struct loop_thread {
  boost::asio::io_context ctx;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> guard{ctx.get_executor()};
  std::thread thread{[this] { ctx.run(); }};
  ~loop_thread() {
    guard.reset();
    thread.join();
  }
};

struct stats {
  double median = 0, p99 = 0, min = 0, max = 0;
  std::size_t n = 0;
};

stats summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  stats s;
  s.n = v.size();
  if (v.empty()) return s;
  s.median = v[v.size() / 2];
  s.p99 = v[std::min(v.size() - 1, v.size() * 99 / 100)];
  s.min = v.front();
  s.max = v.back();
  return s;
}

std::string json(const stats& s) {
  std::ostringstream o;
  o << "{\"median_us\": " << s.median << ", \"p99_us\": " << s.p99 << ", \"min_us\": " << s.min
    << ", \"max_us\": " << s.max << ", \"samples\": " << s.n << "}";
  return o.str();
}

double cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + 1e-6 * double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

void busy_wait(std::chrono::microseconds d) {
  const auto until = clock_type::now() + d;
  while (clock_type::now() < until) {
  }
}

std::string latency(gpu::backend_kind kind, gpu::wait_mode mode, bool quick) {
  gpu::device_options o;
  o.backend = kind;
  o.waits = mode;
  loop_thread loop;
  std::ostringstream out;
  {
    gpu::device dev(o);
    auto s = dev.create_stream();
    gpu::testing::gate gate(dev);
    const int scale = quick ? 5 : 1;

    // Idle round trip.
    std::vector<double> idle;
    for (int i = 0; i < 2000 / scale; ++i) {
      std::latch done(1);
      clock_type::time_point t1;
      const auto t0 = clock_type::now();
      s.async_wait(loop.ctx.get_executor(), [&](std::error_code) {
        t1 = clock_type::now();
        done.count_down();
      });
      done.wait();
      if (i >= 50) idle.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    out << "{\"idle_round_trip\": " << json(summarize(idle));

    // Gated: event completes at a known time after the wait was registered.
    const std::pair<int, int> holds[] = {{0, 1000}, {50, 1000}, {1000, 400}, {5000, 200}};
    for (auto [hold, reps] : holds) {
      std::vector<double> lat;
      for (int i = 0; i < reps / scale + 10; ++i) {
        gate.close();
        gate.enqueue(s);
        std::latch done(1);
        clock_type::time_point t1;
        s.async_wait(loop.ctx.get_executor(), [&](std::error_code) {
          t1 = clock_type::now();
          done.count_down();
        });
        busy_wait(std::chrono::microseconds(hold));
        const auto t0 = clock_type::now();
        gate.open();
        done.wait();
        if (i >= 10) lat.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      }
      out << ", \"gated_" << hold << "us\": " << json(summarize(lat));
    }
    s.synchronize();

    // CPU burnt by the completion threads while nothing is pending.
    const double c0 = cpu_seconds();
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const double idle_cpu = (cpu_seconds() - c0) / 0.5;
    out << ", \"idle_cpu_fraction\": " << idle_cpu;
    dev.shutdown();
  }
  out << "}";
  return out.str();
}

std::string gemm_bench(gpu::backend_kind kind, bool quick) {
  gpu::device_options o;
  o.backend = kind;
  gpu::device dev(o);
  auto s = dev.create_stream();
  auto s_tf32 = dev.create_stream(gpu::stream_options{true});
  struct shape {
    int m, n, k;
    gpu::transpose ta, tb;
    const char* what;
  };
  using gpu::transpose;
  std::vector<shape> shapes = {
      {256, 512, 784, transpose::no, transpose::yes, "mlp fwd b256 784->512 (x·Wᵀ)"},
      {256, 784, 512, transpose::no, transpose::no, "mlp dX b256 (dY·W)"},
      {512, 784, 256, transpose::yes, transpose::no, "mlp dW b256 (dYᵀ·X)"},
      {1024, 1024, 1024, transpose::no, transpose::yes, "deep-mlp fwd b1024 1024->1024"},
      {1024, 1024, 1024, transpose::yes, transpose::no, "deep-mlp dW b1024"},
      {128, 128, 128, transpose::no, transpose::no, "square"},
      {512, 512, 512, transpose::no, transpose::no, "square"},
      {2048, 2048, 2048, transpose::no, transpose::no, "square"},
      {4096, 4096, 4096, transpose::no, transpose::no, "square"},
      {8192, 8192, 8192, transpose::no, transpose::no, "square"},
  };
  if (kind == gpu::backend_kind::standin) shapes.resize(3);  // plain loops: keep it short
  std::ostringstream out;
  out << "[";
  bool first = true;
  for (const auto& sh : shapes) {
    for (bool tf32 : {false, true}) {
      if (tf32 && (sh.m < 2048 || kind == gpu::backend_kind::standin)) continue;
      auto& st = tf32 ? s_tf32 : s;
      const std::size_t a_n = std::size_t(sh.m) * sh.k, b_n = std::size_t(sh.k) * sh.n, c_n = std::size_t(sh.m) * sh.n;
      gpu::device_buffer a(st, a_n * 4), b(st, b_n * 4), c(st, c_n * 4);
      gpu::fill(st, a_n, 0.5f, static_cast<float*>(a.data()));
      gpu::fill(st, b_n, 0.25f, static_cast<float*>(b.data()));
      auto run = [&] {
        gpu::gemm(st, sh.ta, sh.tb, sh.m, sh.n, sh.k, 1.0f, static_cast<float*>(a.data()),
                  static_cast<float*>(b.data()), 0.0f, static_cast<float*>(c.data()));
      };
      for (int i = 0; i < 3; ++i) run();
      st.synchronize();
      const double flop = 2.0 * sh.m * sh.n * sh.k;
      int reps = int(std::clamp(2e11 / flop, 3.0, quick ? 50.0 : 500.0));
      if (kind == gpu::backend_kind::standin) reps = 1;
      const auto t0 = clock_type::now();
      for (int i = 0; i < reps; ++i) run();
      st.synchronize();
      const double secs = std::chrono::duration<double>(clock_type::now() - t0).count() / reps;
      out << (first ? "" : ",") << "\n    {\"m\": " << sh.m << ", \"n\": " << sh.n << ", \"k\": " << sh.k
          << ", \"ta\": " << (sh.ta == transpose::yes) << ", \"tb\": " << (sh.tb == transpose::yes)
          << ", \"tf32\": " << tf32 << ", \"what\": \"" << sh.what << "\", \"reps\": " << reps
          << ", \"us\": " << secs * 1e6 << ", \"gflops\": " << flop / secs / 1e9 << "}";
      first = false;
    }
  }
  out << "\n  ]";
  return out.str();
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, standin = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) quick = true;
    if (!std::strcmp(argv[i], "--standin")) standin = true;
  }
  try {
    const auto kind = standin || gpu::device::cuda_device_count() == 0 ? gpu::backend_kind::standin
                                                                          : gpu::backend_kind::cuda;
    std::string name;
    {
      gpu::device_options o;
      o.backend = kind;
      gpu::device d(o);
      name = d.name();
    }
    std::printf("{\n  \"device\": \"%s\",\n  \"backend\": \"%s\",\n", name.c_str(),
                kind == gpu::backend_kind::cuda ? "cuda" : "standin");
    std::printf("  \"latency\": {\n    \"poller\": %s,\n", latency(kind, gpu::wait_mode::poller, quick).c_str());
    std::printf("    \"blocking\": %s\n  },\n", latency(kind, gpu::wait_mode::blocking, quick).c_str());
    std::printf("  \"gemm\": %s\n}\n", gemm_bench(kind, quick).c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_bench: %s\n", e.what());
    return 1;
  }
}

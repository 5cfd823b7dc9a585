// The completion path on a real GPU: FIFO across streams and loops with kernels
// in between, device-resident hand-over with an event, shutdown with work held
// on the device, both waiting backends.
#include "gpu/kernels.hpp"
#include "gpu/status.hpp"
#include "gpu/testing.hpp"
#include "tests/gpu/gpu_fixture.hpp"
#include "tests/gpu/loops.hpp"

#include <doctest/doctest.h>

#include <boost/asio/io_context.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <latch>
#include <memory>

using namespace nerve;
using namespace nerve::gpu::test;

namespace {
const char* name_of(gpu::wait_mode m) { return m == gpu::wait_mode::poller ? "poller" : "blocking"; }
}  // namespace

TEST_SUITE("gpu.device.completion") {
  TEST_CASE("many streams on many loops: every completion once, FIFO per stream, data ready") {
    for (auto mode : {gpu::wait_mode::poller, gpu::wait_mode::blocking}) {
      SUBCASE(name_of(mode)) {
        constexpr int streams = 6, loops = 3, per_stream = 300;
        constexpr std::size_t n = 4096;
        std::vector<std::unique_ptr<loop_thread>> ls;
        for (int i = 0; i < loops; ++i) ls.push_back(std::make_unique<loop_thread>());
        gpu::device dev(cuda_options(mode));
        std::vector<gpu::stream> ss;
        std::vector<gpu::device_buffer> bufs;
        std::vector<gpu::pinned_buffer> hosts;
        for (int i = 0; i < streams; ++i) {
          ss.push_back(dev.create_stream());
          bufs.emplace_back(ss.back(), n * sizeof(float));
          hosts.emplace_back(dev, per_stream * sizeof(float));
        }
        std::vector<int> next(streams, 0);
        std::atomic<int> bad_order{0}, errors{0}, bad_data{0};
        std::latch done(streams * per_stream);
        for (int k = 0; k < per_stream; ++k)
          for (int i = 0; i < streams; ++i) {
            auto* buf = static_cast<float*>(bufs[i].data());
            gpu::fill(ss[i], n, float(k), buf);
            gpu::copy_async(ss[i], hosts[i].as<float>().data() + k, buf + n - 1, sizeof(float));
            ss[i].async_wait(ls[i % loops]->executor(), [&, i, k](std::error_code ec) {
              if (ec) ++errors;
              if (next[i] != k) ++bad_order;
              next[i] = k + 1;
              // The copy before the event has landed in pinned memory.
              if (hosts[i].as<float>()[k] != float(k)) ++bad_data;
              done.count_down();
            });
          }
        done.wait();
        dev.shutdown();
        CHECK(errors == 0);
        CHECK(bad_order == 0);
        CHECK(bad_data == 0);
      }
    }
  }

  TEST_CASE("a device buffer changes hands with its ready event, no host sync") {
    loop_thread loop;
    gpu::device dev(cuda_options());
    gpu::testing::gate gate(dev);
    auto producer = dev.create_stream(), consumer = dev.create_stream();
    constexpr std::size_t n = 1 << 20;
    gpu::device_buffer buf(producer, n * sizeof(float));
    gate.enqueue(producer);  // the producer's work is still held when the consumer enqueues
    gpu::fill(producer, n, 2.0f, static_cast<float*>(buf.data()));
    const gpu::event ready = producer.record();
    CHECK_FALSE(ready.ready());
    consumer.wait(ready);
    buf.set_stream(consumer);  // the consumer frees it after its own work
    gpu::scale(consumer, n, 3.0f, static_cast<float*>(buf.data()));
    gpu::pinned_buffer out(dev, n * sizeof(float));
    gpu::copy_async(consumer, out.data(), buf.data(), n * sizeof(float));
    std::latch done(1);
    std::error_code got;
    consumer.async_wait(loop.executor(), [&](std::error_code ec) {
      got = ec;
      done.count_down();
    });
    gate.open();
    done.wait();
    dev.shutdown();
    CHECK(!got);
    auto v = out.as<float>();
    CHECK(std::all_of(v.begin(), v.end(), [](float x) { return x == 6.0f; }));
  }

  TEST_CASE("shutdown with work held on the device cancels every waiter") {
    boost::asio::io_context ctx;
    gpu::device dev(cuda_options(gpu::wait_mode::poller));
    gpu::testing::gate gate(dev);
    std::vector<gpu::stream> ss;
    for (int i = 0; i < 3; ++i) {
      ss.push_back(dev.create_stream());
      gate.enqueue(ss.back());
    }
    int cancelled = 0, other = 0;
    for (auto& s : ss)
      for (int k = 0; k < 10; ++k)
        s.async_wait(ctx.get_executor(), [&](std::error_code ec) { ec == gpu::errc::cancelled ? ++cancelled : ++other; });
    const auto t0 = std::chrono::steady_clock::now();
    dev.shutdown();
    const auto took = std::chrono::steady_clock::now() - t0;
    ctx.run();
    CHECK(cancelled == 30);
    CHECK(other == 0);
    CHECK(took < std::chrono::seconds(1));
    gate.open();
    for (auto& s : ss) s.synchronize();
  }

  TEST_CASE("completion latency of an idle stream, both backends (reported, not asserted)") {
    for (auto mode : {gpu::wait_mode::poller, gpu::wait_mode::blocking}) {
      loop_thread loop;
      gpu::device dev(cuda_options(mode));
      auto s = dev.create_stream();
      std::vector<double> us;
      for (int i = 0; i < 500; ++i) {
        std::latch done(1);
        std::chrono::steady_clock::time_point t1;
        const auto t0 = std::chrono::steady_clock::now();
        s.async_wait(loop.executor(), [&](std::error_code) {
          t1 = std::chrono::steady_clock::now();
          done.count_down();
        });
        done.wait();
        us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      }
      dev.shutdown();
      std::sort(us.begin(), us.end());
      MESSAGE(name_of(mode) << ": record+wait round trip on an idle stream, median " << us[us.size() / 2]
                            << " us, p99 " << us[us.size() * 99 / 100] << " us");
    }
  }
}

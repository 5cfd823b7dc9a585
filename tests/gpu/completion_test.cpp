// The completion path on the CPU stand-in: the same poller and blocking waiters
// a GPU drives, with fake streams and events. Runs everywhere, TSan included.
#include "gpu/detail/device_core.hpp"
#include "gpu/device.hpp"
#include "gpu/kernels.hpp"
#include "gpu/memory.hpp"
#include "gpu/message.hpp"
#include "gpu/status.hpp"
#include "gpu/testing.hpp"
#include "tests/gpu/loops.hpp"

#include <doctest/doctest.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <latch>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

using namespace nerve;
using nerve::gpu::test::loop_thread;

namespace {

bool sanitized() {
  const char* s = std::getenv("NERVE_TEST_SCALE");
  return s && std::string(s) == "sanitize";
}

gpu::device_options standin(gpu::wait_mode mode) {
  gpu::device_options o;
  o.backend = gpu::backend_kind::standin;
  o.waits = mode;
  return o;
}

const char* name_of(gpu::wait_mode m) { return m == gpu::wait_mode::poller ? "poller" : "blocking"; }

}  // namespace

TEST_SUITE("gpu.completion") {
  TEST_CASE("handlers run on their loop, in the order they were registered") {
    for (auto mode : {gpu::wait_mode::poller, gpu::wait_mode::blocking}) {
      SUBCASE(name_of(mode)) {
        gpu::device dev(standin(mode));
        CHECK(dev.kind() == gpu::backend_kind::standin);
        auto s = dev.create_stream();
        loop_thread loop;
        constexpr int n = 200;
        std::atomic<int> ran{0};         // written by the stream's worker
        std::vector<int> seen;           // written on the loop
        std::atomic<int> off_loop{0};
        std::latch done(n);
        for (int i = 0; i < n; ++i) {
          s.enqueue_host([&ran] { ++ran; });
          s.async_wait(loop.executor(), [&, i](std::error_code ec) {
            CHECK(!ec);
            if (!loop.running_here()) ++off_loop;
            seen.push_back(i);
            // The work before the event has run by the time its handler runs.
            CHECK(ran.load() >= i + 1);
            done.count_down();
          });
        }
        done.wait();
        dev.shutdown();  // no post in flight once the completion threads are joined
        loop.stop();
        CHECK(off_loop == 0);
        REQUIRE(seen.size() == std::size_t(n));
        for (int i = 0; i < n; ++i) CHECK(seen[i] == i);
      }
    }
  }

  TEST_CASE("many streams on many loops: every completion once, FIFO per stream") {
    for (auto mode : {gpu::wait_mode::poller, gpu::wait_mode::blocking}) {
      SUBCASE(name_of(mode)) {
        gpu::device dev(standin(mode));
        constexpr int streams = 8, loops = 4;
        const int per_stream = sanitized() ? 100 : 500;
        std::vector<std::unique_ptr<loop_thread>> ls;
        for (int i = 0; i < loops; ++i) ls.push_back(std::make_unique<loop_thread>());
        std::vector<gpu::stream> ss;
        for (int i = 0; i < streams; ++i) ss.push_back(dev.create_stream());
        // next[i] is touched only by stream i's handlers, which all run on loop i % loops.
        std::vector<int> next(streams, 0);
        std::atomic<int> out_of_order{0}, errors{0};
        std::latch done(streams * per_stream);
        // Interleave registrations across streams from this thread.
        for (int k = 0; k < per_stream; ++k)
          for (int i = 0; i < streams; ++i) {
            if (k % 7 == 0) ss[i].enqueue_host([] {});
            ss[i].async_wait(ls[i % loops]->executor(), [&, i, k](std::error_code ec) {
              if (ec) ++errors;
              if (next[i] != k) ++out_of_order;
              next[i] = k + 1;
              done.count_down();
            });
          }
        done.wait();
        dev.shutdown();
        for (auto& l : ls) l->stop();
        CHECK(errors == 0);
        CHECK(out_of_order == 0);
        for (int i = 0; i < streams; ++i) CHECK(next[i] == per_stream);
      }
    }
  }

  TEST_CASE("shutdown with waits pending cancels each one and hangs nothing") {
    for (auto mode : {gpu::wait_mode::poller, gpu::wait_mode::blocking}) {
      SUBCASE(name_of(mode)) {
        gpu::device dev(standin(mode));
        gpu::testing::gate gate(dev);
        std::vector<gpu::stream> ss;
        for (int i = 0; i < 3; ++i) {
          ss.push_back(dev.create_stream());
          gate.enqueue(ss.back());  // nothing behind this runs before the gate opens
        }
        boost::asio::io_context ctx;
        constexpr int per_stream = 20;
        int cancelled = 0, other = 0;
        for (auto& s : ss)
          for (int k = 0; k < per_stream; ++k)
            s.async_wait(ctx.get_executor(), [&](std::error_code ec) {
              if (ec == gpu::errc::cancelled && ec == std::errc::operation_canceled)
                ++cancelled;
              else
                ++other;
            });
        dev.shutdown();  // returns with the streams still held by the gate
        // A wait registered after shutdown is cancelled at once.
        ss[0].async_wait(ctx.get_executor(), [&](std::error_code ec) { ec == gpu::errc::cancelled ? ++cancelled : ++other; });
        ctx.run();  // every handler was posted by shutdown: this returns
        CHECK(cancelled == 3 * per_stream + 1);
        CHECK(other == 0);
        gate.open();
        for (auto& s : ss) s.synchronize();
      }
    }
  }

  TEST_CASE("a failed stream's error reaches every waiter behind the failure, and only that stream") {
    for (auto mode : {gpu::wait_mode::poller, gpu::wait_mode::blocking}) {
      SUBCASE(name_of(mode)) {
        gpu::device dev(standin(mode));
        gpu::testing::gate gate(dev);
        auto bad = dev.create_stream();
        auto good = dev.create_stream();
        gate.enqueue(bad);
        gate.enqueue(good);
        loop_thread loop;
        std::mutex m;
        std::vector<std::error_code> bad_codes, good_codes;
        std::latch done(2 + 4 + 3);
        auto record_into = [&](std::vector<std::error_code>& v) {
          return [&, pv = &v](std::error_code ec) {
            {
              std::lock_guard lk(m);
              pv->push_back(ec);
            }
            done.count_down();
          };
        };
        bad.async_wait(loop.executor(), record_into(bad_codes));
        bad.async_wait(loop.executor(), record_into(bad_codes));
        gpu::testing::enqueue_fault(bad);  // the stand-in ignores the kind
        for (int i = 0; i < 4; ++i) {
          bad.enqueue_host([] {});
          bad.async_wait(loop.executor(), record_into(bad_codes));
        }
        for (int i = 0; i < 3; ++i) good.async_wait(loop.executor(), record_into(good_codes));
        gate.open();
        done.wait();
        dev.shutdown();  // no post in flight once the completion threads are joined
        loop.stop();
        REQUIRE(bad_codes.size() == 6);
        CHECK(!bad_codes[0]);
        CHECK(!bad_codes[1]);
        for (int i = 2; i < 6; ++i) {
          CHECK(bad_codes[i] == gpu::errc::stream_failed);
          CHECK(bad_codes[i].message().find("stream failed") != std::string::npos);
        }
        REQUIRE(good_codes.size() == 3);
        for (auto& ec : good_codes) CHECK(!ec);
        CHECK_THROWS_AS(bad.synchronize(), gpu::error);
        CHECK_NOTHROW(good.synchronize());
      }
    }
  }

  TEST_CASE("the work counter sees one begin and one end per wait") {
    for (auto mode : {gpu::wait_mode::poller, gpu::wait_mode::blocking}) {
      SUBCASE(name_of(mode)) {
        std::atomic<int> begun{0}, ended{0};
        auto o = standin(mode);
        o.counter.begin = [&] { ++begun; };
        o.counter.end = [&] { ++ended; };
        gpu::device dev(o);
        auto s = dev.create_stream();
        {
          boost::asio::io_context ctx;
          auto guard = boost::asio::make_work_guard(ctx);
          int ran = 0;
          for (int i = 0; i < 50; ++i) s.async_wait(ctx.get_executor(), [&](std::error_code) { ++ran; });
          CHECK(begun == 50);
          s.synchronize();
          // The end comes after the handler, on the loop: run them all.
          while (ran < 50) ctx.run_one();
          CHECK(ended == 50);
          // Handlers whose io_context is destroyed before they run still end.
          for (int i = 0; i < 10; ++i) s.async_wait(ctx.get_executor(), [&](std::error_code) { ++ran; });
          s.synchronize();
          dev.shutdown();  // joins the poller: every handler is posted
        }
        CHECK(begun == 60);
        CHECK(ended == 60);
      }
    }
  }

  TEST_CASE("a stream waits on another stream's event without blocking the host") {
    gpu::device dev(standin(gpu::wait_mode::poller));
    gpu::testing::gate gate(dev);
    auto producer = dev.create_stream();
    auto consumer = dev.create_stream();
    std::atomic<int> produced{0};
    int seen_by_consumer = -1;  // written on the consumer's worker, read after its handler
    gate.enqueue(producer);
    producer.enqueue_host([&] { produced = 42; });
    auto ready = producer.record();
    CHECK_FALSE(ready.ready());
    consumer.wait(ready);  // returns at once
    consumer.enqueue_host([&] { seen_by_consumer = produced.load(); });
    loop_thread loop;
    std::latch done(1);
    std::error_code got;
    consumer.async_wait(loop.executor(), [&](std::error_code ec) {
      got = ec;
      done.count_down();
    });
    gate.open();
    done.wait();
    dev.shutdown();
    loop.stop();
    CHECK(!got);
    CHECK(seen_by_consumer == 42);
    CHECK(ready.ready());
    CHECK(!ready.status());
    CHECK_NOTHROW(ready.wait());
  }

  TEST_CASE("a device message carries the tensor and its ready event to another stream, no host sync") {
    loop_thread loop;
    gpu::device dev(standin(gpu::wait_mode::poller));
    gpu::testing::gate gate(dev);
    auto producer = dev.create_stream(), consumer = dev.create_stream();
    gate.enqueue(producer);  // the producer's work is held while the consumer enqueues
    gpu::device_tensor y(producer, {4, 8});
    gpu::fill(producer, y.size(), 2.0f, y.data());
    auto m = gpu::device_message::ready_on(producer, std::move(y));
    CHECK_FALSE(m.ready.ready());
    auto& x = m.accept(consumer);
    gpu::scale(consumer, x.size(), 3.0f, x.data());
    gpu::pinned_buffer staged(dev, x.bytes());  // pinned: a copy into pageable memory would block here
    gpu::copy_async(consumer, staged.data(), x.data(), x.bytes());
    std::latch done(1);
    std::error_code got;
    consumer.async_wait(loop.executor(), [&](std::error_code ec) {
      got = ec;
      done.count_down();
    });
    gate.open();
    done.wait();
    CHECK(!got);
    auto out = staged.as<float>();
    CHECK(std::all_of(out.begin(), out.end(), [](float v) { return v == 6.0f; }));
    m = {};  // freed in order on the consumer
    consumer.synchronize();
    dev.shutdown();
  }

  TEST_CASE("events are pooled") {
    boost::asio::io_context ctx;  // outlives the device (see completion.hpp)
    auto guard = boost::asio::make_work_guard(ctx);
    gpu::device dev(standin(gpu::wait_mode::poller));
    auto s = dev.create_stream();
    int ran = 0;
    for (int round = 1; round <= 20; ++round) {
      for (int i = 0; i < 8; ++i) s.async_wait(ctx.get_executor(), [&](std::error_code) { ++ran; });
      while (ran < 8 * round) ctx.run_one();
      // All handlers have run: the events are back in the pool (the poller
      // releases them before posting).
    }
    CHECK(dev.core().events_created() <= 16);
  }

  TEST_CASE("no device: asking for CUDA where there is none is an error, not a crash") {
    if (gpu::device::cuda_device_count() > 0) return;
    gpu::device_options o;
    o.backend = gpu::backend_kind::cuda;
    try {
      gpu::device dev(o);
      FAIL("opened a CUDA device that does not exist");
    } catch (const gpu::error& e) {
      CHECK(e.code() == gpu::errc::no_device);
    }
    gpu::device automatic;  // falls back to the stand-in
    CHECK(automatic.kind() == gpu::backend_kind::standin);
  }
}

// The two completion queues: the per-device poller (default) and the
// per-stream blocking waiters it is measured against.

#include "gpu/detail/completion_queue.hpp"
#include "gpu/status.hpp"

#include "actors/detail/loop_state.hpp"
#include "actors/recorder.hpp"

#include <boost/asio/post.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define NERVE_CPU_RELAX() _mm_pause()
#else
#define NERVE_CPU_RELAX() std::this_thread::yield()
#endif

namespace nerve::gpu::detail {

namespace {
/// A traced wait completed (observed now): its span on the stream's track, the arrow into
/// it from the enqueuing handler, and the arrow out of it to the completion handler.
/// Returns that second arrow's id.
std::uint64_t trace_completion(const wait_trace& t) {
  auto& rec = *t.rec;
  const auto done = std::max(rec.now(), t.start_ns + 1);
  rec.span(t.stream_track, "gpu", t.name, t.start_ns, done, t.mb, nullptr, t.stream, t.device);
  rec.flow(actors::record_kind::flow_end, t.stream_track, t.name, t.flow_in, t.start_ns);
  const auto out = rec.next_flow();
  rec.flow(actors::record_kind::flow_start, t.stream_track, t.name, out, done - 1);  // inside the span
  return out;
}
}  // namespace

void deliver(waiter&& w, std::error_code ec) {
  auto ex = std::move(w.executor);
  // Back to the pool (and the stream released) before the handler may run.
  w.event.reset();
  w.stream.reset();
  if (w.trace.rec) {
    const auto flow = trace_completion(w.trace);
    boost::asio::post(ex, [h = std::move(w.handler), t = std::move(w.token), ec, tr = w.trace, flow,
                           posted = w.trace.rec->now()]() mutable {
      auto& rec = *tr.rec;
      const auto start = rec.now();
      h(ec);
      const auto* loop = actors::detail::current_loop;
      // value: the queue wait, completion observed -> handler start.
      rec.write({.ts_ns = start, .dur_ns = rec.now() - start, .flow = flow, .mb = tr.mb, .value = start - posted,
                 .name = "completion", .track = tr.completion_track, .peer = tr.stream_track,
                 .aux = loop ? static_cast<std::int32_t>(loop->index) : -1, .kind = actors::record_kind::handle});
      t.reset();
    });
    return;
  }
  boost::asio::post(ex, [h = std::move(w.handler), t = std::move(w.token), ec]() mutable {
    h(ec);
    t.reset();
  });
}

namespace {

using clock = std::chrono::steady_clock;

/// One thread per device. Waiters come in through `incoming_` (under the lock);
/// the lanes (one FIFO per stream) belong to the poller thread alone.
class poller final : public completion_queue {
 public:
  poller(backend& b, const poller_options& o) : backend_(b), options_(o), thread_([this] { run(); }) {}
  ~poller() override { shutdown(); }

  void submit(waiter&& w) override {
    bool notify = false;
    {
      std::lock_guard lk(m_);
      if (!stopping_) {
        incoming_.push_back(std::move(w));
        has_incoming_.store(true, std::memory_order_release);
        notify = sleeping_.load(std::memory_order_relaxed);
        if (!notify) return;
      }
    }
    if (notify) {
      cv_.notify_one();
      return;
    }
    deliver(std::move(w), errc::cancelled);  // after shutdown
  }

  void wake() noexcept override {
    if (!sleeping_.load(std::memory_order_acquire)) return;
    {
      std::lock_guard lk(m_);
      woken_ = true;
    }
    cv_.notify_one();
  }

  void shutdown() noexcept override {
    {
      std::lock_guard lk(m_);
      stopping_.store(true, std::memory_order_release);
    }
    cv_.notify_one();
    if (!thread_.joinable()) return;
    if (thread_.get_id() == std::this_thread::get_id())
      thread_.detach();  // only if a handler's captures ended the device from this thread
    else
      thread_.join();
  }

 private:
  void take_incoming_locked() {
    for (auto& w : incoming_) {
      auto id = w.stream->id;
      lanes_[id].push_back(std::move(w));
    }
    incoming_.clear();
    has_incoming_.store(false, std::memory_order_relaxed);
  }

  /// Queries the front of every lane; delivers what is done. True if anything was.
  bool poll_lanes() {
    bool progress = false;
    for (auto it = lanes_.begin(); it != lanes_.end();) {
      auto& q = it->second;
      while (!q.empty()) {
        const event_state st = backend_.query(*q.front().event);
        if (!st.ready) break;
        progress = true;
        if (st.error) {
          // The stream failed: every waiter still behind this one gets the error.
          while (!q.empty()) {
            deliver(std::move(q.front()), st.error);
            q.pop_front();
          }
          break;
        }
        deliver(std::move(q.front()), {});
        q.pop_front();
      }
      if (q.empty())
        it = lanes_.erase(it);
      else
        ++it;
    }
    return progress;
  }

  void sleep_locked(std::unique_lock<std::mutex>& lk, bool timed) {
    sleeping_.store(true, std::memory_order_release);
    auto ready = [&] { return stopping_ || !incoming_.empty() || woken_; };
    if (timed)
      cv_.wait_for(lk, options_.sleep, ready);
    else
      cv_.wait(lk, ready);
    sleeping_.store(false, std::memory_order_relaxed);
    woken_ = false;
  }

  void run() {
    auto last_progress = clock::now();
    for (;;) {
      if (lanes_.empty() || has_incoming_.load(std::memory_order_acquire) ||
          stopping_.load(std::memory_order_acquire)) {
        std::unique_lock lk(m_);
        if (lanes_.empty() && incoming_.empty() && !stopping_) sleep_locked(lk, false);  // idle: no busy loop
        if (stopping_) {
          take_incoming_locked();
          break;
        }
        if (!incoming_.empty()) {
          take_incoming_locked();
          last_progress = clock::now();  // new work restarts the back-off
        }
      }
      if (poll_lanes()) {
        last_progress = clock::now();
        continue;
      }
      if (lanes_.empty()) continue;
      const auto idle = clock::now() - last_progress;
      if (idle < options_.spin) {
        for (int i = 0; i < 16; ++i) NERVE_CPU_RELAX();
      } else if (idle < options_.yield) {
        std::this_thread::yield();
      } else {
        std::unique_lock lk(m_);
        if (!stopping_ && incoming_.empty()) sleep_locked(lk, true);
      }
    }
    // Shutdown: every waiter still here is cancelled, in FIFO order per stream.
    for (auto& [id, q] : lanes_)
      for (auto& w : q) deliver(std::move(w), errc::cancelled);
    lanes_.clear();
  }

  backend& backend_;
  const poller_options options_;
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<waiter> incoming_;            // guarded by m_
  bool woken_ = false;                      // guarded by m_
  std::atomic<bool> stopping_{false};       // written under m_, read without it too
  std::atomic<bool> sleeping_{false};       // written under m_; read without it by wake()
  std::atomic<bool> has_incoming_{false};   // hint, read without the lock
  std::unordered_map<std::uint64_t, std::deque<waiter>> lanes_;  // poller thread only
  std::thread thread_;                      // last: starts after the members above exist
};

/// One thread per stream, blocked in the backend's event wait, FIFO.
class blocking_waiter final : public completion_queue {
  struct lane {
    std::mutex m;
    std::condition_variable cv;
    std::deque<waiter> q;  // guarded by m
    bool stop = false;     // guarded by m
    std::thread thread;
  };

 public:
  explicit blocking_waiter(backend& b) : backend_(b) {}
  ~blocking_waiter() override { shutdown(); }

  void submit(waiter&& w) override {
    {
      std::lock_guard lk(m_);
      if (!stopping_) {
        auto& l = lanes_[w.stream->id];
        if (!l) {
          l = std::make_unique<lane>();
          l->thread = std::thread([this, p = l.get()] { run(*p); });
        }
        {
          std::lock_guard ll(l->m);
          l->q.push_back(std::move(w));
        }
        l->cv.notify_one();
        return;
      }
    }
    deliver(std::move(w), errc::cancelled);
  }

  void shutdown() noexcept override {
    std::unordered_map<std::uint64_t, std::unique_ptr<lane>> lanes;
    {
      std::lock_guard lk(m_);
      stopping_ = true;
      lanes.swap(lanes_);
    }
    for (auto& [id, l] : lanes) {
      {
        std::lock_guard ll(l->m);
        l->stop = true;
      }
      l->cv.notify_one();
    }
    backend_.interrupt_waits();  // the stand-in can; a GPU wait ends with its work
    for (auto& [id, l] : lanes)
      if (l->thread.joinable()) l->thread.join();
  }

 private:
  void run(lane& l) {
    std::unique_lock lk(l.m);
    for (;;) {
      l.cv.wait(lk, [&] { return l.stop || !l.q.empty(); });
      if (l.stop) break;
      waiter w = std::move(l.q.front());
      l.q.pop_front();
      lk.unlock();
      const std::error_code ec = backend_.wait(*w.event);
      deliver(std::move(w), ec);
      lk.lock();
    }
    for (auto& w : l.q) deliver(std::move(w), errc::cancelled);
    l.q.clear();
  }

  backend& backend_;
  std::mutex m_;
  bool stopping_ = false;                                          // guarded by m_
  std::unordered_map<std::uint64_t, std::unique_ptr<lane>> lanes_;  // guarded by m_
};

}  // namespace

std::unique_ptr<completion_queue> make_poller(backend& b, const poller_options& o) {
  return std::make_unique<poller>(b, o);
}
std::unique_ptr<completion_queue> make_blocking_waiter(backend& b) { return std::make_unique<blocking_waiter>(b); }

}  // namespace nerve::gpu::detail

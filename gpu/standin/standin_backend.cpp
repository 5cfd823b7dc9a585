#include "gpu/standin/standin_backend.hpp"

#include "gpu/device.hpp"
#include "gpu/standin/cpu_kernels.hpp"
#include "gpu/status.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <variant>
#include <vector>

namespace nerve::gpu::detail {
namespace {

class standin;

/// One record of an event: a stream wait holds the record that was current when it was
/// enqueued, as cudaStreamWaitEvent does, so re-recording the (pooled) event later
/// neither satisfies nor changes that wait.
struct fake_record {
  bool done = false;       // guarded by the event's m
  std::error_code error;   // guarded by the event's m
};

/// A fake event: its state is its latest record's, complete when its stream's worker
/// reaches the marker.
class fake_event final : public event_impl {
 public:
  std::mutex m;
  std::condition_variable cv;
  std::shared_ptr<fake_record> current;  // guarded by m: the latest record (null: never recorded)
  /// Under m. A never-recorded event is complete, as in CUDA.
  bool done() const { return !current || current->done; }
};

/// A fake stream: one worker thread runs the tasks in order. After a task
/// throws, the stream has failed: later work is skipped and its events report
/// the error (like a sticky CUDA error, but per stream).
class fake_stream final : public stream_impl {
 public:
  struct task {
    unique_function<void()> fn;
    fake_event* marker = nullptr;  // set: complete `rec` of this event instead of running fn
    bool always = false;           // runs even after a failure (frees)
    std::shared_ptr<fake_record> rec = nullptr;  // with marker: the record it completes
  };

  explicit fake_stream(standin& b) : backend_(b), worker_([this] { run(); }) {}

  ~fake_stream() override {
    {
      std::lock_guard lk(m_);
      stop_ = true;
    }
    cv_.notify_one();
    worker_.join();  // the work already enqueued runs first, as on a GPU
  }

  void push(task t) {
    {
      std::lock_guard lk(m_);
      q_.push_back(std::move(t));
    }
    cv_.notify_one();
  }

  /// Fails the stream from the worker (an awaited event failed).
  void fail(std::error_code ec) {
    if (!failed_) failed_ = ec;
  }

 private:
  void run();

  standin& backend_;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<task> q_;        // guarded by m_
  bool stop_ = false;         // guarded by m_
  std::error_code failed_;    // worker thread only
  std::thread worker_;        // last
};

class standin final : public backend {
 public:
  backend_kind kind() const noexcept override { return backend_kind::standin; }
  std::string name() const override { return "cpu stand-in"; }
  int ordinal() const noexcept override { return 0; }

  void set_completion_hook(std::function<void()> hook) override { hook_ = std::move(hook); }

  // Device and pinned allocations, by start: a copy's destination outside all of them is
  // pageable host memory.
  void* host_block(std::size_t bytes, const char* what) {
    void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (!p) throw error(std::make_error_code(std::errc::not_enough_memory), what);
    std::lock_guard lk(mem_m_);
    blocks_[reinterpret_cast<std::uintptr_t>(p)] = bytes;
    return p;
  }
  void forget(void* p) noexcept {
    std::lock_guard lk(mem_m_);
    blocks_.erase(reinterpret_cast<std::uintptr_t>(p));
  }
  bool known(const void* p) {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    std::lock_guard lk(mem_m_);
    auto it = blocks_.upper_bound(a);
    if (it == blocks_.begin()) return false;
    --it;
    return a < it->first + std::max<std::size_t>(it->second, 1);
  }

  void interrupt_waits() noexcept override {
    std::vector<fake_event*> events;
    {
      std::lock_guard lk(m_);
      interrupted_.store(true, std::memory_order_release);
      events = events_;
    }
    for (auto* e : events) {
      std::lock_guard lk(e->m);  // so no waiter misses the flag between its check and its wait
      e->cv.notify_all();
    }
  }

  std::shared_ptr<stream_impl> create_stream(const stream_options&) override {
    return std::make_shared<fake_stream>(*this);
  }

  void synchronize(stream_impl& s) override {
    fake_event e;
    record(e, s);
    if (auto ec = wait_for(e, false)) throw error(ec, "stream::synchronize");
  }

  void enqueue_host(stream_impl& s, unique_function<void()> fn) override {
    as_fake(s).push({std::move(fn), nullptr, false});
  }

  event_impl* create_event() override {
    auto* e = new fake_event;
    std::lock_guard lk(m_);
    events_.push_back(e);
    return e;
  }

  void destroy_event(event_impl* e) noexcept override {
    {
      std::lock_guard lk(m_);
      std::erase(events_, static_cast<fake_event*>(e));
    }
    delete static_cast<fake_event*>(e);
  }

  void record(event_impl& ei, stream_impl& s) override {
    auto& e = static_cast<fake_event&>(ei);
    auto rec = std::make_shared<fake_record>();
    {
      std::lock_guard lk(e.m);
      e.current = rec;
    }
    as_fake(s).push({nullptr, &e, true, std::move(rec)});
  }

  event_state query(event_impl& ei) noexcept override {
    auto& e = static_cast<fake_event&>(ei);
    std::lock_guard lk(e.m);
    return {e.done(), e.current ? e.current->error : std::error_code()};
  }

  std::error_code wait(event_impl& ei) noexcept override { return wait_for(static_cast<fake_event&>(ei), true); }

  /// Only the completion lanes' waits are interrupted at shutdown; a stream's own
  /// work (and synchronize) runs to its end, as on a GPU.
  std::error_code wait_for(fake_event& e, bool interruptible) noexcept {
    std::unique_lock lk(e.m);
    e.cv.wait(lk, [&] { return e.done() || (interruptible && interrupted_.load(std::memory_order_acquire)); });
    if (!e.done()) return errc::cancelled;
    return e.current ? e.current->error : std::error_code();
  }

  void stream_wait(stream_impl& s, event_impl& ei) override {
    auto* e = &static_cast<fake_event&>(ei);
    std::shared_ptr<fake_record> rec;
    {
      std::lock_guard lk(e->m);
      rec = e->current;
    }
    if (!rec) return;  // never recorded: complete, as in CUDA
    auto* fs = &as_fake(s);
    // The worker blocks until that record completes (not a later one of the same
    // event: pooled events are recorded again as soon as they are released); its
    // error fails this stream too. The event object itself outlives the wait (pooled).
    fs->push({[e, rec, fs] {
                std::unique_lock lk(e->m);
                e->cv.wait(lk, [&] { return rec->done; });
                if (rec->error) fs->fail(rec->error);
              },
              nullptr, false});
  }

  void* allocate(std::size_t bytes, stream_impl&) override { return host_block(bytes, "stand-in allocate"); }
  void deallocate(void* p, stream_impl& s) noexcept override {
    forget(p);
    try {
      as_fake(s).push({[p] { std::free(p); }, nullptr, true});
    } catch (...) {
      // Out of memory while queueing the free: leaking is the safe answer.
    }
  }
  void* allocate_pinned(std::size_t bytes) override { return host_block(bytes, "stand-in allocate_pinned"); }
  void deallocate_pinned(void* p) noexcept override {
    forget(p);
    std::free(p);
  }
  void copy(void* dst, const void* src, std::size_t bytes, stream_impl& s) override {
    run_on(s, [=] { std::memcpy(dst, src, bytes); });
    // CUDA returns from a copy into pageable host memory only once it is done, which
    // waits for all the stream's earlier work: the stand-in blocks the same way, so code
    // that would stall a loop behind a busy GPU stalls in the CPU tests too.
    if (!known(dst)) synchronize(s);
  }
  void fill_zero(void* dst, std::size_t bytes, stream_impl& s) override {
    run_on(s, [=] { std::memset(dst, 0, bytes); });
  }

  void gemm_strided_batched(stream_impl& s, transpose ta, transpose tb, int m, int n, int k, float alpha,
                            const float* a, int lda, std::int64_t sa, const float* b, int ldb, std::int64_t sb,
                            float beta, float* c, int ldc, std::int64_t sc, int batch) override {
    run_on(s, [=] {
      for (int i = 0; i < batch; ++i) cpu::gemm(ta, tb, m, n, k, alpha, a + i * sa, lda, b + i * sb, ldb, beta, c + i * sc, ldc);
    });
  }
  void launch(stream_impl& s, std::size_t n, const ops::pointwise_op& op) override {
    run_on(s, [n, op] { std::visit([n](const auto& o) { cpu::each(n, o); }, op); });
  }
  void launch(stream_impl& s, const ops::window_op& op) override {
    run_on(s, [op] { std::visit([](const auto& o) { cpu::each(o.size(), o); }, op); });
  }
  void column_sums(stream_impl& s, const float* x, std::size_t rows, std::size_t cols, float* out,
                   float beta) override {
    run_on(s, [=] { cpu::column_sums(x, rows, cols, out, beta); });
  }
  void softmax_xent_forward(stream_impl& s, const float* logits, const std::int32_t* labels, std::size_t rows,
                            std::size_t cols, float* probs, float* loss, float* correct) override {
    run_on(s, [=] { cpu::softmax_xent_forward(logits, labels, rows, cols, probs, loss, correct); });
  }

  void enqueue_fault(stream_impl& s, int) override {
    run_on(s, [] { throw std::runtime_error("stand-in fault planted by gpu::testing::enqueue_fault"); });
  }

  void enqueue_gate(stream_impl& s, volatile std::int32_t* flag) override {
    auto* f = const_cast<std::int32_t*>(flag);
    run_on(s, [this, f] {
      std::unique_lock lk(gate_m_);
      gate_cv_.wait(lk, [&] {
        return std::atomic_ref<std::int32_t>(*f).load(std::memory_order_acquire) != 0;
      });
    });
  }

  void open_gate(std::int32_t* flag) noexcept override {
    {
      std::lock_guard lk(gate_m_);
      std::atomic_ref<std::int32_t>(*flag).store(1, std::memory_order_release);
    }
    gate_cv_.notify_all();
  }

  /// Called by a worker after an event completed.
  void completed() {
    if (hook_) hook_();
  }

 private:
  std::mutex mem_m_;
  std::map<std::uintptr_t, std::size_t> blocks_;  // guarded by mem_m_
  static fake_stream& as_fake(stream_impl& s) { return static_cast<fake_stream&>(s); }
  template <class F>
  void run_on(stream_impl& s, F&& f) {
    as_fake(s).push({unique_function<void()>(std::forward<F>(f)), nullptr, false});
  }

  std::function<void()> hook_;  // set before any stream exists
  std::mutex m_;
  std::vector<fake_event*> events_;  // guarded by m_
  std::atomic<bool> interrupted_{false};
  std::mutex gate_m_;
  std::condition_variable gate_cv_;
};

void fake_stream::run() {
  std::unique_lock lk(m_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || !q_.empty(); });
    if (q_.empty()) break;  // stop, drained
    task t = std::move(q_.front());
    q_.pop_front();
    lk.unlock();
    if (t.marker) {
      {
        // Notify under the lock: a waiter may destroy the event as soon as it sees it done.
        std::lock_guard el(t.marker->m);
        t.rec->done = true;
        t.rec->error = failed_;
        t.marker->cv.notify_all();
      }
      backend_.completed();
    } else if (!failed_ || t.always) {
      try {
        t.fn();
      } catch (...) {
        failed_ = errc::stream_failed;
      }
    }
    t = {};  // captures are released on the worker, in order
    lk.lock();
  }
}

}  // namespace

std::unique_ptr<backend> make_standin_backend() { return std::make_unique<standin>(); }

}  // namespace nerve::gpu::detail

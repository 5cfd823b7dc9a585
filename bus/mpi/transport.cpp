#include "bus/mpi/transport.hpp"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>
#include <unordered_map>

namespace nerve::bus::mpi {

namespace {

constexpr int frame_tag = 0;
constexpr int payload_tag = 1;

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int n = 0;
  MPI_Error_string(rc, text, &n);
  throw std::runtime_error(std::string("bus::mpi: ") + what + ": " + std::string(text, std::size_t(n)));
}

int byte_count(std::size_t n, const char* what) {
  if (n > std::size_t(INT_MAX))
    throw std::length_error(std::string("bus::mpi: ") + what + " of " + std::to_string(n) +
                            " bytes is more than one MPI message takes (2 GiB)");
  return int(n);
}

}  // namespace

// A received frame: delivered once its payload is in and every earlier frame was (a
// small message must not pass a large one still coming in).
struct arrival {
  std::function<actors::send_status()> deliver;
  bool complete = false;
};

struct transport::impl {
  MPI_Comm comm = MPI_COMM_NULL;

  // Shared with the callers (guarded by `m`).
  std::mutex m;
  std::condition_variable wake;     // the progress thread sleeps on it when idle
  std::condition_variable drained;  // flush() waits on it
  std::vector<outgoing> queue;
  std::vector<std::function<void()>> control;  // run on the progress thread (barrier)
  std::unordered_map<channel, inbox> inboxes;
  std::uint64_t unsent = 0;  // sends enqueued whose MPI requests have not completed
  bool stop = false;
  std::exception_ptr error;

  std::atomic<std::uint64_t> sent{0}, received{0}, bytes_sent{0}, bytes_received{0}, full_retries{0};

  // Progress thread only.
  struct op {
    std::shared_ptr<outgoing> send;                     // a send's record (frame and payload requests share it)
    bool last_of_send = false;                          // completing it completes the send
    std::shared_ptr<arrival> arrived;                   // a payload receive's message
    std::function<void()> done;                         // a control operation's completion
  };
  std::vector<MPI_Request> requests;
  std::vector<op> ops;
  std::deque<std::shared_ptr<arrival>> arrivals;  // in the order their frames came

  void post(MPI_Request r, op o) {
    requests.push_back(r);
    ops.push_back(std::move(o));
  }
};

transport::transport() : impl_(std::make_unique<impl>()) {
  int initialised = 0;
  check_mpi(MPI_Initialized(&initialised), "MPI_Initialized");
  if (!initialised) {
    int provided = 0;
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
    owns_mpi_ = true;
    if (provided < MPI_THREAD_SERIALIZED) {
      MPI_Finalize();
      throw std::runtime_error("bus::mpi: this MPI does not provide MPI_THREAD_SERIALIZED");
    }
  } else {
    int provided = 0;
    check_mpi(MPI_Query_thread(&provided), "MPI_Query_thread");
    if (provided < MPI_THREAD_SERIALIZED)
      throw std::runtime_error(
          "bus::mpi: MPI was initialised below MPI_THREAD_SERIALIZED; the transport calls MPI from its own thread");
  }
  // A communicator of our own keeps the bus's tags apart from any MPI the program does,
  // and errors on it come back as codes instead of aborting in place.
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &impl_->comm), "MPI_Comm_dup");
  check_mpi(MPI_Comm_set_errhandler(impl_->comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  check_mpi(MPI_Comm_rank(impl_->comm, &rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(impl_->comm, &size_), "MPI_Comm_size");
  thread_ = std::thread([this] { run(); });
}

transport::~transport() {
  try {
    flush();
  } catch (...) {  // the error is the run's to report (check()); the destructor only tidies up
  }
  {
    std::lock_guard lock(impl_->m);
    impl_->stop = true;
  }
  impl_->wake.notify_all();
  thread_.join();
  // The progress thread has ended: this thread may call MPI again (serialised).
  MPI_Comm_free(&impl_->comm);
  if (owns_mpi_) MPI_Finalize();
}

void transport::enqueue(outgoing o) {
  {
    std::lock_guard lock(impl_->m);
    if (impl_->error) std::rethrow_exception(impl_->error);
    if (impl_->stop) throw std::logic_error("bus::mpi: send after the transport stopped");
    impl_->queue.push_back(std::move(o));
    ++impl_->unsent;
  }
  impl_->wake.notify_one();
}

void transport::add_inbox(channel ch, inbox in) {
  std::lock_guard lock(impl_->m);
  if (!impl_->inboxes.emplace(ch, std::move(in)).second)
    throw actors::wiring_error("bus::mpi: channel " + std::to_string(ch) + " has a listener already");
}

void transport::check() const {
  std::lock_guard lock(impl_->m);
  if (impl_->error) std::rethrow_exception(impl_->error);
}

transport_stats transport::stats() const {
  const auto& s = *impl_;
  return {s.sent.load(), s.received.load(), s.bytes_sent.load(), s.bytes_received.load(), s.full_retries.load()};
}

void transport::flush() {
  std::unique_lock lock(impl_->m);
  impl_->drained.wait(lock, [&] { return impl_->unsent == 0 || impl_->error; });
  if (impl_->error) std::rethrow_exception(impl_->error);
}

void transport::barrier() {
  std::promise<void> done;
  auto f = done.get_future();
  {
    std::lock_guard lock(impl_->m);
    if (impl_->error) std::rethrow_exception(impl_->error);
    impl_->control.push_back([this, &done] {
      MPI_Request r;
      check_mpi(MPI_Ibarrier(impl_->comm, &r), "MPI_Ibarrier");
      impl_->post(r, impl::op{{}, false, {}, [&done] { done.set_value(); }});
    });
  }
  impl_->wake.notify_one();
  // The progress thread either completes the barrier or stops with an error.
  for (;;) {
    if (f.wait_for(std::chrono::milliseconds(10)) == std::future_status::ready) return f.get();
    check();
  }
}

void transport::run() noexcept {
  using clock = std::chrono::steady_clock;
  auto& s = *impl_;
  std::vector<outgoing> batch;
  std::vector<std::function<void()>> controls;
  std::vector<int> indices;
  std::vector<std::byte> frame;
  auto last_progress = clock::now();
  auto nap = std::chrono::microseconds(50);
  try {
    for (;;) {
      bool progressed = false;
      {
        std::lock_guard lock(s.m);
        if (s.stop && s.queue.empty() && s.ops.empty()) break;
        batch.swap(s.queue);
        controls.swap(s.control);
      }
      for (auto& c : controls) c();
      if (!controls.empty()) progressed = true;
      controls.clear();

      // Sends: the frame, then the payload from the value's own buffer.
      for (auto& o : batch) {
        auto rec = std::make_shared<outgoing>(std::move(o));
        MPI_Request r;
        check_mpi(MPI_Isend(rec->frame.data(), byte_count(rec->frame.size(), "a frame"), MPI_BYTE, rec->to,
                            frame_tag, s.comm, &r),
                  "MPI_Isend");
        const bool has_payload = !rec->payload.empty();
        s.post(r, impl::op{rec, !has_payload, {}, {}});
        if (has_payload) {
          check_mpi(MPI_Isend(rec->payload.data(), byte_count(rec->payload.size(), "a payload"), MPI_BYTE, rec->to,
                              payload_tag, s.comm, &r),
                    "MPI_Isend");
          s.post(r, impl::op{rec, true, {}, {}});
        }
        s.bytes_sent.fetch_add(rec->payload.size(), std::memory_order_relaxed);
        s.sent.fetch_add(1, std::memory_order_relaxed);
        progressed = true;
      }
      batch.clear();

      // Arrivals: take each frame, then post its payload's receive straight into the value.
      for (;;) {
        int flag = 0;
        MPI_Message msg;
        MPI_Status st;
        check_mpi(MPI_Improbe(MPI_ANY_SOURCE, frame_tag, s.comm, &flag, &msg, &st), "MPI_Improbe");
        if (!flag) break;
        int n = 0;
        check_mpi(MPI_Get_count(&st, MPI_BYTE, &n), "MPI_Get_count");
        frame.resize(std::size_t(n));
        check_mpi(MPI_Mrecv(frame.data(), n, MPI_BYTE, &msg, MPI_STATUS_IGNORE), "MPI_Mrecv");
        frame_reader rd{frame};
        const auto ch = rd.get<channel>();
        const auto size = rd.get<std::uint64_t>();
        std::function<std::function<actors::send_status()>(std::span<const std::byte>, std::span<std::byte>&)> read;
        {
          std::lock_guard lock(s.m);
          auto it = s.inboxes.find(ch);
          if (it == s.inboxes.end())
            throw std::runtime_error("bus::mpi: rank " + std::to_string(st.MPI_SOURCE) + " sent to channel " +
                                     std::to_string(ch) + ", which nothing on rank " + std::to_string(rank_) +
                                     " listens to (were the ranks wired alike?)");
          read = it->second.read;
        }
        std::span<std::byte> payload;
        auto deliver = read(rd.in, payload);
        if (payload.size() != size)
          throw std::runtime_error("bus::mpi: channel " + std::to_string(ch) + ": rank " +
                                   std::to_string(st.MPI_SOURCE) + " sent " + std::to_string(size) +
                                   " payload bytes, the frame describes " + std::to_string(payload.size()));
        auto a = std::make_shared<arrival>(arrival{std::move(deliver), size == 0});
        s.arrivals.push_back(a);
        if (size > 0) {
          MPI_Request r;
          check_mpi(MPI_Irecv(payload.data(), byte_count(size, "a payload"), MPI_BYTE, st.MPI_SOURCE, payload_tag,
                              s.comm, &r),
                    "MPI_Irecv");
          s.post(r, impl::op{{}, false, std::move(a), {}});
        }
        s.bytes_received.fetch_add(size, std::memory_order_relaxed);
        progressed = true;
      }

      // Completions.
      if (!s.requests.empty()) {
        int count = 0;
        indices.resize(s.requests.size());
        check_mpi(MPI_Testsome(int(s.requests.size()), s.requests.data(), &count, indices.data(), MPI_STATUSES_IGNORE),
                  "MPI_Testsome");
        if (count > 0 && count != MPI_UNDEFINED) {
          std::uint64_t sends_done = 0;
          for (int k = 0; k < count; ++k) {
            auto& o = s.ops[std::size_t(indices[std::size_t(k)])];
            if (o.arrived) o.arrived->complete = true;
            if (o.done) o.done();
            if (o.last_of_send) ++sends_done;
            o = {};
          }
          // Completed requests became MPI_REQUEST_NULL: drop them, keeping the others' order.
          std::size_t w = 0;
          for (std::size_t r = 0; r < s.requests.size(); ++r)
            if (s.requests[r] != MPI_REQUEST_NULL) {
              s.requests[w] = s.requests[r];
              s.ops[w] = std::move(s.ops[r]);
              ++w;
            }
          s.requests.resize(w);
          s.ops.resize(w);
          if (sends_done) {
            std::lock_guard lock(s.m);
            s.unsent -= sends_done;
            if (s.unsent == 0) s.drained.notify_all();
          }
          progressed = true;
        }
      }

      // Deliveries, in arrival order; a full mailbox holds the line until it has room.
      while (!s.arrivals.empty() && s.arrivals.front()->complete) {
        const auto status = s.arrivals.front()->deliver();
        if (status == actors::send_status::full) {
          s.full_retries.fetch_add(1, std::memory_order_relaxed);
          break;
        }
        s.arrivals.pop_front();  // ok, or closed: a stopped receiver's run is ending with its own error
        s.received.fetch_add(1, std::memory_order_relaxed);
        progressed = true;
      }

      // Back-off: spin while traffic flows, then yield, then nap (a send wakes the nap).
      const auto now = clock::now();
      if (progressed) {
        last_progress = now;
        nap = std::chrono::microseconds(50);
        continue;
      }
      const auto quiet = now - last_progress;
      if (quiet < std::chrono::microseconds(20)) continue;
      if (quiet < std::chrono::milliseconds(2)) {
        std::this_thread::yield();
        continue;
      }
      std::unique_lock lock(s.m);
      s.wake.wait_for(lock, nap, [&] { return s.stop || !s.queue.empty() || !s.control.empty(); });
      // Nothing in flight: nap longer; something in flight keeps the naps short.
      nap = s.requests.empty() && s.arrivals.empty() ? std::min(nap * 2, std::chrono::microseconds(1000))
                                                  : std::chrono::microseconds(50);
    }
  } catch (...) {
    std::lock_guard lock(s.m);
    s.error = std::current_exception();
    s.drained.notify_all();
  }
}

}  // namespace nerve::bus::mpi

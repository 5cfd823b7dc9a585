// One file: every MPI call the transport makes after MPI_Init is here, and every one of
// them runs on its poller, one at a time (MPI_THREAD_SERIALIZED): the file to read to see
// that the rule holds. The frame codecs it carries are in layers/wire/.
#include "bus/mpi/transport.hpp"

#include <mpi.h>

#include <boost/asio/steady_timer.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <deque>
#include <thread>
#include <future>
#include <mutex>
#include <unordered_map>

#include "actors/actor.hpp"
#include "actors/runtime.hpp"

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

// A received frame: delivered once its payload is in and every earlier frame was (a small
// message must not pass a large one still coming in).
struct arrival {
  std::function<actors::send_status(actors::actor_id)> deliver;
  bool complete = false;
  std::uint64_t flow = 0;  // the sender's cross-rank arrow (0: none)
  const actors::address* to = nullptr;  // the inbox's (inboxes are never erased)
  const actors::type_tag* tag = nullptr;
};

// An arrow's start or end at this moment on `track`, named by its message kind: where it
// cannot bind to a recorded message (`recorder::bound_flow`).
void write_flow(actors::recorder& rec, actors::record_kind kind, std::uint32_t track, const actors::type_tag* tag,
                std::uint64_t flow) noexcept {
  actors::record r;
  r.kind = kind;
  r.ts_ns = rec.now();
  r.track = track;
  r.tag = tag;
  r.flow = flow;
  rec.write(r);
}

// The poller's own messages.
struct tick {
  static constexpr std::string_view kind = "mpi_tick";
  static constexpr bool traced = false;  // a turn every few microseconds: not what a trace is for
};
struct control {
  static constexpr std::string_view kind = "mpi_control";
  std::function<void()> run;  // on the poller: may post MPI requests
};
struct stop_polling {
  static constexpr std::string_view kind = "mpi_stop";
};

}  // namespace

// State shared by the transport's callers and its poller.
struct transport::impl {
  MPI_Comm comm = MPI_COMM_NULL;
  std::unique_ptr<actors::runtime> own_runtime;  // when no runtime was given
  actors::runtime* rt = nullptr;
  actors::address poller;

  std::mutex m;
  std::condition_variable changed;  // flush() and the destructor wait on it
  std::unordered_map<channel, inbox> inboxes;
  std::uint64_t unsent = 0;  // sends handed over whose MPI requests have not completed
  bool finished = false;     // the poller has stopped
  std::exception_ptr error;

  std::atomic<std::uint64_t> sent{0}, received{0}, bytes_sent{0}, bytes_received{0}, full_retries{0};

  void fail(std::exception_ptr e) {
    std::lock_guard lock(m);
    if (!error) error = std::move(e);
    finished = true;
    changed.notify_all();
  }
};

// How long the poller keeps polling after traffic moved before it naps. Long enough to
// cover a peer's answer: eager sends complete at once, so nothing in flight keeps the
// poller awake, and once a round trip outlasts the window both ends fall asleep and wait on
// their naps for every message (docs/performance.md, "training across processes").
constexpr std::chrono::microseconds hot_window{150};

// The poller: every MPI call after MPI_Init is made in its handlers.
class transport::poller : public actors::actor {
 public:
  poller(transport& t) : actor("mpi poller"), t_(t), s_(*t.impl_) {
    on<outgoing>([this](outgoing& o) {
      post_send(std::move(o));
      work();
    });
    on<tick>([this](tick&) {
      tick_queued_ = false;
      work();
    });
    on<control>([this](control& c) {
      try {
        c.run();
      } catch (...) {
        s_.fail(std::current_exception());
        stop();
        return;
      }
      work();
    });
    on<stop_polling>([this](stop_polling&) {
      stopping_ = true;
      work();
    });
  }
  ~poller() override { *alive_ = false; }

  void on_start() override { timer_ = std::make_unique<boost::asio::steady_timer>(executor()); }
  void on_stop() override {
    if (timer_) timer_->cancel();
  }

  // A control operation's request: `done` runs on the poller when it completes.
  void post_request(MPI_Request r, std::function<void()> done) {
    requests_.push_back(r);
    ops_.push_back(op{{}, false, {}, std::move(done)});
  }
  MPI_Comm comm() const { return s_.comm; }

 private:
  struct op {
    std::shared_ptr<outgoing> send;  // a send's record (its frame and payload requests share it)
    bool last_of_send = false;       // completing it completes the send
    std::shared_ptr<arrival> arrived;
    std::function<void()> done;  // a control operation's completion
  };

  void post_send(outgoing o) {
    auto rec = std::make_shared<outgoing>(std::move(o));
    MPI_Request r;
    check_mpi(MPI_Isend(rec->frame.data(), byte_count(rec->frame.size(), "a frame"), MPI_BYTE, rec->to, frame_tag,
                        s_.comm, &r),
              "MPI_Isend");
    const bool has_payload = !rec->payload.empty();
    requests_.push_back(r);
    ops_.push_back(op{rec, !has_payload, {}, {}});
    if (has_payload) {
      check_mpi(MPI_Isend(rec->payload.data(), byte_count(rec->payload.size(), "a payload"), MPI_BYTE, rec->to,
                          payload_tag, s_.comm, &r),
                "MPI_Isend");
      requests_.push_back(r);
      ops_.push_back(op{rec, true, {}, {}});
    }
    s_.bytes_sent.fetch_add(rec->payload.size(), std::memory_order_relaxed);
    s_.sent.fetch_add(1, std::memory_order_relaxed);
    progressed_ = true;
  }

  // One turn: arrivals, completions, deliveries; then the next turn now, later or never.
  void work() {
    try {
      receive();
      complete();
      deliver();
    } catch (...) {
      s_.fail(std::current_exception());
      stop();
      return;
    }
    const auto now = std::chrono::steady_clock::now();
    if (progressed_) {
      last_progress_ = now;
      nap_ = std::chrono::microseconds(20);
      progressed_ = false;
    }
    if (stopping_ && requests_.empty() && arrivals_.empty()) {
      std::lock_guard lock(s_.m);
      s_.finished = true;
      s_.changed.notify_all();
      stop();
      return;
    }
    const bool busy = !requests_.empty() || !arrivals_.empty();
    if (busy || now - last_progress_ < hot_window) {
      // Again after the other actors' turns: a message to ourselves. Only one at a time.
      // (A full mailbox needs no tick: its messages bring the next turn.)
      if (!tick_queued_) tick_queued_ = try_tell(tick{}) == actors::send_status::ok;
      return;
    }
    if (napping_) return;
    napping_ = true;
    timer_->expires_after(nap_);
    nap_ = std::min(nap_ * 2, std::chrono::microseconds(200));
    // Not counted as work in flight: a quiet poller must not hold up synchronize().
    timer_->async_wait([this, alive = alive_](const boost::system::error_code& ec) {
      if (ec || !*alive || stopped()) return;  // cancelled when the poller stopped
      napping_ = false;
      if (!tick_queued_) tick_queued_ = try_tell(tick{}) == actors::send_status::ok;
    });
  }

  // Frames that arrived: each one's payload receive goes straight into its value.
  void receive() {
    for (;;) {
      int flag = 0;
      MPI_Message msg;
      MPI_Status st;
      check_mpi(MPI_Improbe(MPI_ANY_SOURCE, frame_tag, s_.comm, &flag, &msg, &st), "MPI_Improbe");
      if (!flag) return;
      int n = 0;
      check_mpi(MPI_Get_count(&st, MPI_BYTE, &n), "MPI_Get_count");
      frame_.resize(std::size_t(n));
      check_mpi(MPI_Mrecv(frame_.data(), n, MPI_BYTE, &msg, MPI_STATUS_IGNORE), "MPI_Mrecv");
      frame_reader rd{frame_};
      const auto ch = rd.get<channel>();
      const auto size = rd.get<std::uint64_t>();
      const auto flow = rd.get<std::uint64_t>();
      const inbox* in = nullptr;
      {
        std::lock_guard lock(s_.m);
        auto it = s_.inboxes.find(ch);
        if (it != s_.inboxes.end()) in = &it->second;  // entries are never erased
      }
      if (!in)
        throw std::runtime_error("bus::mpi: rank " + std::to_string(st.MPI_SOURCE) + " sent to channel " +
                                 std::to_string(ch) + ", which nothing on rank " + std::to_string(t_.rank()) +
                                 " listens to (were the ranks wired alike?)");
      std::span<std::byte> payload;
      auto deliver = in->read(rd.in, payload);
      if (payload.size() != size)
        throw std::runtime_error("bus::mpi: channel " + std::to_string(ch) + ": rank " +
                                 std::to_string(st.MPI_SOURCE) + " sent " + std::to_string(size) +
                                 " payload bytes, its frame describes " + std::to_string(payload.size()));
      auto a = std::make_shared<arrival>(arrival{std::move(deliver), size == 0, flow, &in->to, in->tag});
      arrivals_.push_back(a);
      if (size > 0) {
        MPI_Request r;
        check_mpi(MPI_Irecv(payload.data(), byte_count(size, "a payload"), MPI_BYTE, st.MPI_SOURCE, payload_tag,
                            s_.comm, &r),
                  "MPI_Irecv");
        requests_.push_back(r);
        ops_.push_back(op{{}, false, std::move(a), {}});
      }
      s_.bytes_received.fetch_add(size, std::memory_order_relaxed);
      progressed_ = true;
    }
  }

  void complete() {
    if (requests_.empty()) return;
    int count = 0;
    indices_.resize(requests_.size());
    check_mpi(MPI_Testsome(int(requests_.size()), requests_.data(), &count, indices_.data(), MPI_STATUSES_IGNORE),
              "MPI_Testsome");
    if (count <= 0 || count == MPI_UNDEFINED) return;
    std::uint64_t sends_done = 0;
    for (int k = 0; k < count; ++k) {
      auto& o = ops_[std::size_t(indices_[std::size_t(k)])];
      if (o.arrived) o.arrived->complete = true;
      if (o.done) o.done();
      if (o.last_of_send) ++sends_done;
      o = {};
    }
    // Completed requests became MPI_REQUEST_NULL: drop them, keeping the others' order.
    std::size_t w = 0;
    for (std::size_t r = 0; r < requests_.size(); ++r)
      if (requests_[r] != MPI_REQUEST_NULL) {
        requests_[w] = requests_[r];
        ops_[w] = std::move(ops_[r]);
        ++w;
      }
    requests_.resize(w);
    ops_.resize(w);
    if (sends_done) {
      std::lock_guard lock(s_.m);
      s_.unsent -= sends_done;
      if (s_.unsent == 0) s_.changed.notify_all();
    }
    progressed_ = true;
  }

  // Into the subscribers' mailboxes in arrival order; a full one holds the line.
  void deliver() {
    while (!arrivals_.empty() && arrivals_.front()->complete) {
      // Counted before the push, so a receiver that has the message sees it counted.
      s_.received.fetch_add(1, std::memory_order_relaxed);
      const auto status = arrivals_.front()->deliver(id());
      if (status == actors::send_status::full) {
        s_.received.fetch_sub(1, std::memory_order_relaxed);
        s_.full_retries.fetch_add(1, std::memory_order_relaxed);
        return;
      }
      if (status == actors::send_status::ok) traced_arrival(*arrivals_.front());
      arrivals_.pop_front();  // ok, or closed: a stopped receiver's run is ending with its own error
      progressed_ = true;
    }
  }

  // The arrow's end on the receiver's track, bound to the handler run that takes the value
  // when the receiver shares the poller's runtime (its recorder then holds the poller's
  // message to it); otherwise at the delivery. One per delivery while the receiver's
  // recorder is on, arrow or not: bound ends pair with messages in order.
  void traced_arrival(const arrival& a) noexcept {
    auto* to = a.to->get();
    if (!to) return;
    auto& rec = to->system().trace();
    if (!rec.enabled()) [[likely]]
      return;
    if (&to->system() == s_.rt) {
      rec.bound_flow(actors::record_kind::flow_end, to->id(), id(), a.tag, a.flow, rec.now());
    } else if (a.flow != 0) {
      write_flow(rec, actors::record_kind::flow_end, to->id(), a.tag, a.flow);
    }
  }

  transport& t_;
  impl& s_;
  std::vector<MPI_Request> requests_;
  std::vector<op> ops_;
  std::deque<std::shared_ptr<arrival>> arrivals_;  // in the order their frames came
  std::vector<std::byte> frame_;
  std::vector<int> indices_;
  std::unique_ptr<boost::asio::steady_timer> timer_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);  // the timer's handler may outlive us
  std::chrono::steady_clock::time_point last_progress_{};
  std::chrono::microseconds nap_{20};
  bool progressed_ = false, tick_queued_ = false, napping_ = false, stopping_ = false;
};

transport::transport() : impl_(std::make_unique<impl>()) {
  impl_->own_runtime = std::make_unique<actors::runtime>(actors::runtime_options{.loops = 1});
  start(*impl_->own_runtime, 0);
}

transport::transport(actors::runtime& rt, unsigned loop) : impl_(std::make_unique<impl>()) { start(rt, loop); }

namespace {
std::atomic<int> live_transports{0};  // see the class comment: one polls at a time

// Every rank's `mine` on every rank, by rank (blocking; from the one thread calling MPI).
std::vector<std::string> gather_everyone(MPI_Comm comm, const std::string& mine) {
  int n = 0;
  check_mpi(MPI_Comm_size(comm, &n), "MPI_Comm_size");
  int len = int(mine.size());
  std::vector<int> lens(static_cast<std::size_t>(n)), displs(static_cast<std::size_t>(n));
  check_mpi(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm), "MPI_Allgather");
  int total = 0;
  for (int r = 0; r < n; ++r) {
    displs[std::size_t(r)] = total;
    total += lens[std::size_t(r)];
  }
  std::string all(std::size_t(total), '\0');
  check_mpi(MPI_Allgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, comm),
            "MPI_Allgatherv");
  std::vector<std::string> out;
  for (int r = 0; r < n; ++r) out.push_back(all.substr(std::size_t(displs[std::size_t(r)]), std::size_t(lens[std::size_t(r)])));
  return out;
}
// Brings MPI up at MPI_THREAD_SERIALIZED unless it is up (true: this call did, and the
// caller finalises it); refuses an MPI already up below that level.
bool init_serialized() {
  int initialised = 0;
  check_mpi(MPI_Initialized(&initialised), "MPI_Initialized");
  int provided = 0;
  if (!initialised) {
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
    if (provided < MPI_THREAD_SERIALIZED) {
      MPI_Finalize();
      throw std::runtime_error("bus::mpi: this MPI does not provide MPI_THREAD_SERIALIZED");
    }
    return true;
  }
  check_mpi(MPI_Query_thread(&provided), "MPI_Query_thread");
  if (provided < MPI_THREAD_SERIALIZED)
    throw std::runtime_error(
        "bus::mpi: MPI was initialised below MPI_THREAD_SERIALIZED; the transport calls MPI from its own loop");
  return false;
}
}  // namespace

session::session() {
  owns_ = init_serialized();
  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &size_), "MPI_Comm_size");
}

session::~session() {
  if (owns_) MPI_Finalize();
}

void session::agree(const std::string& what, const std::string& mine, const std::string& remedy) {
  if (live_transports.load() != 0)
    throw std::logic_error("bus::mpi::session::agree: a transport is polling; use its agree()");
  check_agreement(what, gather_everyone(MPI_COMM_WORLD, mine), remedy);
}

void session::barrier() {
  if (live_transports.load() != 0) throw std::logic_error("bus::mpi::session::barrier: a transport is polling");
  MPI_Request r;
  check_mpi(MPI_Ibarrier(MPI_COMM_WORLD, &r), "MPI_Ibarrier");
  for (int done = 0;;) {
    check_mpi(MPI_Test(&r, &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (done) return;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

void transport::start(actors::runtime& rt, unsigned loop) {
  if (live_transports.fetch_add(1) != 0) {
    live_transports.fetch_sub(1);
    throw std::logic_error(
        "bus::mpi: a transport is already polling in this process; MPI is called from one thread at a time "
        "(MPI_THREAD_SERIALIZED): share that one, or make this one after it is gone");
  }
  try {
    start_polling(rt, loop);
  } catch (...) {
    live_transports.fetch_sub(1);
    throw;
  }
}

void transport::start_polling(actors::runtime& rt, unsigned loop) {
  owns_mpi_ = init_serialized();
  // A communicator of our own keeps the bus's tags apart from any MPI the program does,
  // and errors on it come back as codes instead of aborting in place.
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &impl_->comm), "MPI_Comm_dup");
  check_mpi(MPI_Comm_set_errhandler(impl_->comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  check_mpi(MPI_Comm_rank(impl_->comm, &rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(impl_->comm, &size_), "MPI_Comm_size");
  impl_->rt = &rt;
  outside_ = &rt.trace();
  // Its mailbox holds what every actor of the rank may send at once. One message per turn:
  // the poller keeps itself busy with messages to itself, and with the runtime's batch it
  // would poll 64 times before the actor it had just handed a value ran, holding every
  // message back by that much (docs/performance.md, "training across processes").
  actors::spawn_options o;
  o.loop = loop;
  o.capacity = std::size_t{1} << 20;
  o.batch = 1;
  impl_->poller = rt.spawn_with<poller>(std::move(o), *this);
}

transport::~transport() {
  try {
    flush();
  } catch (...) {  // the error is the run's to report (check()); the destructor only tidies up
  }
  try {
    impl_->rt->send(impl_->poller, stop_polling{});
    std::unique_lock lock(impl_->m);
    impl_->changed.wait(lock, [&] { return impl_->finished; });
  } catch (...) {  // the poller stopped already (it failed)
  }
  if (impl_->own_runtime) impl_->own_runtime->shutdown();
  // The poller has stopped: this thread may call MPI again (serialised).
  MPI_Comm_free(&impl_->comm);
  if (owns_mpi_) MPI_Finalize();
  live_transports.fetch_sub(1);
}

void transport::enqueue(actors::actor* from, outgoing o) {
  {
    std::lock_guard lock(impl_->m);
    if (impl_->error) std::rethrow_exception(impl_->error);
    ++impl_->unsent;
  }
  try {
    if (from)
      from->send(impl_->poller, std::move(o));
    else
      impl_->rt->send(impl_->poller, std::move(o));
  } catch (...) {
    std::lock_guard lock(impl_->m);
    --impl_->unsent;
    throw;
  }
}

void transport::traced_send(actors::actor* from, std::uint64_t flow, const actors::type_tag* tag) noexcept {
  // From an actor of the poller's runtime, the arrow leaves the sending handler run: bound
  // to the send to the poller that the recorder holds. Otherwise (outside the loops, or an
  // actor of another runtime) at this moment.
  auto& rec = from ? from->system().trace() : *outside_;
  if (from && &from->system() == impl_->rt) {
    rec.bound_flow(actors::record_kind::flow_start, from->id(), impl_->poller.id(), tag, flow, rec.now());
    return;
  }
  write_flow(rec, actors::record_kind::flow_start, from ? from->id() : 0, tag, flow);
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
  impl_->changed.wait(lock, [&] { return impl_->unsent == 0 || impl_->error; });
  if (impl_->error) std::rethrow_exception(impl_->error);
}

namespace {
// Sends the poller a control operation. A poller that stopped with an error refuses it:
// then the error that stopped it is the one to report (`t.check()` rethrows it), not the
// refused send.
void send_control(const transport& t, actors::runtime& rt, const actors::address& poller, control c) {
  try {
    rt.send(poller, std::move(c));
  } catch (...) {
    t.check();
    throw;
  }
}

// Runs `f` on the poller (the one thread that calls MPI) and waits for it.
template <class R, class F>
R on_poller(const transport& t, actors::runtime& rt, const actors::address& poller, F f) {
  auto done = std::make_shared<std::promise<R>>();
  auto fut = done->get_future();
  send_control(t, rt, poller, control{[f = std::move(f), done]() mutable {
            try {
              if constexpr (std::is_void_v<R>) {
                f();
                done->set_value();
              } else {
                done->set_value(f());
              }
            } catch (...) {
              done->set_exception(std::current_exception());
            }
          }});
  return fut.get();
}
}  // namespace

std::vector<std::string> transport::all_gather(const std::string& mine) {
  const MPI_Comm comm = impl_->comm;
  return on_poller<std::vector<std::string>>(*this, *impl_->rt, impl_->poller, [comm, mine] { return gather_everyone(comm, mine); });
}

std::vector<std::string> transport::gather(const std::string& mine, int root) {
  if (root < 0 || root >= size_)
    throw std::invalid_argument("bus::mpi: gather to rank " + std::to_string(root) + " of " + std::to_string(size_));
  const MPI_Comm comm = impl_->comm;
  const int n = size_, me = rank_;
  return on_poller<std::vector<std::string>>(*this, *impl_->rt, impl_->poller, [comm, n, me, root, mine] {
    int len = byte_count(mine.size(), "a gathered value");
    std::vector<int> lens(static_cast<std::size_t>(n)), displs(static_cast<std::size_t>(n));
    check_mpi(MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, root, comm), "MPI_Gather");
    std::size_t total = 0;
    for (int r = 0; r < n && me == root; ++r) {
      displs[std::size_t(r)] = byte_count(total, "the gathered values");
      total += std::size_t(lens[std::size_t(r)]);
    }
    std::string all(me == root ? byte_count(total, "the gathered values") : 0, '\0');
    check_mpi(MPI_Gatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, root, comm),
              "MPI_Gatherv");
    std::vector<std::string> out;
    if (me == root)
      for (int r = 0; r < n; ++r)
        out.push_back(all.substr(std::size_t(displs[std::size_t(r)]), std::size_t(lens[std::size_t(r)])));
    return out;
  });
}

void check_agreement(const std::string& what, const std::vector<std::string>& all, const std::string& remedy) {
  std::string diff;
  for (std::size_t r = 1; r < all.size(); ++r)
    if (all[r] != all[0]) diff += (diff.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + " has '" + all[r] + "'";
  if (!diff.empty())
    throw std::invalid_argument("the ranks disagree on " + what + ": rank 0 has '" + all[0] + "', " + diff +
                                " (" + remedy + ")");
}

void transport::agree(const std::string& what, const std::string& mine) { check_agreement(what, all_gather(mine)); }

std::vector<clock_offset> transport::clock_offsets(int rounds) {
  const MPI_Comm comm = impl_->comm;
  const int n = size_, me = rank_;
  return on_poller<std::vector<clock_offset>>(*this, *impl_->rt, impl_->poller, [comm, n, me, rounds] {
    using clock = std::chrono::steady_clock;
    auto now = [] { return std::int64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now().time_since_epoch()).count()); };
    constexpr int tag = 7;  // blocking set-up traffic: no frames are in flight now
    std::vector<std::int64_t> offsets(2 * static_cast<std::size_t>(n), 0);  // offset, round trip
    for (int r = 1; r < n; ++r) {
      if (me == 0) {
        std::int64_t best_rtt = INT64_MAX, best = 0;
        for (int k = 0; k < rounds; ++k) {
          const std::int64_t t0 = now();
          std::int64_t remote = 0;
          check_mpi(MPI_Send(&t0, 1, MPI_INT64_T, r, tag, comm), "MPI_Send");
          check_mpi(MPI_Recv(&remote, 1, MPI_INT64_T, r, tag, comm, MPI_STATUS_IGNORE), "MPI_Recv");
          const std::int64_t t2 = now();
          if (t2 - t0 < best_rtt) {
            best_rtt = t2 - t0;
            best = remote - (t0 + (t2 - t0) / 2);
          }
        }
        offsets[2 * std::size_t(r)] = best;
        offsets[2 * std::size_t(r) + 1] = best_rtt;
      } else if (me == r) {
        for (int k = 0; k < rounds; ++k) {
          std::int64_t t0 = 0;
          check_mpi(MPI_Recv(&t0, 1, MPI_INT64_T, 0, tag, comm, MPI_STATUS_IGNORE), "MPI_Recv");
          const std::int64_t t1 = now();
          check_mpi(MPI_Send(&t1, 1, MPI_INT64_T, 0, tag, comm), "MPI_Send");
        }
      }
    }
    check_mpi(MPI_Bcast(offsets.data(), 2 * n, MPI_INT64_T, 0, comm), "MPI_Bcast");
    std::vector<clock_offset> out;
    for (int r = 0; r < n; ++r) out.push_back({offsets[2 * std::size_t(r)], offsets[2 * std::size_t(r) + 1]});
    return out;
  });
}

void transport::barrier() {
  auto done = std::make_shared<std::promise<void>>();
  auto f = done->get_future();
  auto* p = static_cast<poller*>(impl_->poller.get());
  send_control(*this, *impl_->rt, impl_->poller, control{[p, done] {
                 MPI_Request r;
                 check_mpi(MPI_Ibarrier(p->comm(), &r), "MPI_Ibarrier");
                 p->post_request(r, [done] { done->set_value(); });
               }});
  // The poller either completes the barrier or stops with an error.
  while (f.wait_for(std::chrono::milliseconds(10)) != std::future_status::ready) check();
  f.get();
}

}  // namespace nerve::bus::mpi

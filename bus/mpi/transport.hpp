#pragma once
/// \file
/// `bus::mpi::transport`: the bus across processes. A signal's subscriber on another rank
/// is a `remote<T>` endpoint; what it is handed goes over MPI and arrives in the
/// subscriber's mailbox on that rank as the same message.
///
/// ```
///   rank 0                                         rank 1
///   fc2.out.emit(m) ─► remote<T>::deliver          poller (a task on a loop)
///        │ (moves m into a send record)              MPI_Improbe ─► frame (tag 0) ─► codec<T>::make
///        ▼                                           MPI_Irecv payload straight into m's tensor (tag 1)
///   poller:          MPI_Isend frame  (tag 0) ──────►      │ MPI_Testsome: complete
///                    MPI_Isend payload (tag 1) ─────►      ▼
///                    (from the tensor, no copy)      try_tell(fc3, m) ─► fc3's loop runs it
/// ```
/// **Frames.** A message is two MPI messages on the transport's own communicator: a frame
/// (tag 0: channel, payload size, the codec's fixed fields such as micro-batch id, kind,
/// shape) and, when the payload is not empty, the payload itself (tag 1), sent from and
/// received into the value's own contiguous buffer: no copy beyond what MPI makes. MPI
/// keeps messages from one rank in order on one communicator and tag, and the receiver
/// posts the payload's receive right after taking its frame, so the k-th payload from a
/// rank is the k-th frame's. A *channel* names the receiving actor on that rank; both
/// sides agree on channels by wiring the same graph in the same order.
///
/// **Where it polls.** MPI has no event to wait on, so the transport polls, and the
/// poller is an actor: it posts MPI's sends, probes for frames, tests requests and hands
/// what arrived to the subscribers' mailboxes. A `remote<T>` sends the value to the poller
/// like any message (lock-free, and it wakes the poller's loop); while anything is in
/// flight, or traffic moved under 150 µs ago, the poller sends itself the next turn, and
/// it handles one message per turn (`spawn_options::batch`), so every other actor of its
/// loop runs between two polls (a value handed over runs at once); when quiet, it naps on
/// a timer of its loop (20 µs, doubling to 200 µs) and the next message wakes it at once.
/// Placed on the loop of the actors that talk to other ranks, a message crosses with no
/// thread switch; the default constructor gives the poller a runtime of its own (one loop,
/// one thread).
/// Every MPI call after `MPI_Init` is made by the poller, one at a time, from a thread that
/// did not initialise MPI: the level asked for is `MPI_THREAD_SERIALIZED` (`MULTIPLE`
/// would add locking inside Open MPI on every call for nothing). Completion comes back to
/// the owning actor as a message in its mailbox: the shape of a GPU completion, no thread
/// blocked per message. A full mailbox is retried on later turns (back-pressure), never
/// dropped; order is kept.
///
/// **Tracing.** The transport's own header (channel, payload size, flow id) carries a
/// cross-rank arrow: when the sending actor's recorder is on, `send` takes a flow id
/// (`cross_rank_flow | rank << 40 | n`: bit 62 marks it, the sender's rank keeps ranks
/// apart, and the recorder's own ids never reach bit 62), records the arrow's start on the
/// sender's track, bound to its send to the poller (so it leaves the sending handler run),
/// and the receiving rank records its end on the receiver's track, bound to the handler run
/// that takes the value (`recorder::bound_flow`). Off, it costs a branch on each side and 8
/// frame bytes (flow id 0). `bus/mpi/trace.hpp` merges the ranks' traces into one.
///
/// **Failure.** An MPI error, a frame for an unknown channel, or a payload whose size the
/// codec does not expect stops the transport with the error; `check()` rethrows it (and the
/// destructor reports it). A rank that dies ends the job through `mpirun` (the default
/// error handler aborts every rank).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "actors/address.hpp"
#include "actors/errors.hpp"
#include "actors/runtime.hpp"
#include "bus/signal.hpp"

namespace nerve::actors {
class runtime;
}

namespace nerve::bus::mpi {

/// How a message type crosses the wire. Specialise for each T sent through a `remote<T>`:
/// ```
///   template <> struct codec<my_msg> {
///     static void write(const my_msg&, std::vector<std::byte>& frame);   // fixed fields
///     static std::span<const std::byte> payload(const my_msg&);          // sent in place
///     // A value from its frame, its payload still to come: `payload` is where it goes
///     // (sized from the frame; the transport checks it against the sender's size).
///     static my_msg read(std::span<const std::byte> frame, std::span<std::byte>& payload);
///   };
/// ```
template <class T>
struct codec;

/// Appends and reads plain fields of a frame (`codec` helpers).
struct frame_writer {
  std::vector<std::byte>& out;
  template <class V>
  frame_writer& put(const V& v) {
    static_assert(std::is_trivially_copyable_v<V>);
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    out.insert(out.end(), p, p + sizeof(V));
    return *this;
  }
};
struct frame_reader {
  std::span<const std::byte> in;
  template <class V>
  V get() {
    static_assert(std::is_trivially_copyable_v<V>);
    if (in.size() < sizeof(V)) throw std::runtime_error("bus::mpi: frame shorter than its fields");
    V v;
    std::memcpy(&v, in.data(), sizeof(V));
    in = in.subspan(sizeof(V));
    return v;
  }
};

/// Counters of one transport (any thread; exact once the traffic has stopped).
struct transport_stats {
  std::uint64_t sent = 0;      ///< messages handed to MPI
  std::uint64_t received = 0;  ///< messages delivered into a local mailbox
  std::uint64_t bytes_sent = 0, bytes_received = 0;  ///< payload bytes
  std::uint64_t full_retries = 0;  ///< deliveries retried because a mailbox was full
};

/// One rank's clock against rank 0's (`transport::clock_offsets`).
struct clock_offset {
  std::int64_t offset_ns = 0;  ///< its steady_clock minus rank 0's
  std::int64_t rtt_ns = 0;     ///< the round trip it was measured in (error ≤ half of it)
};

/// Bit 62 of a flow id marks an arrow across ranks (`transport` header comment).
inline constexpr std::uint64_t cross_rank_flow = std::uint64_t{1} << 62;

/// MPI for a program whose transports come and go: initialises MPI (at
/// `MPI_THREAD_SERIALIZED`) unless it is up, and finalises it at the end if it did. While
/// no transport exists, the thread that made it may call MPI itself (`agree`).
class session {
 public:
  session();
  ~session();
  session(const session&) = delete;
  session& operator=(const session&) = delete;
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  /// `transport::agree` before any transport: from this thread, while none exists.
  void agree(const std::string& what, const std::string& mine,
             const std::string& remedy = "start every rank with the same arguments");
  /// A barrier that waits asleep (tests the request every 200 µs), so the ranks that wait
  /// leave the cores to one that works (benchmarks' phases). While no transport exists.
  void barrier();

 private:
  int rank_ = 0, size_ = 1;
  bool owns_ = false;
};

/// Throws `std::invalid_argument` naming `what` and each rank whose value in `all` (indexed
/// by rank) differs from rank 0's, with both values, and then what to do (`remedy`).
void check_agreement(const std::string& what, const std::vector<std::string>& all,
                     const std::string& remedy = "start every rank with the same arguments");

class transport {
 public:
  using channel = std::uint32_t;

  /// One transport polls at a time in a process: MPI is called from one thread at a time
  /// (`MPI_THREAD_SERIALIZED`), and a transport's poller is that thread. A second one while
  /// the first lives is refused (`std::logic_error`); share the first instead (several
  /// pipelines share one through `pipeline::mpi_ranks(t, first_channel)`).
  ///
  /// Initialises MPI (unless the program already did) and spawns the poller on a runtime
  /// of its own. With no `mpirun` around, MPI makes a world of one rank.
  transport();
  /// The same, with the poller on loop `loop` of `rt`, which must outlive the transport.
  transport(actors::runtime& rt, unsigned loop);
  /// Waits until every send has been taken by MPI, stops polling and finalises MPI if this
  /// transport initialised it. Call after the traffic has stopped, from outside the loops.
  ~transport();
  transport(const transport&) = delete;
  transport& operator=(const transport&) = delete;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }

  /// Wiring: messages that arrive on `ch` go into `to`'s mailbox (normal lane).
  template <class T>
  void listen(channel ch, actors::address to);

  /// Sends `value` to channel `ch` of rank `to`: from actor `from`'s handler, or from
  /// outside the loops with `from` null. Returns at once; the value is kept until MPI has
  /// taken its bytes. A poller mailbox that is full fails the sender (`send_error`).
  template <class T>
  void send(actors::actor* from, int to, channel ch, T value);

  /// Rethrows the error that stopped the transport, if any.
  void check() const;
  transport_stats stats() const;
  /// Blocks until every message sent so far has left (MPI completed its sends). Not on a loop.
  void flush();

  /// A barrier across the ranks, for set-up and tests (not on a loop).
  void barrier();

  // ---- set-up collectives: every rank calls them, in the same order, from outside the
  // loops; each blocks the poller's loop while it runs (milliseconds, before training).

  /// Every rank's `mine`, indexed by rank.
  std::vector<std::string> all_gather(const std::string& mine);
  /// Every rank's `mine`, indexed by rank, on rank `root`; an empty vector on the others.
  std::vector<std::string> gather(const std::string& mine, int root = 0);
  /// Checks that every rank passes the same `mine` (the model, the stage count: whatever
  /// must match). Throws `std::invalid_argument` on every rank when they differ, naming
  /// `what` and each rank whose value differs from rank 0's, with both values.
  void agree(const std::string& what, const std::string& mine);
  /// How far each rank's `std::chrono::steady_clock` is ahead of rank 0's, indexed by rank
  /// (rank 0: 0), the same on every rank. Measured by `rounds` ping-pongs between rank 0
  /// and each rank; the round with the shortest round trip gives the offset (the far clock
  /// read against the mid-point), so the error is at most half of that round trip, which
  /// is reported beside it.
  std::vector<clock_offset> clock_offsets(int rounds = 32);

 private:
  struct outgoing {
    static constexpr std::string_view kind = "mpi_send";
    int to = 0;
    std::vector<std::byte> frame;
    std::span<const std::byte> payload;
    std::shared_ptr<void> keep;  // the value whose buffer `payload` points into
  };
  struct inbox {
    // Reads a frame: returns where the payload goes and the delivery to run once it is in
    // (its argument: the poller's id, the message's sender).
    std::function<std::function<actors::send_status(actors::actor_id)>(std::span<const std::byte>, std::span<std::byte>&)>
        read;
    actors::address to;                      // the receiver (its recorder, its track)
    const actors::type_tag* tag = nullptr;   // the message kind (names the arrow)
  };
  struct impl;
  class poller;

  void start(actors::runtime& rt, unsigned loop);
  void start_polling(actors::runtime& rt, unsigned loop);
  void enqueue(actors::actor* from, outgoing o);
  // Tracing (the header comment): a fresh cross-rank flow id; the arrow's start, once sent.
  std::uint64_t next_flow() noexcept {
    return cross_rank_flow | std::uint64_t(rank_) << 40 |
           ((flows_.fetch_add(1, std::memory_order_relaxed) + 1) & ((std::uint64_t{1} << 40) - 1));
  }
  void traced_send(actors::actor* from, std::uint64_t flow, const actors::type_tag* tag) noexcept;
  void add_inbox(channel ch, inbox in);

  int rank_ = 0, size_ = 1;
  bool owns_mpi_ = false;
  std::unique_ptr<impl> impl_;
  actors::recorder* outside_ = nullptr;  // the poller's runtime's: sends from outside the loops
  std::atomic<std::uint64_t> flows_{0};
};

/// A subscriber of a signal that lives on another rank: `signal.subscribe(std::make_shared<
/// remote<T>>(transport, rank, channel), port)`.
template <class T>
class remote final : public bus::endpoint<T> {
 public:
  remote(transport& t, int rank, transport::channel ch) : t_(&t), rank_(rank), ch_(ch) {}
  void deliver(actors::actor& from, T&& value) override { t_->send<T>(&from, rank_, ch_, std::move(value)); }
  std::string name() const override {
    return "rank " + std::to_string(rank_) + " channel " + std::to_string(ch_);
  }

 private:
  transport* t_;
  int rank_;
  transport::channel ch_;
};

// ---- templates ------------------------------------------------------------------------

template <class T>
void transport::send(actors::actor* from, int to, channel ch, T value) {
  if (to < 0 || to >= size_)
    throw std::invalid_argument("bus::mpi: send to rank " + std::to_string(to) + " of " + std::to_string(size_));
  auto keep = std::make_shared<T>(std::move(value));
  outgoing o;
  o.to = to;
  const auto payload = codec<T>::payload(*keep);
  // The sender's recorder decides whether this value draws an arrow (one branch when off).
  const std::uint64_t flow = (from ? from->system().trace() : *outside_).enabled() ? next_flow() : 0;
  frame_writer{o.frame}.put(ch).put(std::uint64_t(payload.size())).put(flow);
  codec<T>::write(*keep, o.frame);
  o.payload = payload;
  o.keep = std::move(keep);
  enqueue(from, std::move(o));
  if (flow != 0) [[unlikely]]
    traced_send(from, flow, actors::tag_of<T>());
}

template <class T>
void transport::listen(channel ch, actors::address to) {
  add_inbox(ch, inbox{[to](std::span<const std::byte> frame, std::span<std::byte>& payload) {
                        auto value = std::make_shared<T>(codec<T>::read(frame, payload));
                        return std::function<actors::send_status(actors::actor_id)>([to, value](actors::actor_id from) {
                          return to.get()->try_tell(std::move(*value), actors::lane::normal, from);
                        });
                      },
                      to, actors::tag_of<T>()});
}

}  // namespace nerve::bus::mpi

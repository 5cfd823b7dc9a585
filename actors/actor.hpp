#pragma once
/// \file
/// `actor`: the base class of everything that handles messages.
///
/// An actor lives on exactly one event loop of a `runtime`. All of its handlers run on
/// that loop, one at a time, so an actor needs no locks for its own state. Messages
/// arrive through its mailbox: an MPSC queue per lane (urgent before normal), drained in
/// batches; the actor is posted onto its loop once per wake-up (empty -> non-empty),
/// not once per message.
///
/// ```
///   class counter : public nerve::actors::actor {
///    public:
///     counter() : actor("counter") {
///       on<int>([this](int& v) { total_ += v; });
///       on<get_total>([this](get_total&) { return total_; });   // answers requests
///     }
///    private:
///     long total_ = 0;
///   };
/// ```
///
/// Thread-safety: members marked "any thread" may be called from anywhere; everything
/// else only from the actor's own handlers (its loop).

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include <boost/asio/any_io_executor.hpp>

#include "actors/address.hpp"
#include "actors/detail/mpsc_queue.hpp"
#include "actors/errors.hpp"
#include "actors/message.hpp"
#include "actors/result.hpp"

namespace nerve::actors {

class runtime;
namespace detail {
struct loop_state;
}

/// Sent (urgent lane) to an actor's supervisor when one of its children fails.
/// An actor with no handler for `failure` escalates it: it fails itself with the same error.
struct failure {
  static constexpr std::string_view kind = "failure";
  actor_id who = 0;
  std::string name;
  std::exception_ptr error;
};

/// Internal: the answer to a request, routed to the requesting actor.
struct response {
  static constexpr std::string_view kind = "response";
  std::uint64_t id = 0;
  std::shared_ptr<void> value;
  std::exception_ptr error;
};

/// Internal: a closure run on the actor's loop in its context (post, when_writable).
struct closure {
  static constexpr std::string_view kind = "closure";
  std::function<void()> fn;
};

/// The answer to a request, to be given later (after a GPU completion, after other
/// actors answered). Obtained in the request's handler with `actor::defer_reply<R>()`.
/// Movable; deliver or fail it once, from any thread. Destroyed unanswered, it fails the
/// request with a `wiring_error` so the requester never waits forever.
template <class R>
class deferred_reply {
 public:
  deferred_reply() = default;
  explicit deferred_reply(std::unique_ptr<reply_sink_base> s) : sink_(std::move(s)) {}
  deferred_reply(deferred_reply&&) noexcept = default;
  deferred_reply& operator=(deferred_reply&& o) noexcept {
    abandon();
    sink_ = std::move(o.sink_);
    return *this;
  }
  ~deferred_reply() { abandon(); }
  /// True when there is a requester waiting (the message was a request and not answered yet).
  explicit operator bool() const noexcept { return sink_ != nullptr; }
  template <class V = R>
    requires(!std::is_void_v<V>)
  void deliver(V value) {
    if (sink_) std::exchange(sink_, nullptr)->deliver(&value);
  }
  void deliver()
    requires std::is_void_v<R>
  {
    if (sink_) std::exchange(sink_, nullptr)->deliver(nullptr);
  }
  void fail(std::exception_ptr e) {
    if (sink_) std::exchange(sink_, nullptr)->fail(std::move(e));
  }

 private:
  void abandon() {
    if (sink_) std::exchange(sink_, nullptr)->fail(std::make_exception_ptr(wiring_error("a deferred reply was dropped unanswered")));
  }
  std::unique_ptr<reply_sink_base> sink_;
};

class actor {
 public:
  /// `name` shows in errors and traces; empty gives "actor-<id>".
  explicit actor(std::string name = {});
  virtual ~actor();
  actor(const actor&) = delete;
  actor& operator=(const actor&) = delete;

  /// Any thread.
  actor_id id() const noexcept { return id_; }
  /// Any thread.
  const std::string& name() const noexcept { return name_; }
  /// Any thread: the index of the loop this actor lives on now (a snapshot: an actor the
  /// runtime may move, see `runtime_options::policy`, can be elsewhere by the time it is read).
  unsigned loop_index() const noexcept;
  /// Any thread: true when the runtime never moves this actor to another loop (spawned on
  /// an explicit loop, by a policy other than `placement::automatic`, or `pin()`ned).
  bool pinned() const noexcept { return pinned_.load(std::memory_order_relaxed); }
  /// Any thread: how many times the runtime moved this actor to another loop.
  std::uint32_t moves() const noexcept { return moves_.load(std::memory_order_relaxed); }
  /// Any thread: true once stopped or failed.
  bool stopped() const noexcept { return closed_.load(std::memory_order_acquire); }
  /// Any thread: messages queued in the normal lane (reserved by senders, not yet taken by
  /// the actor's drain). Never more than the capacity.
  std::size_t queued() const noexcept {
    const auto released = normal_released_.load(std::memory_order_acquire);  // first: it never passes the reserved count
    const auto reserved = normal_of(state_.load(std::memory_order_acquire));
    const auto n = static_cast<std::int32_t>(reserved - released);
    return n > 0 ? static_cast<std::size_t>(n) : 0;
  }
  /// Any thread: the normal lane's capacity.
  std::size_t capacity() const noexcept { return capacity_; }

  /// Any thread. Enqueues a message without waiting. On `full` or `closed` the message is
  /// left untouched in `msg`, so nothing is lost.
  template <class T>
  send_status try_tell(T&& msg, lane where = lane::normal, actor_id from = 0);

  // ---- sending: from this actor's own handlers (its loop) only ----

  /// Sends `msg` to `to`, as this actor. Throws `send_error` if the receiver stopped, or if its mailbox is
  /// full (use `try_send` + `when_writable` where a full mailbox is an expected condition).
  template <class T>
  void send(const address& to, T&& msg, lane where = lane::normal);
  /// Sends without throwing; on `full`/`closed` `msg` is untouched.
  template <class T>
  [[nodiscard]] send_status try_send(const address& to, T&& msg, lane where = lane::normal);
  /// Runs `f` on this actor's loop once `to` has room in its normal lane (or has stopped).
  /// Until then the wait counts as work in flight: `synchronize()` waits for `f` to run.
  void when_writable(const address& to, std::function<void()> f);

  /// Sends `msg` as a request; `on_reply(result<R>)` runs on this actor's loop with the
  /// receiver's answer, its error, or a `request_timeout` after `timeout`. Exactly once.
  template <class R, class T, class F>
  void request(const address& to, T&& msg, std::chrono::nanoseconds timeout, F&& on_reply);

  /// Runs `f` later on this actor's loop, in its context (through the urgent lane).
  void post(std::function<void()> f);

  /// This actor's address.
  address self() noexcept { return address(this); }
  /// True when this actor has a handler for message kind `tag`. For wiring-time checks:
  /// call after spawn, before messages flow (handlers are registered in constructors).
  bool accepts(const type_tag* tag) const noexcept {
    for (auto& h : handlers_)
      if (h.tag == tag) return true;
    return false;
  }
  /// The runtime this actor belongs to.
  runtime& system() const noexcept { return *rt_; }
  /// The executor of this actor's loop (for timers, GPU completions). Handlers posted
  /// directly to it run outside the mailbox; prefer `post`. Taking it pins the actor
  /// (`pin`): what runs on that executor must keep finding the actor on that loop.
  boost::asio::any_io_executor executor() const;

 protected:
  /// Registers the handler for messages of type T. `f` takes `T&` (the payload, which it
  /// may move from) and returns void or a reply value (sent back when the message was a
  /// request). Call from the constructor or from a handler.
  template <class T, class F>
  void on(F&& f);

  /// Runs first on the actor's loop, before any message.
  virtual void on_start() {}
  /// Runs last on the actor's loop, after it stops or fails (not after the runtime is destroyed).
  virtual void on_stop() {}

  /// Stops this actor after the current handler: the mailbox closes, queued messages are
  /// dropped (requests among them get an error), `on_stop` runs.
  void stop();
  /// Fails this actor with `error` as if a handler had thrown it.
  void fail(std::exception_ptr error);
  /// Keeps this actor on the loop it is on now, for good: the runtime no longer moves it
  /// (see `runtime_options::policy`). From the constructor or a handler.
  void pin() noexcept { pinned_.store(true, std::memory_order_relaxed); }

  /// In a handler: takes over the answer to the request being handled, to give it later.
  /// Empty when the message is not a request. Throws `wiring_error` if the requester
  /// waits for another type than R.
  template <class R>
  deferred_reply<R> defer_reply() {
    if (!current_ || !current_->reply) return {};
    check_reply_type(current_->reply->expects, tag_of<R>());
    return deferred_reply<R>(std::move(current_->reply));
  }

  /// The sender of the message being handled (0 when sent from outside any actor).
  actor_id sender() const noexcept { return current_ ? current_->sender : 0; }
  /// The micro-batch of the message being handled (-1 when none).
  std::int64_t micro_batch() const noexcept { return current_ ? current_->micro_batch : -1; }

 private:
  friend class runtime;
  friend class address;
  friend detail::actor_cell* detail::cell_of(actor*) noexcept;
  friend void detail::destroy_actor(actor*) noexcept;
  friend void detail::release(detail::actor_cell*) noexcept;
  template <class R>
  friend struct actor_reply_sink;

  using handler_fn = std::function<void(envelope&)>;
  struct handler_entry {
    const type_tag* tag;
    handler_fn fn;
  };
  struct pending_request;
  struct space_waiter {
    address waiter;             // empty for a thread outside the runtime
    std::function<void()> fn;
    // The waiter's runtime, which counts the wake-up as work in flight from registration
    // until its closure is sent (begin_work/end_work): otherwise synchronize() could find
    // every message handled while the producer waits for a wake-up not yet sent.
    runtime* owed = nullptr;
  };

  // Mailbox (any thread). The state word (see `state_`) counts what senders reserved in each
  // lane and whether the actor is scheduled; the drain counts what it took.
  static constexpr std::uint64_t scheduled_bit = 1;
  static constexpr std::uint64_t urgent_one = 2;                  // urgent reservations: bits 1..30
  static constexpr std::uint64_t urgent_mask = 0x7fff'fffeULL;
  // The last address went while the actor was scheduled: its drain destroys it when it goes
  // idle (release() and try_idle() decide by compare-and-swap on this word, so exactly one does).
  static constexpr std::uint64_t doomed_bit = 1ULL << 31;
  static constexpr std::uint64_t normal_one = 1ULL << 32;          // normal reservations: bits 32..63
  /// The largest capacity the 32-bit counts allow (larger requests are clamped to it).
  static constexpr std::size_t max_capacity = (std::size_t{1} << 31) - 1;
  static constexpr std::uint32_t normal_of(std::uint64_t w) noexcept { return static_cast<std::uint32_t>(w >> 32); }
  static constexpr std::uint32_t urgent_of(std::uint64_t w) noexcept { return static_cast<std::uint32_t>((w & urgent_mask) >> 1); }
  struct reservation {
    send_status status;
    bool wake;              // the actor was idle: the sender schedules it after its push
    std::uint32_t normal;   // the normal lane's reservations after this one (the recorder's depth)
  };
  send_status enqueue(std::unique_ptr<envelope>& e);  // reserve + push; refused, `e` stays with the caller
  reservation reserve(lane where) noexcept;           // room in the lane (and the scheduled bit), or why not
  // Room for one more normal message, the reservations being those of state word `w`. The
  // hint is never ahead of normal_released_, so a count under the capacity against it is
  // under the capacity for certain; only at the capacity is the drain's line read for the
  // real count (and the hint moved up to it).
  bool has_room(std::uint64_t w) noexcept {
    const auto hint = released_hint_.load(std::memory_order_relaxed);
    if (static_cast<std::uint32_t>(normal_of(w) - hint) < capacity_) return true;
    const auto released = normal_released_.load(std::memory_order_acquire);
    if (released != hint) released_hint_.store(released, std::memory_order_relaxed);
    return static_cast<std::int64_t>(static_cast<std::int32_t>(normal_of(w) - released)) <
           static_cast<std::int64_t>(capacity_);
  }
  void schedule();
  void drain();
  // Migration (placement::automatic), at the end of a drain that was timed or ends a window
  // (the drain inlines only the window's count): the timing taken, then whether to move to
  // another loop; true when it moved (the actor is then scheduled on the new loop).
  [[gnu::noinline]] bool consider_move(detail::loop_state* here, std::int64_t timed_from, std::uint64_t sent_before, std::uint32_t taken);
  [[gnu::noinline, gnu::cold]] bool decide_move(detail::loop_state* here);
  /// A request of this actor's awaits its answer (its timeout timer is bound to this loop).
  bool awaiting_answers() const noexcept;
  detail::loop_state* home() const noexcept { return loop_.load(std::memory_order_relaxed); }
  // The drain's loop, made twice (drain picks): recording when the drain began, with each
  // run's recording inlined (record_run), or not, as lean as with no recorder.
  template <bool Recording>
  void drain_runs();
  // End of a drain: clears the scheduled bit if everything reserved was taken (idle), and
  // says whether the last address went meanwhile (doomed: the drain then destroys the actor).
  enum class idle_result { busy, idle, doomed };
  idle_result try_idle() noexcept;
  // release(): the last address went. True when the actor is not scheduled (the caller
  // destroys it now); false when it is, and its drain destroys it once it goes idle.
  bool doom() noexcept;
  void run_start();  // on_start, as the first message the actor handles
  envelope* pop() noexcept;
  void add_space_waiter(space_waiter w);
  struct waiters_guard;  // holds waiters_lock_
  void fire_space_waiters();

  // Loop side.
  // Runs e's handler: recorded (a message stamped at its send, while recording is still
  // on) or not. Off, that is one extra load per message.
  void invoke(envelope& e);
  void invoke_plain(envelope& e);
  // Runs e's handler and fails a request it left unanswered; returns what it threw (its
  // reply, if any, already failed with it).
  std::exception_ptr run_handler(envelope& e);
  [[gnu::noinline, gnu::cold]] void fail_unanswered(envelope& e);  // a request whose handler did not answer
  // Recording (recorder.hpp): a run timed in a group of short runs, or on its own.
  [[gnu::noinline]] void invoke_recorded(envelope& e, std::uint8_t mode);
  void record_run(envelope& e, std::uint8_t mode);  // its body, inlined in drain_runs<true>
  [[gnu::noinline]] void invoke_timed(envelope& e, bool long_type);
  [[gnu::noinline]] void record_failure(const envelope& e, std::exception_ptr err);
  void dispatch(envelope& e);
  void handle_response(response& r);
  void drop(envelope& e, const char* reason) noexcept;
  void record_send(const envelope& e) noexcept;  // recording: a send that will have no handler run
  void close_group(std::int64_t now) noexcept;  // recording: times the loop clock's open group up to `now`
  void stop_clock() noexcept;  // recording: the loop clock goes idle (mark 0); an open group ends now
  // recording: a timed run by the recorder's slow ways (a new chunk, the side list)
  [[gnu::noinline]] void record_slow(const envelope& e, std::int64_t taken, std::int64_t start, std::int64_t end) noexcept;
  void close_and_stop();
  void send_envelope(const address& to, std::unique_ptr<envelope> e);
  send_status try_send_envelope(const address& to, std::unique_ptr<envelope>& e);
  void begin_request(const address& to, std::unique_ptr<envelope> e, std::uint64_t id,
                     std::chrono::nanoseconds timeout,
                     std::function<void(std::shared_ptr<void>, std::exception_ptr)> cb);
  [[noreturn]] void throw_send_error(send_status s, const address& to, std::string_view kind) const;
  void check_reply_type(const type_tag* expected, const type_tag* given) const;

  // Fields by who writes them, a cache line each: an actor starts on a 64-byte boundary
  // (arena slots, and the aligned operator new otherwise). A hop between loops then moves
  // the senders' line to the sender and back once per drain, and the drain's line stays
  // with the drain, instead of both sides writing one line per message.
  //
  // -- line 0, written by senders (after the vtable pointer): the state word, the normal
  //    lane's head and stub, the ready-queue link. The drain writes it once per drain: the
  //    compare-and-swap that clears the scheduled bit, the stub pushed back at the queue's
  //    last node.
  // One compare-and-swap per send reserves room, counts the message and decides who schedules
  // the actor: [normal reserved : 32][doomed : 1][urgent reserved : 30][scheduled : 1]. The
  // counts wrap; differences with the drain's counts stay far below 2^30.
  std::atomic<std::uint64_t> state_{0};
  // A lower bound of normal_released_ that senders keep on their line: while the reserved
  // count is less than a capacity ahead of it there is room for certain, and a send does not
  // read the drain's line at all; only a send that finds it a capacity behind reads
  // normal_released_ and moves it up.
  std::atomic<std::uint32_t> released_hint_{0};
  std::atomic<bool> closed_{false};
  detail::mpsc_head normal_in_;  // the normal lane's producer side: head, and the stub
  detail::mpsc_node normal_stub_;
  detail::ready_link ready_link_;  // this actor's entry in its loop's ready queue (queued at most once)
  // -- line 1, written by the drain (every message) and read by nobody else on the hot path.
  // The drain's count of normal messages taken, for queued() and for senders that find the
  // hint a capacity behind (a plain store per message: no read-modify-write).
  alignas(64) std::atomic<std::uint32_t> normal_released_{0};
  std::uint32_t normal_taken_ = 0;  // normal messages popped (normal_released_ publishes it)
  std::uint32_t urgent_taken_ = 0;  // urgent messages popped, the start included (mod 2^30 where compared)
  unsigned batch_ = 64;
  bool started_ = false;  // on_start ran (the first drain runs it before any message)
  bool stop_requested_ = false;
  bool stop_done_ = false;
  std::atomic<bool> has_space_waiters_{false};  // read once per drain
  std::atomic<bool> waiters_lock_{false};  // guards waiters_ (rare path; a byte, not a 40-byte mutex, per actor)
  detail::mpsc_tail normal_out_;  // the normal lane's consumer end
  // The urgent lane whole: rare on the hot path, where the drain's pop reads only its tail
  // and stub.
  detail::mpsc_tail urgent_out_;
  detail::mpsc_node urgent_stub_;
  detail::mpsc_head urgent_in_;
  envelope* current_ = nullptr;
  // Migration's sampled counters (drain only; see runtime.hpp, "Placement and migration"):
  // a majority vote over the senders' loops of the window's messages, and the window.
  std::uint16_t vote_loop_ = 0;       // the loop leading the vote (Boyer-Moore majority)
  std::uint16_t pull_candidate_ = 0xffff;  // the loop the last window would have moved to (affinity), or none
  std::uint16_t timed_countdown_ = 1; // drains until the next timed one (the one after the start's)
  bool heavy_ = true;                 // the window's fastest run at or above heavy_ns; until a drain is timed, unknown counts as heavy
  std::uint32_t votes_ = 0;           // its lead
  std::uint32_t window_msgs_ = 0;     // messages handled in this window
  std::uint32_t window_target_ = ~0u; // messages in this window (runtime::start sets it for mobile actors)
  std::uint32_t window_epoch_ = 0;    // the runtime's migration epoch when the window began
  std::uint32_t hold_ = 0;            // windows to skip before deciding again (backoff after a move)
  std::uint32_t run_ns_ = 0;          // the last window's fastest timed run per message (0: none timed here yet)
  std::uint32_t load_ns_ = 0;         // what it adds to its loop's heavy_ns: run_ns_ while heavy, else 0
  std::uint32_t window_min_ns_ = ~0u; // this window's fastest timed run per message
  // -- line 2, read by senders, written at spawn only (and by a move: loop_).
  alignas(64) std::size_t capacity_ = 0;
  runtime* rt_ = nullptr;
  std::atomic<detail::loop_state*> loop_{nullptr};  // changes only while the drain holds the scheduled bit
  mutable std::atomic<bool> pinned_{false};  // runtime::start sets it for actors it may not move
  std::atomic<std::uint32_t> moves_{0};
  detail::actor_cell* cell_;  // the reference count addresses share (outlives the actor when they do)
  actor_id id_ = 0;
  std::uint32_t arena_bytes_ = 0;  // the size it was placed with in its runtime's arena; 0: operator new
  std::int64_t start_ticks_ = 0;  // recording: ticks at spawn (the start's "send"); 0 when not recorded
  // -- the rest
  std::string name_;
  address supervisor_;
  std::vector<handler_entry> handlers_;
  std::uint64_t next_request_ = 0;
  std::unique_ptr<std::unordered_map<std::uint64_t, pending_request>> requests_;
  std::vector<space_waiter> waiters_;
};

// ---- reply sinks --------------------------------------------------------------

/// Delivers the answer to a request back to the requesting actor as a `response`.
template <class R>
struct actor_reply_sink final : reply_sink_base {
  actor_reply_sink(address to, std::uint64_t id) : reply_sink_base(tag_of<R>()), to_(std::move(to)), id_(id) {}
  void deliver(void* v) override {
    response r{.id = id_, .value = nullptr, .error = nullptr};
    if constexpr (!std::is_void_v<R>) r.value = std::make_shared<R>(std::move(*static_cast<R*>(v)));
    to_.get()->try_tell(std::move(r), lane::urgent);  // urgent: never refused for capacity
  }
  void fail(std::exception_ptr e) override {
    to_.get()->try_tell(response{.id = id_, .value = nullptr, .error = std::move(e)}, lane::urgent);
  }

 private:
  address to_;
  std::uint64_t id_;
};

// ---- templates ------------------------------------------------------------------

template <class T>
send_status actor::try_tell(T&& msg, lane where, actor_id from) {
  using U = std::remove_cvref_t<T>;
  // A closed or full mailbox refuses before the payload moves (no allocation either). The
  // check is advisory: the binding one is enqueue's, and a message refused there is handed
  // back to `msg`, so a refused message stays with the caller either way.
  if (closed_.load(std::memory_order_acquire)) return send_status::closed;
  if (where == lane::normal && !has_room(state_.load(std::memory_order_relaxed))) return send_status::full;
  auto e = make_envelope(std::move(msg), from, where);
  auto& value = static_cast<typed_envelope<U>&>(*e).value;
  e->bytes = payload_bytes_of(value);
  const auto s = enqueue(e);
  if (s != send_status::ok) {
    if constexpr (!std::is_const_v<std::remove_reference_t<T>>) {
      if constexpr (std::is_move_assignable_v<U>) {
        msg = std::move(value);
      } else {
        std::destroy_at(&msg);
        std::construct_at(&msg, std::move(value));
      }
    }
  }
  return s;
}

template <class T, class F>
void actor::on(F&& f) {
  using M = std::remove_cvref_t<T>;
  handler_fn fn = [this, fn = std::forward<F>(f)](envelope& e) mutable {
    M& m = *static_cast<M*>(e.payload());
    using R = std::invoke_result_t<decltype(fn)&, M&>;
    if constexpr (std::is_void_v<R>) {
      fn(m);  // may have taken the reply with defer_reply()
      if (e.reply) {
        check_reply_type(e.reply->expects, tag_of<void>());
        std::exchange(e.reply, nullptr)->deliver(nullptr);
      }
    } else {
      R r = fn(m);
      if (e.reply) {
        check_reply_type(e.reply->expects, tag_of<R>());
        std::exchange(e.reply, nullptr)->deliver(&r);
      }
    }
  };
  for (auto& h : handlers_) {
    if (h.tag == tag_of<M>()) {
      h.fn = std::move(fn);
      return;
    }
  }
  handlers_.push_back({tag_of<M>(), std::move(fn)});
}

template <class T>
void actor::send(const address& to, T&& msg, lane where) {
  auto e = make_envelope(std::forward<T>(msg), id_, where);
  e->bytes = payload_bytes_of(static_cast<typed_envelope<std::remove_cvref_t<T>>&>(*e).value);
  send_envelope(to, std::move(e));
}

template <class T>
send_status actor::try_send(const address& to, T&& msg, lane where) {
  if (!to) throw wiring_error("actor '" + name_ + "' sent to an empty address");
  return to.get()->try_tell(std::forward<T>(msg), where, id_);
}

template <class R, class T, class F>
void actor::request(const address& to, T&& msg, std::chrono::nanoseconds timeout, F&& on_reply) {
  auto id = ++next_request_;
  auto e = make_envelope(std::forward<T>(msg), id_, lane::normal);
  e->reply = std::make_unique<actor_reply_sink<R>>(self(), id);
  begin_request(to, std::move(e), id, timeout,
                [f = std::forward<F>(on_reply)](std::shared_ptr<void> v, std::exception_ptr err) mutable {
                  if (err) {
                    f(result<R>(std::move(err)));
                  } else if constexpr (std::is_void_v<R>) {
                    f(result<void>());
                  } else {
                    f(result<R>(std::move(*static_cast<R*>(v.get()))));
                  }
                });
}

}  // namespace nerve::actors

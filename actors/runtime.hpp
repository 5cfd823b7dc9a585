#pragma once
/// \file
/// `runtime`: N event loops (one `boost::asio::io_context` per worker thread), the actors
/// placed on them, and the ways in from outside: send, submit (a future), ask (a request
/// with a timeout), synchronize (wait for everything in flight), shutdown.
///
/// Thread-safety: every public member may be called from any thread unless it says
/// otherwise; `synchronize`, `send_wait` and `shutdown` must not be called from a loop
/// thread (they would wait for themselves) and throw `wiring_error` if they are.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include "actors/actor.hpp"
#include "actors/detail/actor_arena.hpp"
#include "actors/detail/loop_state.hpp"
#include "actors/detail/segmented_vector.hpp"
#include "actors/recorder.hpp"

namespace nerve::actors {

/// Where `spawn` puts an actor when no loop is named, and whether it stays there.
///
/// ## Placement and migration
/// With `automatic` (the default) an actor spawned from a handler starts on its spawner's
/// loop, one spawned from outside the runtime on the loops in turn; then the runtime may
/// move it. Each such actor votes, message by message, for the loop its senders ran
/// (a Boyer-Moore majority: a few instructions per message) and times one drain in 16
/// (a heavy actor, every drain).
/// At the end of a drain, once a window of `migration_options::window` messages is
/// counted, it decides (a cold function, once per window; a new actor's first windows are
/// short, `first_window` messages, and double up to `window`, so a pair settles and heavy
/// work spreads after about a hundred messages):
/// - affinity: a light actor (sampled mean handler run under `heavy_ns`) that got at least
///   3/4 of its window from one other loop moves there: its hops then stay on one core;
/// - balance: a heavy actor whose loop has other actors waiting moves to a loop that is
///   idle with no heavy work, or to one where nobody waits if the heavier of the two
///   loops gets lighter by it (the loops' heavy loads: the run times per message of their
///   heavy mobile actors): heavy work spreads evenly, light chatter packs.
/// A move happens only between the actor's drains, while it holds its scheduled bit: it
/// runs on one loop at a time, its handlers never overlap, and its mailbox (one FIFO per
/// lane) moves whole, so every sender's order is kept. Moves take turns (an epoch that a
/// move increments makes every light actor's window stale, so two partners never swap
/// loops at once; a heavy actor's decision reads the loads as they are now), and after its
/// k-th move an actor waits 2^k - 1 windows before deciding again: moves die out when the
/// load stops changing.
///
/// Never moved: actors spawned on an explicit loop (`spawn_on`, `spawn_options::loop`) or
/// with `spawn_options::pinned`, actors that `pin()` themselves or take their `executor()`,
/// actors with a request in flight (its timer is bound to the loop) at decision time, and
/// every actor of a manual-mode runtime or of the other policies.
enum class placement {
  automatic,     ///< spawner's loop (from outside: loops in turn), then migration (see above)
  round_robin,   ///< loops in turn; never moved
  least_actors,  ///< the loop with the fewest live actors; never moved
};

/// Tuning of `placement::automatic`'s migration.
struct migration_options {
  bool enabled = true;       ///< false: automatic placement, no moves
  unsigned window = 256;     ///< messages an actor handles between two decisions (once ramped up)
  unsigned first_window = 32;  ///< the first decision's window; each later one doubles, up to `window`
  unsigned heavy_ns = 2000;  ///< mean handler run at or above which an actor is heavy (balanced, never packed): a few cross-core hops
  unsigned max_backoff = 12; ///< after k moves an actor skips 2^min(k, this) - 1 windows
};

/// Moves so far (`runtime::migrations`).
struct migration_counts {
  std::uint64_t affinity = 0;  ///< light actors moved to their senders' loop
  std::uint64_t balance = 0;   ///< heavy actors moved to an idle loop
  std::uint64_t total() const noexcept { return affinity + balance; }
};

struct runtime_options {
  /// Event loops (worker threads). 0 means the hardware threads.
  unsigned loops = 0;
  /// Deterministic mode: no threads; the caller steps the loops with `poll`/`run_until_idle`.
  bool manual = false;
  /// Default capacity of an actor's normal lane (messages; at most 2^31 - 1, larger values are clamped).
  std::size_t mailbox_capacity = 1024;
  /// Messages an actor handles per turn before yielding its loop to the next actor.
  unsigned batch = 64;
  placement policy = placement::automatic;
  migration_options migration{};
  /// Start with the recorder on.
  bool record = false;
  /// How the recorder times handler runs (`recorder::timing`; `trace().set_timing` later).
  recorder::timing record_timing = recorder::timing::shared;
};

/// How `shutdown` treats work in flight.
enum class shutdown_mode {
  drain,   ///< wait until every queued message was handled, then stop every actor
  cancel,  ///< stop every actor now; queued messages are dropped (requests get an error)
};

struct spawn_options {
  std::optional<unsigned> loop;  ///< place on this loop (and never move it); otherwise the runtime's policy
  bool pinned = false;           ///< never move it (placement::automatic still picks where it starts)
  std::size_t capacity = 0;      ///< 0: the runtime's default
  /// Messages it handles per turn before the loop's other actors run; 0: the runtime's
  /// `runtime_options::batch`. 1 suits an actor that keeps itself busy with messages to
  /// itself (a poller): each of its turns is followed by everyone else's.
  unsigned batch = 0;
  address supervisor;            ///< gets `failure` messages; empty: the runtime
};

class runtime {
 public:
  explicit runtime(runtime_options opts = {});
  /// Shuts down with `shutdown_mode::cancel` if `shutdown` was not called.
  ~runtime();
  runtime(const runtime&) = delete;
  runtime& operator=(const runtime&) = delete;

  /// Constructs an `A` (derived from `actor`) from `args` and starts it. Out of memory
  /// (`std::bad_alloc` from any of its allocations), it throws and leaves the runtime as
  /// it was: nothing of the failed actor is registered or left alive.
  template <class A, class... Args>
  address spawn(Args&&... args) {
    return spawn_with<A>(spawn_options{}, std::forward<Args>(args)...);
  }
  /// Like `spawn`, on loop `loop`.
  template <class A, class... Args>
  address spawn_on(unsigned loop, Args&&... args) {
    spawn_options o;
    o.loop = loop;
    return spawn_with<A>(std::move(o), std::forward<Args>(args)...);
  }
  template <class A, class... Args>
  address spawn_with(spawn_options opts, Args&&... args) {
    static_assert(std::is_base_of_v<actor, A>, "spawn: A must derive from nerve::actors::actor");
    check_spawn(opts);
    if constexpr (alignof(A) > detail::actor_arena::granule) {
      return start(new A(std::forward<Args>(args)...), 0, opts);
    } else {
      // Placed in the runtime's arena (see detail/actor_arena.hpp): reused slots, huge pages.
      void* mem = arena_->allocate(sizeof(A));
      A* a;
      try {
        a = ::new (mem) A(std::forward<Args>(args)...);
      } catch (...) {
        arena_->deallocate(mem, sizeof(A));
        throw;
      }
      return start(a, sizeof(A), opts);
    }
  }

  /// Sends from outside any actor. Throws `send_error` when the receiver stopped or is full.
  template <class T>
  void send(const address& to, T&& msg, lane where = lane::normal) {
    auto s = to.get()->try_tell(std::forward<T>(msg), where, 0);
    if (s != send_status::ok) throw_send_error(s, to);
  }
  /// Sends without throwing; on `full`/`closed` `msg` is untouched.
  template <class T>
  [[nodiscard]] send_status try_send(const address& to, T&& msg, lane where = lane::normal) {
    return to.get()->try_tell(std::forward<T>(msg), where, 0);
  }
  /// Sends, waiting (blocking this thread) while the receiver's mailbox is full.
  /// Not from a loop thread. Throws `send_error` if the receiver stops.
  template <class T>
  void send_wait(const address& to, T msg);

  /// Sends `msg`; the future is ready once its handler has run (or holds its error).
  template <class T>
  std::future<void> submit(const address& to, T msg) {
    return ask<void>(to, std::move(msg), std::chrono::nanoseconds::max(), true);
  }
  /// A request from outside: the future holds the handler's return value (type R), or
  /// `request_timeout` after `timeout`, or the receiver's error.
  template <class R, class T>
  std::future<R> ask(const address& to, T msg, std::chrono::nanoseconds timeout, bool any_reply = false);

  /// Stops an actor (urgent lane: after the handler running now, before queued messages).
  void stop(const address& a);

  /// Waits until no message is queued or being handled anywhere (like a device
  /// synchronize). Rethrows the first failure of the run, if any. In manual mode it
  /// steps the loops on the calling thread instead of waiting.
  void synchronize();
  /// True when nothing is queued or being handled (a snapshot).
  bool idle() const noexcept;

  /// Ends the run. See `shutdown_mode`. Idempotent. Rethrows nothing; see `error()`.
  /// Allocates only the stops' messages: when memory runs out for them, the loops stop
  /// where they are, the actors are destroyed with the runtime (without `on_stop`), and
  /// `error()` holds the `std::bad_alloc`.
  void shutdown(shutdown_mode mode = shutdown_mode::drain);

  /// The first failure of the run (a handler's exception, wrapped), or null.
  std::exception_ptr error() const;
  /// Any thread: called with the first failure when it happens (set before spawning).
  void on_failure(std::function<void(std::exception_ptr)> f);

  /// Manual mode: runs the ready handlers of every loop once; returns how many ran.
  std::size_t poll();
  /// Manual mode: polls until nothing is left to run; returns how many ran.
  std::size_t run_until_idle();

  unsigned loop_count() const noexcept { return static_cast<unsigned>(loops_.size()); }
  /// The io_context of loop `i` (for timers and I/O owned by actors on it).
  boost::asio::io_context& loop(unsigned i) { return loops_.at(i)->io; }
  /// Actors spawned so far (including stopped ones).
  std::size_t spawned() const noexcept;
  /// Any thread: how many actors `placement::automatic` moved so far, by reason (a snapshot).
  migration_counts migrations() const noexcept;
  const runtime_options& options() const noexcept { return opts_; }

  /// The message recorder (off unless `runtime_options::record` or `trace().enable()`).
  recorder& trace() noexcept { return recorder_; }
  /// Writes the recorded trace (Chrome trace event format, see docs/trace-format.md).
  void write_trace(const std::string& path) const;
  /// Same, with `extra` merged into the top-level `nerve` object (stages, schedule, ...).
  void write_trace(const std::string& path, const nlohmann::json& extra) const;
  /// Any thread: the `nerve.actors` array of the trace ({id, name, loop, stage, group} per
  /// actor spawned so far), for writers that build the trace themselves (a merged trace
  /// across MPI ranks: bus/mpi/trace.hpp).
  nlohmann::json trace_actors() const;
  /// Labels an actor's lane in the trace with its pipeline stage and group.
  void annotate(actor_id id, int stage, std::string group);

  /// True when the calling thread runs one of this runtime's loops.
  bool on_loop_thread() const noexcept {
    return detail::current_loop != nullptr && detail::current_loop->rt == this;
  }

  // ---- for actors and transports (any thread) ----
  /// Counts work that is in flight outside any mailbox (a GPU completion, a timer) so
  /// `synchronize` waits for it. Every `begin_work` must be matched by one `end_work`.
  void begin_work() noexcept;
  void end_work() noexcept;

 private:
  friend class actor;
  friend void detail::destroy_cell(detail::actor_cell*) noexcept;
  struct actor_info {
    std::string name;
    unsigned loop = 0;
  };
  struct actor_annotation {  // annotate(): few actors have one
    int stage = -1;
    std::string group;
  };

  void check_spawn(const spawn_options& opts) const;
  /// Registers and starts a constructed actor; `arena_bytes`: its size in arena_ (0: from new).
  address start(actor* a, std::size_t arena_bytes, const spawn_options& opts);
  void report_failure(actor& who, std::exception_ptr error);
  void forget(actor_id id);
  void unlink(detail::actor_cell* c) noexcept;
  void destroy_actors() noexcept;
  void notify_progress();
  void notify_progress_fenced();  // notify_progress after the caller's own full fence
  bool quiescent() const noexcept;
  /// Sends every live actor a stop (urgent lane). Returns what kept a stop from being sent
  /// (std::bad_alloc), null when every actor got one.
  std::exception_ptr stop_all() noexcept;
  [[noreturn]] void throw_send_error(send_status s, const address& to) const;
  void check_not_loop_thread(const char* what) const;
  boost::asio::io_context& timer_context();

  friend void detail::destroy_actor(actor*) noexcept;
  // First, so it is destroyed last. Left allocated (leaked) by a runtime whose shutdown
  // failed: its actors are not destroyed then, and their memory must stay valid.
  std::unique_ptr<detail::actor_arena> arena_ = std::make_unique<detail::actor_arena>();
  runtime_options opts_;
  std::vector<std::unique_ptr<detail::loop_state>> loops_;
  std::vector<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> guards_;

  // The registry: one lock, taken once per spawn, per stop and per actor deleted. Segmented
  // arrays, so the 100,000th spawn appends as cheaply as the first (no reallocation).
  mutable std::mutex table_mu_;
  detail::segmented_vector<address> live_;     // index id-1; emptied when an actor stops
  detail::segmented_vector<actor_info> info_;  // index id-1; kept for the trace
  std::unordered_map<actor_id, actor_annotation> annotations_;
  std::vector<std::size_t> loop_actors_;       // live actors per loop (placement::least_actors)
  unsigned next_loop_ = 0;                     // placement::round_robin
  detail::actor_cell* cells_ = nullptr;        // every actor spawned here and not yet destroyed

  // Migration: incremented by every move (actor::decide_move); a window counted under an
  // older value is stale. Read once per window per mobile actor, written once per move.
  alignas(64) std::atomic<std::uint32_t> migration_epoch_{0};
  /// The clock of migration's sampled drain timing (steady clock, ns).
  static std::int64_t migration_clock() noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }

  alignas(64) std::atomic<std::uint64_t> external_sent_{0};
  std::atomic<std::uint64_t> external_done_{0};  // begin_work/end_work from outside loops
  std::atomic<int> sync_waiters_{0};
  mutable std::mutex sync_mu_;
  std::condition_variable sync_cv_;

  mutable std::mutex error_mu_;
  std::exception_ptr error_;
  std::function<void(std::exception_ptr)> on_failure_;
  std::atomic<bool> failed_{false};
  bool shut_down_ = false;

  std::once_flag timer_once_;
  std::unique_ptr<boost::asio::io_context> timer_io_;  // timeouts of requests from outside
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> timer_guard_;
  std::thread timer_thread_;

  recorder recorder_;
};

/// The actor whose handler runs on the calling thread; 0 outside every handler (user
/// code, a closure posted straight to a loop's io_context, a GPU completion handler).
/// For code below the actors that records who did something (gpu/ tracing).
inline actor_id current_actor() noexcept { return detail::current_loop ? detail::current_loop->running : 0; }

// ---- templates ------------------------------------------------------------------

namespace detail {
template <class R>
struct promise_sink final : reply_sink_base {
  struct state {
    std::promise<R> promise;
    std::atomic<bool> done{false};
  };
  /// `any_reply`: the requester only waits for the handler to run, whatever it returns.
  explicit promise_sink(std::shared_ptr<state> s, bool any_reply = false)
      : reply_sink_base(any_reply ? nullptr : tag_of<R>()), s_(std::move(s)) {}
  void deliver(void* v) override {
    if (s_->done.exchange(true)) return;
    if constexpr (std::is_void_v<R>) s_->promise.set_value();
    else s_->promise.set_value(std::move(*static_cast<R*>(v)));
  }
  void fail(std::exception_ptr e) override {
    if (!s_->done.exchange(true)) s_->promise.set_exception(std::move(e));
  }
  std::shared_ptr<state> s_;
};
}  // namespace detail

template <class R, class T>
std::future<R> runtime::ask(const address& to, T msg, std::chrono::nanoseconds timeout, bool any_reply) {
  using sink = detail::promise_sink<R>;
  auto st = std::make_shared<typename sink::state>();
  auto fut = st->promise.get_future();
  auto e = make_envelope(std::move(msg), 0, lane::normal);
  e->bytes = payload_bytes_of(static_cast<typed_envelope<T>&>(*e).value);
  e->reply = std::make_unique<sink>(st, any_reply);
  auto s = to.get()->enqueue(e);
  if (s != send_status::ok) {
    try {
      throw_send_error(s, to);
    } catch (...) {
      sink(st).fail(std::current_exception());
    }
    return fut;
  }
  if (timeout != std::chrono::nanoseconds::max()) {
    // Not on the receiver's loop: a busy handler there must not hold back its own timeout.
    auto timer = std::make_shared<boost::asio::steady_timer>(timer_context(), timeout);
    timer->async_wait([st, timer, name = std::string(to.name())](const boost::system::error_code& ec) {
      if (ec) return;
      if (!st->done.exchange(true))
        st->promise.set_exception(std::make_exception_ptr(request_timeout("request to '" + name + "' timed out")));
    });
  }
  return fut;
}

template <class T>
void runtime::send_wait(const address& to, T msg) {
  check_not_loop_thread("send_wait");
  for (;;) {
    auto s = to.get()->try_tell(std::move(msg), lane::normal, 0);
    if (s == send_status::ok) return;
    if (s == send_status::closed) throw_send_error(s, to);
    std::promise<void> room;
    auto f = room.get_future();
    to.get()->add_space_waiter({address{}, [&room] { room.set_value(); }});
    f.wait();
  }
}

}  // namespace nerve::actors

// One file: the actor's hot path. A drain pops, dispatches and records each run
// (`record_run` is forced inline into `drain_runs`), and its sends enqueue and wake
// (`enqueue`, `schedule`): splitting them would put calls where the drain now has none.
// What a drain calls out of line, the migration decision, is in actors/actor_migration.cpp.
#include "actors/actor.hpp"

#include <algorithm>
#include <thread>

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include "actors/runtime.hpp"

namespace nerve::actors {

namespace detail {
actor_cell* cell_of(actor* a) noexcept { return a->cell_; }
void destroy_cell(actor_cell* c) noexcept {
  if (actor* a = c->self.exchange(nullptr, std::memory_order_acq_rel)) {
    if (runtime* rt = c->owner.load(std::memory_order_acquire)) rt->unlink(c);
    destroy_actor(a);
  }
  delete c;
}
void release(actor_cell* c) noexcept {
  if (c->refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  // The last address. A scheduled actor (queued in its loop's ready queue, or draining) is
  // left to its drain, which destroys it when it goes idle (actor::drain): a wake-up holds
  // no reference of its own, which saved two read-modify-writes of this count per wake-up,
  // one of them on the sender's side of every hop between loops. Nothing makes an address
  // from a count of 0 (self() runs in handlers, which run while the runtime's own address
  // is held), except the runtime's teardown after its loops are joined.
  if (actor* a = c->self.load(std::memory_order_acquire); a && !a->doom()) return;
  destroy_cell(c);
}
void destroy_actor(actor* a) noexcept {
  if (a->arena_bytes_ == 0) {
    delete a;
    return;
  }
  auto& arena = *a->rt_->arena_;
  const std::size_t bytes = a->arena_bytes_;
  a->~actor();
  arena.deallocate(a, bytes);
}
}  // namespace detail

actor_id address::id() const noexcept {
  auto* a = get();
  return a ? a->id() : 0;
}
std::string_view address::name() const noexcept {
  auto* a = get();
  return a ? std::string_view(a->name()) : std::string_view{};
}
unsigned address::loop() const noexcept {
  auto* a = get();
  return a ? a->loop_index() : 0;
}
bool address::stopped() const noexcept {
  auto* a = get();
  return !a || a->stopped();
}

struct actor::pending_request {
  std::function<void(std::shared_ptr<void>, std::exception_ptr)> cb;
  std::unique_ptr<boost::asio::steady_timer> timer;
};

actor::actor(std::string name) : cell_(new detail::actor_cell), name_(std::move(name)) {
  cell_->self.store(this, std::memory_order_relaxed);
  detail::mpsc_init(normal_in_, normal_out_, normal_stub_);
  detail::mpsc_init(urgent_in_, urgent_out_, urgent_stub_);
  ready_link_.owner = this;
  ready_link_.run = [](void* owner) noexcept {
    static_cast<actor*>(owner)->drain();  // may destroy the actor (doomed)
  };
}

actor::~actor() {
  // Deleted directly (a constructor threw, or spawn failed before any address existed):
  // nobody detached the cell, so it goes with the actor.
  if (cell_->self.load(std::memory_order_acquire) == this) delete cell_;
  // Whatever is still queued (the runtime was destroyed before the actor drained) is freed here.
  while (auto* raw = pop()) {
    std::unique_ptr<envelope> e(raw);
    if (e->reply) e->reply->fail(std::make_exception_ptr(send_error(send_status::closed, "actor '" + name_ + "' was destroyed")));
  }
}

unsigned actor::loop_index() const noexcept {
  auto* l = home();
  return l ? l->index : 0;
}

boost::asio::any_io_executor actor::executor() const {
  pinned_.store(true, std::memory_order_relaxed);  // what runs there expects this actor there
  return home()->io.get_executor();
}

// ---- mailbox (any thread) -----------------------------------------------------------

send_status actor::enqueue(std::unique_ptr<envelope>& e) {
  const auto r = reserve(e->where);
  if (r.status != send_status::ok) return r.status;
  // A stop racing with this send is fine: the drain drops what arrives after the close.
  // Counted as sent before it becomes visible, so synchronize() never sees it handled first.
  auto* here = detail::current_loop;
  if (here && here->rt == rt_) {
    here->count_sent();
    e->src_loop = here->running_heavy ? envelope::heavy_sender : static_cast<std::uint16_t>(here->index);
  } else {
    rt_->external_sent_.fetch_add(1, std::memory_order_acq_rel);
  }

  // Recording, the send costs a few stores into the envelope (and a clock read, unless the
  // sending handler's start stands in for it: recorder.hpp): the send becomes part of the
  // one record written when the message is handled (or dropped). The reservation count,
  // not the depth: the depth needs the drain's count, on the drain's cache line, and the
  // export works it out from the two counts (recorder.hpp).
  if (rt_->recorder_.enabled() && e->tag->traced) [[unlikely]] {
    if (here && here->clock.stamps) {  // stamps only while mark is set
      e->sent_ticks = here->clock.mark;
      e->sent_run = static_cast<std::uint8_t>(here->clock.shared);
    } else {
      e->sent_ticks = recorder::ticks();
      e->sent_run = 0;
    }
    e->sent_reserved = r.normal;
    e->sent_counted = true;
  }
  // The reservation came first, so the drain never takes a message its counts do not
  // know of: what it took never passes what was reserved. A drain that finds a
  // reservation whose push is not done yet goes round again (try_idle).
  auto* raw = e.release();
  detail::mpsc_push(raw->where == lane::urgent ? urgent_in_ : normal_in_, raw);
  if (r.wake) schedule();
  return send_status::ok;
}

actor::reservation actor::reserve(lane where) noexcept {
  if (closed_.load(std::memory_order_acquire)) return {send_status::closed, false, 0};
  auto w = state_.load(std::memory_order_relaxed);
  for (;;) {
    std::uint64_t next;
    if (where == lane::normal) {
      // Compare-and-swap, not add-then-undo: a refused send never shows as queued, so
      // queued() never reads more than the capacity (as back-pressure promises). A stale
      // `w` can make the difference negative; its compare-and-swap then fails and retries.
      if (!has_room(w)) return {send_status::full, false, 0};
      next = (w + normal_one) | scheduled_bit;
    } else {
      next = (w & ~urgent_mask) | ((w + urgent_one) & urgent_mask) | scheduled_bit;
    }
    if (state_.compare_exchange_weak(w, next, std::memory_order_acq_rel, std::memory_order_relaxed))
      return {send_status::ok, (w & scheduled_bit) == 0, normal_of(next)};
  }
}

void actor::schedule() {
  // Once per wake-up (the scheduled bit went 0 -> 1, or a drain left work behind): the actor
  // is in its loop's ready queue at most once. The scheduled bit keeps it alive until it has
  // run: release() leaves a scheduled actor to its drain (doom).
  home()->schedule(&ready_link_);
}

envelope* actor::pop() noexcept {
  if (auto* n = detail::mpsc_pop(urgent_in_, urgent_out_, urgent_stub_)) {
    ++urgent_taken_;
    return static_cast<envelope*>(n);
  }
  if (auto* n = detail::mpsc_pop(normal_in_, normal_out_, normal_stub_)) {
    // Room frees as each message is taken (a handler may send to its own full mailbox).
    // Senders waiting for room are told once per drain, after a fence (drain()).
    normal_released_.store(++normal_taken_, std::memory_order_release);
    return static_cast<envelope*>(n);
  }
  return nullptr;
}

actor::idle_result actor::try_idle() noexcept {
  auto w = state_.load(std::memory_order_acquire);
  for (;;) {
    if (normal_of(w) != normal_taken_ || urgent_of(w) != (urgent_taken_ & (urgent_mask >> 1)))
      return idle_result::busy;  // reserved and not taken: queued, or a push half done
    if (state_.compare_exchange_weak(w, w & ~scheduled_bit, std::memory_order_acq_rel, std::memory_order_acquire))
      return (w & doomed_bit) != 0 ? idle_result::doomed : idle_result::idle;  // idle: the next reservation schedules it
  }
}

bool actor::doom() noexcept {
  auto w = state_.load(std::memory_order_acquire);
  for (;;) {
    // Not scheduled: nobody can schedule it any more (a sender holds an address), so the
    // caller destroys it. Scheduled: its drain will, when it clears the bit (try_idle).
    if ((w & scheduled_bit) == 0) return true;
    if (state_.compare_exchange_weak(w, w | doomed_bit, std::memory_order_acq_rel, std::memory_order_acquire))
      return false;
  }
}

struct actor::waiters_guard {
  explicit waiters_guard(actor& a) noexcept : a_(a) {
    while (a_.waiters_lock_.exchange(true, std::memory_order_acquire))
      while (a_.waiters_lock_.load(std::memory_order_relaxed)) std::this_thread::yield();
  }
  ~waiters_guard() { a_.waiters_lock_.store(false, std::memory_order_release); }
  actor& a_;
};

void actor::add_space_waiter(space_waiter w) {
  {
    waiters_guard lk(*this);
    waiters_.push_back(std::move(w));
    has_space_waiters_.store(true, std::memory_order_seq_cst);
  }
  // The consumer may have made room between the sender's failed try and the registration.
  // The fence pairs with the drain's: either the drain sees the flag or this sees the room.
  detail::full_fence();
  if (queued() < capacity_ || closed_.load(std::memory_order_acquire)) fire_space_waiters();
}

void actor::fire_space_waiters() {
  std::vector<space_waiter> ws;
  {
    waiters_guard lk(*this);
    ws.swap(waiters_);
    has_space_waiters_.store(false, std::memory_order_seq_cst);
  }
  for (auto& w : ws) {
    if (!w.waiter) {
      w.fn();  // a thread outside the runtime: wakes it
    } else if (w.waiter.get()->try_tell(closure{std::move(w.fn)}, lane::urgent) != send_status::ok) {
      // The waiting actor stopped meanwhile: nothing to run.
    }
    // The closure, if sent, counts as sent by now: the wake-up it stood for is done.
    if (w.owed) w.owed->end_work();
  }
}

// ---- loop side ------------------------------------------------------------------------

[[gnu::always_inline]] inline void actor::invoke(envelope& e) {
  if (e.sent_ticks != 0) [[unlikely]] {
    const auto mode = rt_->recorder_.mode();
    if ((mode & recorder::mode_on) != 0) {
      invoke_recorded(e, mode);
      return;
    }
  }
  invoke_plain(e);
}

// Two copies of the drain, picked once per drain. Recording, a run's bookkeeping is inlined
// in the loop: as a call of its own it would save and restore six registers a message
// (docs/performance.md has what that cost). Not recording, the loop carries no recording
// code (a message sent while recording was on still goes out of line, through invoke).
void actor::drain() {
  if (rt_->recorder_.enabled()) [[unlikely]]
    drain_runs<true>();
  else
    drain_runs<false>();
}

template <bool Recording>
void actor::drain_runs() {
  auto* loop = home();
  auto* saved = detail::current_loop;
  detail::current_loop = loop;
  const auto saved_running = loop->running;
  loop->running = id_;
  std::int64_t taken = 0;
  // Recording: the loop's clock is idle (mark 0) between drains, and this drain times its
  // runs afresh; a drain nested in a recording handler keeps the outer one's clock (and
  // with it the outer run's send stamp) aside; the count of runs to time one by one
  // carries on. Off, one load per drain.
  detail::loop_state::run_clock outer_clock;
  const bool nested_in_recording = loop->clock.mark != 0;
  if (nested_in_recording) [[unlikely]] {
    outer_clock = loop->clock;
    loop->clock.mark = 0;
    loop->clock.shared = 0;
    loop->clock.stamps = false;
  }
  // Migration (placement::automatic): an actor the runtime may move votes, message by
  // message, for the loop its senders ran, and times one drain in 16 (sampled: two clock
  // reads per 16 drains; a heavy actor every drain, so that its window's fastest run is not
  // one sample that the host happened to slow); the decision waits for the end of a drain
  // (consider_move). A pinned actor pays one predictable branch per message.
  // A mobile drain is never nested (saved_running == 0), so the loop's heavy flag is false
  // outside mobile drains and needs no saving: a pinned actor's drain leaves it alone.
  const bool mobile = !pinned_.load(std::memory_order_relaxed) && saved_running == 0;
  std::int64_t timed_from = 0;
  std::uint64_t sent_before = 0;
  if (mobile) {
    loop->running_heavy = heavy_;  // what a heavy (or not yet timed) mobile actor sends pulls nobody
    if (timed_countdown_-- == 0) [[unlikely]] {
      timed_countdown_ = heavy_ ? 0 : 15;  // a heavy actor's every drain: two clock reads are nothing beside its runs
      timed_from = rt_->migration_clock();
      sent_before = loop->sent.load(std::memory_order_relaxed);
    }
  }
  if (!started_) [[unlikely]] {
    // The start is reserved (urgent) and counted as sent by runtime::start like a message,
    // but carries no envelope: one allocation and one queue push less per spawn.
    started_ = true;
    ++taken;
    ++urgent_taken_;
    run_start();
    loop->count_handled();
  }
  while (taken < static_cast<std::int64_t>(batch_)) {
    envelope* raw = pop();
    if (!raw) break;  // empty, or a push half done: the pending count tells below
    ++taken;
    if (mobile) {  // Boyer-Moore majority vote: a lead of half the window means 3/4 of it
      const auto src = raw->src_loop;
      if (src == vote_loop_) {
        ++votes_;
      } else if (votes_ == 0) {
        vote_loop_ = src;
        votes_ = 1;
      } else {
        --votes_;
      }
    }
    std::unique_ptr<envelope> e(raw);
    if (stop_done_ && closed_.load(std::memory_order_relaxed)) {  // the drain's own flag first: no read of the senders' line
      drop(*e, "closed");
    } else {
      if constexpr (Recording) {
        // As invoke(), with the likely case the other way round: recording may have
        // stopped since the drain began, or the message was sent before it started.
        const auto mode = rt_->recorder_.mode();
        if (e->sent_ticks != 0 && (mode & recorder::mode_on) != 0) [[likely]]
          record_run(*e, mode);
        else
          invoke_plain(*e);
      } else {
        invoke(*e);
      }
      if (stop_requested_ && !stop_done_) close_and_stop();
    }
    e.reset();  // the payload dies before the message counts as handled
    loop->count_handled();
  }
  if (loop->clock.mark != 0) [[unlikely]] stop_clock();
  if (nested_in_recording) [[unlikely]] {
    // The outer clock back; what this drain learnt about its runs stays.
    const auto inner = loop->clock;
    loop->clock = outer_clock;
    loop->clock.exact = inner.exact;
    loop->clock.short_run = inner.short_run;
    loop->clock.batch_ticks = inner.batch_ticks;
    loop->clock.batch_runs = inner.batch_runs;
  }
  // One fence per drain, not per message: senders waiting for room (add_space_waiter's
  // fence pairs with it) and synchronize() waiting for progress learn of this drain.
  detail::full_fence();
  if (has_space_waiters_.load(std::memory_order_relaxed)) fire_space_waiters();
  loop->running = saved_running;
  detail::current_loop = saved;
  rt_->notify_progress_fenced();
  if (mobile) {
    loop->running_heavy = false;
    // Still holding the scheduled bit: nobody else schedules this actor, so it may change
    // loops here, and its next drain runs there (its mailbox, and with it every sender's
    // order, moves whole). Inline only the count: a drain that is neither timed nor ends
    // a window costs an add and a compare.
    window_msgs_ += static_cast<std::uint32_t>(taken);
    if ((timed_from != 0) | (window_msgs_ >= window_target_)) [[unlikely]]
      if (consider_move(loop, timed_from, sent_before, static_cast<std::uint32_t>(taken))) return;
  }
  if (taken >= static_cast<std::int64_t>(batch_)) {
    schedule();  // more queued (or arriving): another turn, after the other actors'
    return;
  }
  switch (try_idle()) {
    case idle_result::busy: schedule(); break;
    case idle_result::idle: break;
    case idle_result::doomed: detail::destroy_cell(cell_); break;  // the last thing: `this` is gone
  }
}

bool actor::awaiting_answers() const noexcept { return requests_ && !requests_->empty(); }

void actor::run_start() {
  // Handled as the message it stands for (an urgent closure from the actor to itself),
  // so a throwing on_start fails the actor and a recorded run shows it as before.
  typed_envelope<closure> start(closure{[this] { on_start(); }});  // fits std::function's buffer: no allocation
  start.tag = tag_of<closure>();
  start.sender = id_;
  start.where = lane::urgent;
  start.bytes = sizeof(closure);
  start.sent_ticks = start_ticks_;
  invoke(start);
  if (stop_requested_ && !stop_done_) close_and_stop();
}

[[gnu::always_inline]] inline std::exception_ptr actor::run_handler(envelope& e) {
  current_ = &e;
  try {
    dispatch(e);
  } catch (...) {
    auto err = std::current_exception();
    if (e.reply) std::exchange(e.reply, nullptr)->fail(err);
    current_ = nullptr;
    return err;
  }
  current_ = nullptr;
  if (e.reply) [[unlikely]]
    fail_unanswered(e);
  return nullptr;
}

void actor::fail_unanswered(envelope& e) {
  std::exchange(e.reply, nullptr)->fail(std::make_exception_ptr(
      wiring_error("actor '" + name_ + "' did not answer request '" + std::string(e.tag->name) + "'")));
}

void actor::invoke_plain(envelope& e) {
  // A run not recorded (its message was sent before recording began) in a recording
  // drain: the group ends here, and the next recorded run reads the clock afresh.
  if (home()->clock.mark != 0) [[unlikely]] stop_clock();
  if (auto err = run_handler(e)) [[unlikely]]
    fail(err);
}

// Recording, a run is timed on its own (a clock read at its end) or shares the clock reads
// of a group of short runs (recorder.hpp): within one drain a run starts where the previous
// one ended (the gap is the runtime's pop, a few nanoseconds, which is busy time either
// way), and never across drains, where the gap is the loop's idle time.
// Sends from a run are stamped with its start (a group's start and its place, for a shared
// run), read off the loop's clock (enqueue), unless its message type's last timed run was
// long (then each send reads the clock). Between runs, the runtime's own sends (a stop's
// or a failure's notices) take the clock as it stands: the last run's end, or the place
// after a group's last run; a nested drain keeps its outer one's aside (drain).
void actor::invoke_recorded(envelope& e, std::uint8_t mode) { record_run(e, mode); }

[[gnu::always_inline]] inline void actor::record_run(envelope& e, std::uint8_t mode) {
  auto& clock = home()->clock;
  const bool long_type = e.tag->long_runs.load(std::memory_order_relaxed);
  if (clock.mark == 0) {
    clock.mark = recorder::ticks();
    clock.cursor = rt_->recorder_.cursor();
  }
  clock.stamps = !long_type;
  if (!long_type && clock.exact == 0 && (mode & recorder::mode_exact) == 0) [[likely]] {
    // A shared run: its slot is a copy of the envelope's fields (detail::message_image),
    // timed by the group record that follows.
    if (auto err = run_handler(e)) [[unlikely]] {
      record_failure(e, err);
      return;
    }
    rt_->recorder_.write_image(clock.cursor, e, id_, normal_taken_);
    clock.last_tag = e.tag;
    clock.taken = normal_taken_;
    if (++clock.shared == shared_group_runs) close_group(recorder::ticks());
    return;
  }
  invoke_timed(e, long_type);
}

void actor::invoke_timed(envelope& e, bool long_type) {
  auto& rec = rt_->recorder_;
  auto& clock = home()->clock;
  // Which normal message this is, counted by the drain (the recorder's depth; -1: urgent).
  const std::int64_t taken = e.where == lane::normal ? std::int64_t{normal_taken_} : -1;
  if (clock.shared != 0) close_group(recorder::ticks());  // the group ends where this run starts
  const std::int64_t start = std::max(clock.mark, e.sent_ticks);  // never before its own send
  clock.mark = start;
  if (auto err = run_handler(e)) [[unlikely]] {
    record_failure(e, err);
    return;
  }
  // Straight from the envelope into the drain's next slot; the slow ways (a new chunk, a
  // record that does not pack) out of line (recorder::slot).
  const auto end = recorder::ticks();
  clock.mark = end;
  if (clock.exact != 0) {
    // Timed one by one after a group that took long: the short ones measure what a short
    // run takes here, which the next groups are judged by (close_group).
    if (!long_type && end - start < rec.long_run()) {
      clock.batch_ticks += end - start;
      ++clock.batch_runs;
    }
    if (--clock.exact == 0 && clock.batch_runs != 0) clock.short_run = clock.batch_ticks / clock.batch_runs;
  }
  // The type's last run decides for its next (a flag written only when it changes: a tag
  // is shared by every loop).
  if ((end - start >= rec.long_run()) != long_type) [[unlikely]]
    e.tag->long_runs.store(!long_type, std::memory_order_relaxed);
  detail::packed_message* p = nullptr;
  if (detail::fits(end - start, start - e.sent_ticks, e.bytes, e.micro_batch, home()->index) &&
      (p = recorder::slot(clock.cursor))) [[likely]]
    detail::pack_timed(*p, e.sent_ticks, start, end,
                       {e.tag, e.sender, id_, e.bytes, e.micro_batch,
                        e.sent_counted ? std::int64_t{e.sent_reserved} : -1, taken, home()->index, e.sent_run});
  else
    record_slow(e, taken, start, end);
}

void actor::record_failure(const envelope& e, std::exception_ptr err) {
  // The failed run, recorded as its send and a failure at its end; any open group ends there.
  auto& clock = home()->clock;
  const auto now = recorder::ticks();
  if (clock.shared != 0) close_group(now);
  clock.mark = now;
  record_send(e);
  record r;
  r.kind = record_kind::failure;
  r.ts_ns = now;
  r.tag = e.tag;
  r.track = id_;
  rt_->recorder_.write_ticks(r);
  fail(err);
}

void actor::record_slow(const envelope& e, std::int64_t taken, std::int64_t start, std::int64_t end) noexcept {
  message_record m;
  m.sent = e.sent_ticks;
  m.start = start;
  m.end = end;
  m.tag = e.tag;
  m.bytes = e.bytes;
  m.mb = e.micro_batch;
  m.sender = e.sender;
  m.receiver = id_;
  m.reserved = e.sent_counted ? std::int64_t{e.sent_reserved} : -1;
  m.taken = taken;
  m.loop = home()->index;
  m.sent_run = e.sent_run;
  rt_->recorder_.write_slow(m);
}

void actor::stop_clock() noexcept {
  auto& clock = home()->clock;
  if (clock.shared != 0) close_group(recorder::ticks());
  clock.mark = 0;
  clock.stamps = false;  // sends read the clock again
}

void actor::close_group(std::int64_t now) noexcept {
  // Only with a group open (every caller checks `shared`): a grouped run of this drain,
  // on this thread, set the cursor.
  auto& clock = home()->clock;
  rt_->recorder_.write_group(clock.cursor, id_, clock.shared, {home()->index, clock.mark, now, clock.taken});
  // One of the runs may have been long when the span is, less what a short run takes here
  // for each of the others: with one run, that is its type's flag; with more, the loop
  // times its next runs one by one, and those set their types' flags (and measure the
  // short runs afresh). Without the allowance, a loop whose short runs are slow (every hop
  // across cores: about 140 ns a run, 8 of them above the threshold) timed one run in
  // five alone, each with a clock read.
  // The allowance shrinks by 1/64 a group, so one measured when runs were slower (the
  // host, or the loop's work, changed) cannot hide a long run for good: within about a
  // hundred groups a group with a long run counts as long again and the short runs are
  // measured afresh.
  const auto others = static_cast<std::int64_t>(clock.shared - 1) * clock.short_run;
  clock.short_run -= clock.short_run >> 6;
  if (now - clock.mark - others >= rt_->recorder_.long_run()) {
    if (clock.shared == 1) {
      clock.last_tag->long_runs.store(true, std::memory_order_relaxed);
    } else {
      clock.exact = shared_group_runs;
      clock.batch_ticks = 0;
      clock.batch_runs = 0;
    }
  }
  clock.mark = now;
  clock.shared = 0;
}

void actor::record_send(const envelope& e) noexcept {
  // A recorded message that is never handled (dropped, or its handler threw): its send
  // alone, as a record of its own.
  record r;
  r.kind = record_kind::send;
  r.ts_ns = e.sent_ticks;
  r.flow = rt_->recorder_.next_flow();
  r.bytes = e.bytes;
  r.mb = e.micro_batch;
  r.tag = e.tag;
  r.track = e.sender;
  r.peer = id_;
  r.depth = -1;  // a message never handled has no place in the drain's count
  rt_->recorder_.write_ticks(r);
}

void actor::dispatch(envelope& e) {
  if (e.tag == tag_of<closure>()) {
    static_cast<typed_envelope<closure>&>(e).value.fn();
    return;
  }
  if (e.tag == tag_of<response>()) {
    handle_response(static_cast<typed_envelope<response>&>(e).value);
    return;
  }
  for (auto& h : handlers_) {
    if (h.tag == e.tag) {
      h.fn(e);
      return;
    }
  }
  if (e.tag == tag_of<failure>()) {  // no supervision strategy of its own: escalate
    auto& f = static_cast<typed_envelope<failure>&>(e).value;
    std::rethrow_exception(f.error);
  }
  throw wiring_error("actor '" + name_ + "' has no handler for message '" + std::string(e.tag->name) + "'");
}

void actor::handle_response(response& r) {
  if (!requests_) return;
  auto it = requests_->find(r.id);
  if (it == requests_->end()) return;  // timed out already: the late answer is dropped
  auto p = std::move(it->second);
  requests_->erase(it);
  if (p.timer) p.timer->cancel();
  p.cb(std::move(r.value), std::move(r.error));
}

void actor::drop(envelope& e, const char* reason) noexcept {
  if (e.reply)
    std::exchange(e.reply, nullptr)->fail(std::make_exception_ptr(
        send_error(send_status::closed, "actor '" + name_ + "' stopped before handling '" + std::string(e.tag->name) + "'")));
  auto& rec = rt_->recorder_;
  if (rec.enabled()) {
    if (e.sent_ticks != 0) record_send(e);
    record r;
    r.kind = record_kind::drop;
    r.ts_ns = recorder::ticks();
    r.tag = e.tag;
    r.track = e.sender;
    r.peer = id_;
    r.text = reason;
    rec.write_ticks(r);
  }
}

void actor::stop() { stop_requested_ = true; }

void actor::fail(std::exception_ptr error) {
  if (stop_done_) return;
  std::exception_ptr wrapped;
  try {
    std::rethrow_exception(error);
  } catch (const actor_failure&) {
    wrapped = error;  // already names the actor that failed first
  } catch (const std::exception& ex) {
    wrapped = std::make_exception_ptr(actor_failure("actor '" + name_ + "' failed: " + ex.what()));
  } catch (...) {
    wrapped = std::make_exception_ptr(actor_failure("actor '" + name_ + "' failed with a non-standard exception"));
  }
  close_and_stop();
  if (supervisor_ && supervisor_.get()->try_tell(failure{id_, name_, wrapped}, lane::urgent) == send_status::ok) return;
  rt_->report_failure(*this, wrapped);
}

void actor::close_and_stop() {
  if (stop_done_) return;
  stop_done_ = true;
  if (load_ns_ != 0) {  // runs on its loop: no move in between
    home()->heavy_ns.fetch_sub(load_ns_, std::memory_order_relaxed);
    load_ns_ = 0;
  }
  closed_.store(true, std::memory_order_release);
  // Pending requests of ours will never be answered here: cancel their timers.
  if (requests_) {
    for (auto& [id, p] : *requests_)
      if (p.timer) p.timer->cancel();
    requests_->clear();
  }
  try {
    on_stop();
  } catch (...) {
    // on_stop must not throw; a failure here has nowhere better to go than the runtime.
    rt_->report_failure(*this, std::current_exception());
  }
  fire_space_waiters();  // senders waiting for room learn that we are closed
  rt_->forget(id_);
}

void actor::send_envelope(const address& to, std::unique_ptr<envelope> e) {
  if (!to) throw wiring_error("actor '" + name_ + "' sent '" + std::string(e->tag->name) + "' to an empty address");
  auto s = to.get()->enqueue(e);
  if (s != send_status::ok) throw_send_error(s, to, e->tag->name);
}

void actor::throw_send_error(send_status s, const address& to, std::string_view kind) const {
  if (s == send_status::closed)
    throw send_error(s, "actor '" + name_ + "' sent '" + std::string(kind) + "' to stopped actor '" + std::string(to.name()) + "'");
  throw send_error(s, "actor '" + name_ + "' sent '" + std::string(kind) + "' to actor '" + std::string(to.name()) +
                          "' whose mailbox is full (capacity " + std::to_string(to.get()->capacity()) + ")");
}

void actor::check_reply_type(const type_tag* expected, const type_tag* given) const {
  if (expected != nullptr && expected != given)  // null: the requester takes any answer
    throw wiring_error("actor '" + name_ + "' answers a request with '" + std::string(given->name) +
                       "' but the requester waits for '" + std::string(expected->name) + "'");
}

void actor::when_writable(const address& to, std::function<void()> f) {
  rt_->begin_work();
  try {
    to.get()->add_space_waiter({self(), std::move(f), rt_});
  } catch (...) {
    rt_->end_work();
    throw;
  }
}

void actor::post(std::function<void()> f) {
  if (try_tell(closure{std::move(f)}, lane::urgent, id_) != send_status::ok)
    throw send_error(send_status::closed, "post to stopped actor '" + name_ + "'");
}

void actor::begin_request(const address& to, std::unique_ptr<envelope> e, std::uint64_t id,
                          std::chrono::nanoseconds timeout,
                          std::function<void(std::shared_ptr<void>, std::exception_ptr)> cb) {
  if (!requests_) requests_ = std::make_unique<std::unordered_map<std::uint64_t, pending_request>>();
  pending_request p{std::move(cb), nullptr};
  if (timeout != std::chrono::nanoseconds::max()) {
    p.timer = std::make_unique<boost::asio::steady_timer>(home()->io, timeout);
    p.timer->async_wait([self = self(), id, to_name = std::string(to.name())](const boost::system::error_code& ec) {
      if (ec) return;
      // Runs on our loop, between handlers: deliver the timeout through the mailbox so it
      // is handled in order and in context.
      (void)self.get()->try_tell(response{id, nullptr, std::make_exception_ptr(request_timeout(
                                              "request to '" + to_name + "' timed out"))},
                                 lane::urgent);
    });
  }
  requests_->emplace(id, std::move(p));
  send_envelope(to, std::move(e));
}

}  // namespace nerve::actors

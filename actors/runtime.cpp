#include "actors/runtime.hpp"

#include <algorithm>
#include <array>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

namespace nerve::actors {

namespace {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/// Runs a loop thread until its io_context is stopped: ready actors first (a bounded
/// batch, so timers and posted closures get their turn), then the io_context's ready
/// handlers. When both are empty the thread spins for a while on the ready queue (a
/// lock-free read) before it blocks: scheduling an actor on a blocked loop costs the
/// sender a post and a futex wake (a system call, microseconds on a shared VM) and the
/// receiver a trip through the OS scheduler; on a spinning loop it costs neither. The
/// spin is bounded, so an idle loop still sleeps within about a hundred microseconds.
void run_loop(detail::loop_state& l) {
  constexpr std::size_t drains_per_turn = 64;
  constexpr int spin_rounds = 2048;   // checks of the ready queue before blocking
  constexpr int yield_after = 1024;   // then give the core away between checks (oversubscribed hosts)
  constexpr int io_poll_every = 64;   // spinning also polls the io_context now and then
  // io_context::poll() and stopped() each take the io_context's mutex: a busy loop polls it
  // every few turns only (timers and posted closures wait at most that many turns).
  constexpr unsigned busy_turns_per_poll = 8;
  auto& io = l.io;
  unsigned busy_turns = 0;
  for (;;) {
    std::size_t ran = l.run_ready(drains_per_turn);  // clears l.idle when it runs something
    if (ran != 0 && ++busy_turns % busy_turns_per_poll != 0) continue;
    ran += io.poll();
    if (io.stopped()) return;
    if (ran) continue;
    if (!l.idle_seen) {  // nothing to run: idle until run_ready finds work (stored on changes only)
      l.idle_seen = true;
      l.idle.store(true, std::memory_order_relaxed);
    }
    bool work = false;
    for (int i = 1; i <= spin_rounds && !work; ++i) {
      if (i < yield_after) cpu_relax();
      else std::this_thread::yield();
      work = !l.ready.empty();
      if (!work && i % io_poll_every == 0) {
        work = io.poll() != 0;
        if (io.stopped()) return;
      }
    }
    if (work) continue;
    l.sleeping.store(true, std::memory_order_relaxed);
    detail::full_fence();  // pairs with the fence in loop_state::schedule
    if (!l.ready.empty()) {
      l.sleeping.store(false, std::memory_order_relaxed);
      continue;
    }
    auto n = io.run_one();  // blocks until a handler (possibly the wake-up post) has run
    l.sleeping.store(false, std::memory_order_relaxed);
    if (n == 0 && io.stopped()) return;
  }
}

}  // namespace

runtime::runtime(runtime_options opts) : opts_(opts) {
  if (opts_.loops == 0) opts_.loops = std::max(1u, std::thread::hardware_concurrency());
  if (opts_.batch == 0) opts_.batch = 1;
  if (opts_.mailbox_capacity == 0) throw wiring_error("runtime: mailbox_capacity must be at least 1");
  recorder_.set_timing(opts_.record_timing);
  recorder_.enable(opts_.record);
  loop_actors_.assign(opts_.loops, 0);
  for (unsigned i = 0; i < opts_.loops; ++i) loops_.push_back(std::make_unique<detail::loop_state>(this, i));
  if (opts_.manual) return;
  for (auto& l : loops_) guards_.push_back(boost::asio::make_work_guard(l->io));
  for (auto& l : loops_) {
    l->thread = std::thread([this, l = l.get()] {
      detail::current_loop = l;
      // Handlers never throw out of drain(); anything else escaping is a runtime bug we
      // still must not lose: it becomes the run's failure.
      for (;;) {
        try {
          run_loop(*l);
          break;
        } catch (...) {
          std::lock_guard lk(error_mu_);
          if (!error_) error_ = std::current_exception();
          failed_ = true;
        }
      }
      detail::current_loop = nullptr;
    });
  }
}

runtime::~runtime() {
  try {
    shutdown(shutdown_mode::cancel);
  } catch (...) {
  }
  if (shut_down_) destroy_actors();  // not while loops might still run (a shutdown that failed)
  else (void)arena_.release();       // nor free the memory of actors that may still run
}

void runtime::unlink(detail::actor_cell* c) noexcept {
  std::lock_guard lk(table_mu_);
  if (c->owner.load(std::memory_order_relaxed) != this) return;
  (c->prev ? c->prev->next : cells_) = c->next;
  if (c->next) c->next->prev = c->prev;
  c->prev = c->next = nullptr;
  c->owner.store(nullptr, std::memory_order_relaxed);
}

// Every loop has stopped and been joined: destroy every actor still alive, whoever holds
// its address. Actors that hold each other's addresses (neighbours, consumers and
// producers, a supervisor and its children) would otherwise keep each other forever.
// Addresses held outside outlive the runtime as cells that read as stopped.
void runtime::destroy_actors() noexcept {
  // Wake-ups nobody will run point into the actors: unqueue them first, while the memory
  // the queue walks is still there. (They hold no reference: an actor whose last address
  // went while it was scheduled is doomed and still listed here, and its cell's count is 0
  // until the retain below.)
  for (auto& l : loops_)
    while (l->ready.pop()) {
    }
  // The list is walked through its own links, not copied: a runtime that ran out of
  // memory must still be able to destroy its actors. Once every owner is cleared (under
  // the lock) no unlink touches the links, and the retains keep every cell of the list.
  detail::actor_cell* all;
  {
    std::lock_guard lk(table_mu_);
    for (auto* c = cells_; c; c = c->next) {
      detail::retain(c);  // so no cell goes while the actors below release their addresses
      c->owner.store(nullptr, std::memory_order_relaxed);
    }
    all = std::exchange(cells_, nullptr);
  }
  for (auto* c = all; c; c = c->next) {
    if (actor* a = c->self.exchange(nullptr, std::memory_order_acq_rel)) detail::destroy_actor(a);
  }
  for (auto* c = all; c;) {
    auto* next = c->next;
    c->prev = c->next = nullptr;
    detail::release(c);
    c = next;
  }
}

void runtime::check_spawn(const spawn_options& opts) const {
  if (shut_down_) throw wiring_error("spawn after the runtime was shut down");
  if (opts.loop && *opts.loop >= loops_.size())
    throw wiring_error("spawn on loop " + std::to_string(*opts.loop) + " but the runtime has " +
                       std::to_string(loops_.size()) + " loops");
}

address runtime::start(actor* raw, std::size_t arena_bytes, const spawn_options& opts) {
  raw->rt_ = this;
  raw->arena_bytes_ = static_cast<std::uint32_t>(arena_bytes);
  // From here on a throw destroys the actor: `addr` holds its only reference.
  address addr(raw);
  raw->capacity_ = std::min(opts.capacity ? opts.capacity : opts_.mailbox_capacity, actor::max_capacity);
  raw->batch_ = opts.batch ? opts.batch : opts_.batch;
  raw->supervisor_ = opts.supervisor;
  if (recorder_.enabled()) raw->start_ticks_ = recorder::ticks();  // the start's "send"
  {
    // Placement, id, registry and the list of cells under one lock: no atomic per spawn
    // (the per-loop counts used to share a cache line with the loop's own counters).
    std::lock_guard lk(table_mu_);
    // What allocates comes first (the name, the registry's next segments): a spawn that
    // runs out of memory throws std::bad_alloc before the registry changes, so no actor is
    // ever half registered (in live_ without its info_, or counted on a loop it never
    // joined). The commit below allocates nothing.
    const auto id = static_cast<actor_id>(live_.size() + 1);
    std::string name = raw->name_.empty() ? "actor-" + std::to_string(id) : std::string{};
    actor_info info{name.empty() ? raw->name_ : name, 0};
    live_.reserve_next();
    info_.reserve_next();

    unsigned loop;
    auto* spawner = detail::current_loop;
    if (opts.loop) {
      loop = *opts.loop;
    } else if (opts_.policy == placement::automatic && spawner && spawner->rt == this) {
      loop = spawner->index;  // near its spawner: the first messages are likely between them
    } else if (opts_.policy == placement::least_actors) {
      loop = 0;
      for (unsigned i = 1; i < loops_.size(); ++i)
        if (loop_actors_[i] < loop_actors_[loop]) loop = i;
    } else {
      loop = next_loop_;
      next_loop_ = next_loop_ + 1 == loops_.size() ? 0 : next_loop_ + 1;
    }
    ++loop_actors_[loop];
    if (opts.loop || opts.pinned || opts_.policy != placement::automatic || !opts_.migration.enabled || opts_.manual)
      raw->pinned_.store(true, std::memory_order_relaxed);  // (an actor may also have pinned itself in its constructor)
    raw->window_target_ = std::max(1u, std::min(opts_.migration.first_window, opts_.migration.window));
    raw->loop_.store(loops_[loop].get(), std::memory_order_relaxed);  // before stop_all (any thread) can find it in live_
    raw->id_ = id;
    if (!name.empty()) raw->name_ = std::move(name);
    info.loop = loop;
    live_.push_back(addr);
    info_.push_back(std::move(info));
    auto* c = detail::cell_of(raw);
    c->next = cells_;
    if (cells_) cells_->prev = c;
    cells_ = c;
    c->owner.store(this, std::memory_order_relaxed);
  }
  // The start: counted like a message sent now (synchronize waits for on_start) and run by
  // the actor's first drain before any message, so it goes before anything sent after
  // spawn returns, without an envelope of its own.
  auto* here = detail::current_loop;
  if (here && here->rt == this) here->count_sent();
  else external_sent_.fetch_add(1, std::memory_order_acq_rel);
  if (raw->reserve(lane::urgent).wake) raw->schedule();
  return addr;
}

void runtime::forget(actor_id id) {
  address gone;
  {
    std::lock_guard lk(table_mu_);
    if (id == 0 || id > live_.size()) return;
    gone = std::move(live_[id - 1]);
    live_[id - 1] = address{};
    if (gone) --loop_actors_[info_[id - 1].loop];
  }
  // `gone` releases the runtime's reference here; if it was the last, the running drain
  // (the actor is scheduled) destroys the actor when it ends (detail::release).
}

std::size_t runtime::spawned() const noexcept {
  std::lock_guard lk(table_mu_);
  return live_.size();
}

migration_counts runtime::migrations() const noexcept {
  migration_counts c;
  for (auto& l : loops_) {
    c.affinity += l->moved_for_affinity.load(std::memory_order_relaxed);
    c.balance += l->moved_to_balance.load(std::memory_order_relaxed);
  }
  return c;
}

void runtime::annotate(actor_id id, int stage, std::string group) {
  std::lock_guard lk(table_mu_);
  if (id == 0 || id > info_.size()) throw wiring_error("annotate: no actor with id " + std::to_string(id));
  annotations_[id] = {stage, std::move(group)};
}

void runtime::stop(const address& a) {
  if (!a) return;
  actor* p = a.get();
  (void)p->try_tell(closure{[p] { p->stop(); }}, lane::urgent, 0);
}

void runtime::begin_work() noexcept {
  auto* here = detail::current_loop;
  if (here && here->rt == this) here->count_sent();
  else external_sent_.fetch_add(1, std::memory_order_acq_rel);
}

void runtime::end_work() noexcept {
  auto* here = detail::current_loop;
  if (here && here->rt == this) here->count_handled();
  else external_done_.fetch_add(1, std::memory_order_acq_rel);
  notify_progress();
}

bool runtime::quiescent() const noexcept {
  // Mattern's four-counter rule: read every "handled" first, every "sent" after; equal sums
  // mean that at the end of the first read nothing was queued or running.
  detail::full_fence();
  std::uint64_t handled = external_done_.load(std::memory_order_acquire);
  for (auto& l : loops_) handled += l->handled.load(std::memory_order_acquire);
  detail::full_fence();
  std::uint64_t sent = external_sent_.load(std::memory_order_acquire);
  for (auto& l : loops_) sent += l->sent.load(std::memory_order_acquire);
  return handled == sent;
}

bool runtime::idle() const noexcept { return quiescent(); }

void runtime::notify_progress() {
  detail::full_fence();
  notify_progress_fenced();
}

void runtime::notify_progress_fenced() {
  if (sync_waiters_.load(std::memory_order_relaxed) == 0) return;
  std::lock_guard lk(sync_mu_);
  sync_cv_.notify_all();
}

void runtime::check_not_loop_thread(const char* what) const {
  if (on_loop_thread())
    throw wiring_error(std::string(what) + "() called from one of the runtime's loop threads would wait for itself");
}

void runtime::synchronize() {
  if (opts_.manual) {
    run_until_idle();
  } else {
    check_not_loop_thread("synchronize");
    std::unique_lock lk(sync_mu_);
    sync_waiters_.fetch_add(1, std::memory_order_seq_cst);
    sync_cv_.wait(lk, [this] { return quiescent(); });
    sync_waiters_.fetch_sub(1, std::memory_order_seq_cst);
  }
  if (auto e = error()) std::rethrow_exception(e);
}

std::size_t runtime::poll() {
  if (!opts_.manual) throw wiring_error("poll() is for runtimes in manual mode");
  std::size_t n = 0;
  auto* saved = detail::current_loop;
  for (auto& l : loops_) {
    detail::current_loop = l.get();
    if (l->io.stopped()) l->io.restart();
    n += l->run_ready(static_cast<std::size_t>(-1));
    n += l->io.poll();
  }
  detail::current_loop = saved;
  return n;
}

std::size_t runtime::run_until_idle() {
  std::size_t total = 0;
  for (;;) {
    auto n = poll();
    total += n;
    if (n == 0 && quiescent()) return total;
    if (n == 0) std::this_thread::yield();  // work outside the loops (begin_work) still pending
  }
}

void runtime::report_failure(actor& who, std::exception_ptr error) {
  bool first = false;
  {
    std::lock_guard lk(error_mu_);
    if (!error_) {
      error_ = error;
      first = true;
    }
  }
  failed_.store(true, std::memory_order_release);
  if (first) {
    if (on_failure_) on_failure_(error);
    // The run ends with this error: everything stops, queued work is dropped. A stop that
    // finds no memory is left to shutdown, which then stops the loops where they are.
    (void)stop_all();
  }
}

void runtime::on_failure(std::function<void(std::exception_ptr)> f) {
  std::lock_guard lk(error_mu_);
  on_failure_ = std::move(f);
}

std::exception_ptr runtime::error() const {
  std::lock_guard lk(error_mu_);
  return error_;
}

std::exception_ptr runtime::stop_all() noexcept {
  // Sends a stop to every live actor, allocating nothing but the stops' envelopes: the
  // registry is copied a chunk at a time onto the stack, not into a vector as long as the
  // registry, which a runtime that ran out of memory spawning could not allocate.
  std::exception_ptr lost;
  std::array<address, 64> chunk;
  std::size_t next = 0;
  for (;;) {
    std::size_t n = 0;
    {
      std::lock_guard lk(table_mu_);
      for (; next < live_.size() && n < chunk.size(); ++next)
        if (live_[next]) chunk[n++] = live_[next];
    }
    if (n == 0) return lost;
    for (std::size_t i = 0; i < n; ++i) {
      actor* p = chunk[i].get();
      try {
        // Urgent lane: runs before the queued normal messages, which are then dropped.
        (void)p->try_tell(closure{[p] { p->stop(); }}, lane::urgent, 0);
      } catch (...) {  // std::bad_alloc: no envelope for this stop (or no wake-up for its loop)
        if (!lost) lost = std::current_exception();
      }
      chunk[i] = address{};  // outside the lock: a release may delete an actor
    }
  }
}

void runtime::shutdown(shutdown_mode mode) {
  if (shut_down_) return;
  check_not_loop_thread("shutdown");
  if (mode == shutdown_mode::drain) {
    try {
      synchronize();
    } catch (...) {
      // The failure stays available through error(); shutdown goes on.
    }
  }
  if (auto lost = stop_all()) {
    // Memory ran out: an actor that no stop reached would keep the run from ever going
    // quiet. The loops stop where they are instead, and the teardown destroys every actor
    // with what it still has queued (without its on_stop), allocating nothing.
    std::lock_guard lk(error_mu_);
    if (!error_) error_ = lost;
    failed_.store(true, std::memory_order_release);
  } else if (opts_.manual) {
    run_until_idle();
  } else {
    std::unique_lock lk(sync_mu_);
    sync_waiters_.fetch_add(1, std::memory_order_seq_cst);
    sync_cv_.wait(lk, [this] { return quiescent(); });
    sync_waiters_.fetch_sub(1, std::memory_order_seq_cst);
  }
  shut_down_ = true;
  guards_.clear();
  for (auto& l : loops_) l->io.stop();
  for (auto& l : loops_)
    if (l->thread.joinable()) l->thread.join();
  if (timer_io_) {
    timer_guard_.reset();
    timer_io_->stop();
    timer_thread_.join();
  }
  detail::segmented_vector<address> last;
  {
    std::lock_guard lk(table_mu_);
    last = live_.take();
  }
  // `last` releases the runtime's references outside the lock (a release may delete an actor).
}

boost::asio::io_context& runtime::timer_context() {
  if (opts_.manual) return loops_[0]->io;  // stepped by the caller like every loop
  std::call_once(timer_once_, [this] {
    timer_io_ = std::make_unique<boost::asio::io_context>(1);
    timer_guard_.emplace(boost::asio::make_work_guard(*timer_io_));
    timer_thread_ = std::thread([io = timer_io_.get()] { io->run(); });
  });
  return *timer_io_;
}

void runtime::throw_send_error(send_status s, const address& to) const {
  if (!to) throw wiring_error("send to an empty address");
  if (s == send_status::closed) throw send_error(s, "send to stopped actor '" + std::string(to.name()) + "'");
  throw send_error(s, "send to actor '" + std::string(to.name()) + "' whose mailbox is full (capacity " +
                          std::to_string(to.get()->capacity()) + ")");
}

void runtime::write_trace(const std::string& path) const { write_trace(path, nlohmann::json::object()); }

void runtime::write_trace(const std::string& path, const nlohmann::json& extra) const {
  recorder_.write_file(path, trace_actors(), extra);
}

nlohmann::json runtime::trace_actors() const {
  nlohmann::json actors = nlohmann::json::array();
  {
    std::lock_guard lk(table_mu_);
    const actor_annotation none;
    for (std::size_t i = 0; i < info_.size(); ++i) {
      auto it = annotations_.find(static_cast<actor_id>(i + 1));
      const auto& an = it == annotations_.end() ? none : it->second;
      actors.push_back({{"id", i + 1}, {"name", info_[i].name}, {"loop", info_[i].loop}, {"stage", an.stage},
                        {"group", an.group}});
    }
  }
  return actors;
}

}  // namespace nerve::actors

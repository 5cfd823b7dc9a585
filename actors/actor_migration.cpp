// Where an actor runs next (docs/architecture.md, "Placement and migration"): the
// decision a mobile actor's drain calls out of line, once a window of messages was
// counted or a drain was timed. The drain itself is in actors/actor.cpp.
#include "actors/actor.hpp"

#include <algorithm>

#include "actors/runtime.hpp"

namespace nerve::actors {

bool actor::consider_move(detail::loop_state* here, std::int64_t timed_from, std::uint64_t sent_before, std::uint32_t taken) {
  // A timed drain's cost is per message handled or sent: a producer whose one run sends a
  // thousand cheap messages is as light as its consumer. (None: woken for a push not yet done.)
  const auto units = timed_from != 0 ? std::uint64_t{taken} + (here->sent.load(std::memory_order_relaxed) - sent_before) : 0;
  if (units != 0) {
    const auto drain_ns = rt_->migration_clock() - timed_from;
    // The fastest timed drain of the window, per message: a light actor whose drain was
    // slowed once (a wake-up system call, the host taking the core) still reads light.
    const auto ns = static_cast<std::uint32_t>(std::clamp<std::int64_t>(drain_ns / static_cast<std::int64_t>(units), 1, 1'000'000'000));
    window_min_ns_ = std::min(window_min_ns_, ns);
    // At once, not at the next decision: a producer's sends stop pulling its consumer from
    // its second timed drain on, though it handles few messages and decides rarely.
    heavy_ = window_min_ns_ >= rt_->opts_.migration.heavy_ns;
    if (heavy_ && load_ns_ == 0) {  // its loop's heavy load counts it from its first timed drain on
      load_ns_ = ns;
      here->heavy_ns.fetch_add(ns, std::memory_order_relaxed);
    }
  }
  if (window_msgs_ < window_target_) return false;
  return decide_move(here);
}

bool actor::decide_move(detail::loop_state* here) {
  auto& rt = *rt_;
  const auto epoch = rt.migration_epoch_.load(std::memory_order_acquire);
  const bool stale = epoch != window_epoch_;
  const auto msgs = window_msgs_, votes = votes_;
  const auto candidate = vote_loop_;
  if (window_min_ns_ != ~0u) run_ns_ = window_min_ns_;  // else the last window's stands
  heavy_ = run_ns_ >= rt.opts_.migration.heavy_ns;
  window_msgs_ = votes_ = 0;
  window_min_ns_ = ~0u;
  window_target_ = std::min(2 * window_target_, std::max(1u, rt.opts_.migration.window));  // short first windows, then the full one
  window_epoch_ = epoch;
  // What this actor adds to its loop's heavy load, which balance decisions weigh: its
  // fastest run per message while heavy, none while light (kept until a run is timed here).
  if (run_ns_ != 0) {
    const std::uint32_t load = heavy_ ? run_ns_ : 0;
    if (load != load_ns_) {
      here->heavy_ns.fetch_add(std::uint64_t{load} - load_ns_, std::memory_order_relaxed);  // wraps to a subtraction
      load_ns_ = load;
    }
  }
  // Something moved while this window was counted: the loops it saw are out of date. Two
  // partners that would both move to the other's loop at once (and so stay apart) are
  // kept from it this way: the first to move makes the other's window stale. A heavy
  // actor's decision reads the loops' loads as they are now, so it goes on.
  if (stale) {
    pull_candidate_ = envelope::no_loop;
    if (!heavy_) return false;
  }
  if (hold_ != 0) {  // backoff after a move
    --hold_;
    return false;
  }
  if (run_ns_ == 0 || pinned_.load(std::memory_order_relaxed) || stop_requested_ || closed_.load(std::memory_order_relaxed) ||
      awaiting_answers())  // a pending request's timer is bound to this loop
    return false;
  const auto& mo = rt.opts_.migration;
  const bool heavy = heavy_;
  detail::loop_state* to = nullptr;
  bool balance = false;
  if (!heavy) {
    // Affinity: at least 3/4 of the window came from one other loop: a light actor's hops
    // cost more than its work, so it goes where its senders are. Two windows in a row must
    // say so: the first window of a pair can hold messages from a sender not yet known to
    // be heavy (its first drain sends before it is timed).
    const bool pulled = candidate != here->index && candidate < rt.loops_.size() && 2 * votes >= msgs;
    const auto previous = pull_candidate_;
    pull_candidate_ = pulled ? candidate : envelope::no_loop;
    if (pulled && previous == candidate) to = rt.loops_[candidate].get();
  } else if (!here->ready.empty()) {
    // Balance: others wait their turn behind this heavy actor. It goes to a loop that sits
    // idle with no heavy work, or to one where nobody waits for a turn (idle, or running
    // actors that each get theirs at once) if the heavier of the two loops gets lighter by
    // the move: that loop's heavy load plus this actor's stays under this loop's. An even
    // split stays put, and every move shrinks the larger load, so moves cannot cycle while
    // the loads hold. The least loaded such loop wins. (Pinned and light actors' work is
    // not weighed, beyond the queue it leaves there.)
    const std::uint64_t mine = load_ns_, here_load = here->heavy_ns.load(std::memory_order_relaxed);
    std::uint64_t best = ~std::uint64_t{0};
    for (auto& l : rt.loops_) {
      if (l.get() == here) continue;
      const bool idle = l->idle.load(std::memory_order_relaxed);
      if (!idle && !l->ready.seems_empty()) continue;
      const auto there = l->heavy_ns.load(std::memory_order_relaxed);
      if (there < best && ((there == 0 && idle) || there + mine < here_load)) {
        to = l.get();
        best = there;
      }
    }
    balance = to != nullptr;
  }
  if (!to) return false;
  // One move per window of the whole runtime: the epoch is the token.
  auto expected = epoch;
  if (!rt.migration_epoch_.compare_exchange_strong(expected, epoch + 1, std::memory_order_acq_rel)) return false;
  window_epoch_ = epoch + 1;
  pull_candidate_ = envelope::no_loop;
  const auto m = moves_.load(std::memory_order_relaxed) + 1;
  moves_.store(m, std::memory_order_relaxed);
  hold_ = (1u << std::min<std::uint32_t>(m, mo.max_backoff)) - 1;  // 1, 3, 7, ... windows before the next decision
  auto& counter = balance ? here->moved_to_balance : here->moved_for_affinity;
  counter.store(counter.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  run_ns_ = 0;  // what a run costs there is measured there (heavy_ and load_ns_ stay until then)
  if (load_ns_ != 0) {
    here->heavy_ns.fetch_sub(load_ns_, std::memory_order_relaxed);
    to->heavy_ns.fetch_add(load_ns_, std::memory_order_relaxed);
  }
  loop_.store(to, std::memory_order_relaxed);  // published to `to` by the ready queue's push
  to->schedule(&ready_link_);
  return true;
}

}  // namespace nerve::actors

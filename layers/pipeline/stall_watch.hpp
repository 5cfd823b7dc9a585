#pragma once
/// \file
/// `stage_watch`: what one stage's gate is doing, readable by a thread that cannot message
/// the gate (a layer blocked in its handler blocks the gate's loop too).
///
/// The gate counts the messages it handles (`bump`: a relaxed store by its one writer, so
/// the waiter tells "nothing moved since the last look" by comparing two samples) and
/// publishes its state (`publish`) when it starts an action, blocks, steps or fails: never
/// per message. `pipeline::train_step` samples every local stage while it waits on their
/// reports and, once none moved for `pipeline_options::stall_timeout_s`, ends the step
/// with `describe`'s report (docs/pipeline.md, "A run that stops moving").
///
/// Thread safety: `bump` from the gate's loop only; the rest from any thread.

#include <atomic>
#include <cstdint>
#include <mutex>

#include "layers/pipeline/schedule.hpp"

namespace nerve::pipeline {

/// A gate's published state.
struct gate_state {
  enum class phase : std::uint8_t { idle, running, waiting, stepping, failed };
  phase now = phase::idle;
  /// Running: the action running. Waiting: the action it is admitted to run next.
  action next{};
  bool has_next = false;
  std::uint32_t piece = 0;
  /// Waiting for values: the stage they come from (-1: none, the stage's own input or loss),
  /// how many arrived and how many it needs; `forward` says which kind.
  std::int32_t from_stage = -1;
  bool forward = true;
  std::uint32_t have = 0, need = 0;
  /// Waiting for credits (emergent mode): the next stage holds all it may.
  bool credits = false;
  /// Running or stepping: the stage's layers that reported it done, of how many.
  std::uint32_t done = 0, layers = 0;
  /// The edge to the next stage: micro-batches sent on whose gradient has not come back,
  /// and how many may be (emergent mode's credits; 0: the schedule decides).
  std::uint32_t out = 0, credit_limit = 0;
  std::size_t actions_done = 0, actions = 0;
};

class stage_watch {
 public:
  /// The gate handled a message (its loop only).
  void bump() noexcept { events_.store(events_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed); }
  /// Messages the gate handled so far (any thread; a sample).
  std::uint64_t events() const noexcept { return events_.load(std::memory_order_relaxed); }
  void publish(const gate_state& s) {
    std::lock_guard lock(m_);
    state_ = s;
  }
  gate_state state() const {
    std::lock_guard lock(m_);
    return state_;
  }

 private:
  std::atomic<std::uint64_t> events_{0};
  mutable std::mutex m_;
  gate_state state_;
};

}  // namespace nerve::pipeline

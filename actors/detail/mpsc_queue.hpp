#pragma once
/// \file
/// Intrusive multi-producer single-consumer queue (Vyukov's algorithm).
/// push: wait-free, one atomic exchange, any thread. pop: consumer thread only.
/// A pop can transiently return nullptr while a producer is between its exchange
/// and its link (the "inconsistent" window); callers that know a node is pending
/// (the mailbox counts them) retry.

#include <atomic>
#include <cstddef>

namespace nerve::actors::detail {

struct mpsc_node {
  std::atomic<mpsc_node*> next{nullptr};
};

/// An entry of a loop's ready queue (one per actor, embedded in it): popping it runs
/// `run(owner)` (the actor's drain). It holds no reference (the actor's scheduled bit
/// keeps it alive), so an entry left queued when a loop goes is simply dropped.
struct ready_link : mpsc_node {
  void (*run)(void* owner) noexcept = nullptr;
  void* owner = nullptr;
};

/// The parts of a queue, kept apart so that a holder can put them on the cache lines of
/// the threads that write them: producers write the head, and the stub's link when the
/// queue was empty; the consumer writes the tail, and pushes the stub back at the queue's
/// last node (an actor's mailbox puts the normal lane's head and stub on the senders' line
/// and its tail on the drain's: actor.hpp).
struct mpsc_head {
  std::atomic<mpsc_node*> head{nullptr};
};
struct mpsc_tail {
  mpsc_node* tail = nullptr;
};

/// Empties a queue (before any push or pop).
inline void mpsc_init(mpsc_head& h, mpsc_tail& t, mpsc_node& stub) noexcept {
  stub.next.store(nullptr, std::memory_order_relaxed);
  h.head.store(&stub, std::memory_order_relaxed);
  t.tail = &stub;
}

/// Thread-safe: any thread.
inline void mpsc_push(mpsc_head& h, mpsc_node* n) noexcept {
  n->next.store(nullptr, std::memory_order_relaxed);
  mpsc_node* prev = h.head.exchange(n, std::memory_order_acq_rel);
  prev->next.store(n, std::memory_order_release);
}

/// Consumer only. True when nothing was pushed that has not been popped; a push that is
/// half done counts as non-empty. With a seq_cst fence between a consumer's store and
/// this read (and between a producer's push and its read of that store), at least one
/// of the two sees the other: the loop's sleep protocol relies on it.
inline bool mpsc_empty(const mpsc_head& h, const mpsc_tail& t, const mpsc_node& stub) noexcept {
  return t.tail == &stub && h.head.load(std::memory_order_relaxed) == &stub;
}

/// Consumer only. Returns nullptr when empty or while a push is half done. Reads the
/// producers' head only at the queue's last node.
inline mpsc_node* mpsc_pop(mpsc_head& h, mpsc_tail& t, mpsc_node& stub) noexcept {
  mpsc_node* tail = t.tail;
  mpsc_node* next = tail->next.load(std::memory_order_acquire);
  if (tail == &stub) {
    if (next == nullptr) return nullptr;
    t.tail = next;
    tail = next;
    next = next->next.load(std::memory_order_acquire);
  }
  if (next != nullptr) {
    t.tail = next;
    return tail;
  }
  if (tail != h.head.load(std::memory_order_acquire)) return nullptr;  // push in progress
  mpsc_push(h, &stub);
  next = tail->next.load(std::memory_order_acquire);
  if (next != nullptr) {
    t.tail = next;
    return tail;
  }
  return nullptr;
}

/// A queue in one object, each end on a cache line of its own: for a queue many threads
/// hammer (a loop's ready queue).
class mpsc_queue {
 public:
  mpsc_queue() noexcept { mpsc_init(h_, t_, stub_); }
  mpsc_queue(const mpsc_queue&) = delete;
  mpsc_queue& operator=(const mpsc_queue&) = delete;

  /// Thread-safe: any thread.
  void push(mpsc_node* n) noexcept { mpsc_push(h_, n); }
  /// Consumer only (see `mpsc_empty`).
  bool empty() const noexcept { return mpsc_empty(h_, t_, stub_); }
  /// Consumer only. Returns nullptr when empty or while a push is half done.
  mpsc_node* pop() noexcept { return mpsc_pop(h_, t_, stub_); }
  /// Any thread, a hint: true when the last node pushed is the stub, which the consumer
  /// pushes back as it takes the last node (nothing queued then, unless a push is under way).
  bool seems_empty() const noexcept { return h_.head.load(std::memory_order_relaxed) == &stub_; }

 private:
  alignas(64) mpsc_head h_;
  alignas(64) mpsc_tail t_;
  mpsc_node stub_;
};

}  // namespace nerve::actors::detail

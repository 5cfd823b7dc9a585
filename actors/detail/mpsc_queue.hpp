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
/// `run(owner, false)` (the actor's drain); a loop destroyed with it still queued calls
/// `run(owner, true)` (release only).
struct ready_link : mpsc_node {
  void (*run)(void* owner, bool discard) noexcept = nullptr;
  void* owner = nullptr;
};

/// `Padded`: head (producers) and tail (consumer) on cache lines of their own, for a queue
/// many threads hammer (a loop's ready queue). Unpadded (24 bytes) for the two mailbox lanes
/// every actor holds: 100,000 actors then cost 37 MiB less, and an actor's producer-side
/// fields share a line anyway.
template <bool Padded>
class basic_mpsc_queue {
  static constexpr std::size_t line = Padded ? 64 : alignof(mpsc_node*);

 public:
  basic_mpsc_queue() noexcept : head_(&stub_), tail_(&stub_) {}
  basic_mpsc_queue(const basic_mpsc_queue&) = delete;
  basic_mpsc_queue& operator=(const basic_mpsc_queue&) = delete;

  /// Thread-safe: any thread.
  void push(mpsc_node* n) noexcept {
    n->next.store(nullptr, std::memory_order_relaxed);
    mpsc_node* prev = head_.exchange(n, std::memory_order_acq_rel);
    prev->next.store(n, std::memory_order_release);
  }

  /// Consumer only. True when nothing was pushed that has not been popped; a push that is
  /// half done counts as non-empty. With a seq_cst fence between a consumer's store and
  /// this read (and between a producer's push and its read of that store), at least one
  /// of the two sees the other: the loop's sleep protocol relies on it.
  bool empty() const noexcept { return tail_ == &stub_ && head_.load(std::memory_order_relaxed) == &stub_; }

  /// Consumer only. Returns nullptr when empty or while a push is half done.
  mpsc_node* pop() noexcept {
    mpsc_node* tail = tail_;
    mpsc_node* next = tail->next.load(std::memory_order_acquire);
    if (tail == &stub_) {
      if (next == nullptr) return nullptr;
      tail_ = next;
      tail = next;
      next = next->next.load(std::memory_order_acquire);
    }
    if (next != nullptr) {
      tail_ = next;
      return tail;
    }
    if (tail != head_.load(std::memory_order_acquire)) return nullptr;  // push in progress
    push(&stub_);
    next = tail->next.load(std::memory_order_acquire);
    if (next != nullptr) {
      tail_ = next;
      return tail;
    }
    return nullptr;
  }

 private:
  alignas(line) std::atomic<mpsc_node*> head_;
  alignas(line) mpsc_node* tail_;
  mpsc_node stub_;
};

using mpsc_queue = basic_mpsc_queue<true>;
using compact_mpsc_queue = basic_mpsc_queue<false>;

}  // namespace nerve::actors::detail

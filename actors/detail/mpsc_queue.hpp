#pragma once
/// \file
/// Intrusive multi-producer single-consumer queue (Vyukov's algorithm).
/// push: wait-free, one atomic exchange, any thread. pop: consumer thread only.
/// A pop can transiently return nullptr while a producer is between its exchange
/// and its link (the "inconsistent" window); callers that know a node is pending
/// (the mailbox counts them) retry.

#include <atomic>

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

class mpsc_queue {
 public:
  mpsc_queue() noexcept : head_(&stub_), tail_(&stub_) {}
  mpsc_queue(const mpsc_queue&) = delete;
  mpsc_queue& operator=(const mpsc_queue&) = delete;

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
  alignas(64) std::atomic<mpsc_node*> head_;
  alignas(64) mpsc_node* tail_;
  mpsc_node stub_;
};

}  // namespace nerve::actors::detail

#pragma once
/// \file
/// `actor_arena`: where a runtime places the actors it spawns.
///
/// Slots in 64-byte classes (every actor starts on a cache line of its own, so one actor's
/// producer-side atomics never share a line with its neighbour's), carved from blocks the
/// arena owns: the first 64 KiB, the next ones 2 MiB, aligned and marked for transparent
/// huge pages. Spawning 100,000 actors from fresh heap pages cost a page fault every few
/// actors (microseconds each on a VM, ~40% of the spawn); from huge pages it costs one
/// fault per 2 MiB. A freed slot goes on its class's free list and is reused by the next
/// spawn of that size. Blocks are freed with the arena (the runtime destroys every actor
/// first).
///
/// Thread-safety: `allocate` and `deallocate` from any thread (a mutex, uncontended in
/// practice: taken once per spawn and once per actor deleted).

#include <sys/mman.h>

#include <array>
#include <cstddef>
#include <cstdlib>
#include <mutex>
#include <new>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define NERVE_ARENA_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define NERVE_ARENA_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define NERVE_ARENA_POISON(p, n) ((void)(p), (void)(n))
#define NERVE_ARENA_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace nerve::actors::detail {

class actor_arena {
 public:
  static constexpr std::size_t granule = 64;         ///< slot alignment and size step
  static constexpr std::size_t max_slot = 4096;      ///< bigger objects come from operator new
  static constexpr std::size_t first_block = 64 << 10;
  static constexpr std::size_t block = 2 << 20;

  /// The slot size for an object of `n` bytes (0: not from the arena).
  static constexpr std::size_t slot_size(std::size_t n) noexcept {
    return n > max_slot ? 0 : (n + granule - 1) & ~(granule - 1);
  }

  actor_arena() = default;
  actor_arena(const actor_arena&) = delete;
  actor_arena& operator=(const actor_arena&) = delete;
  ~actor_arena() {
    for (std::size_t i = 0; i < blocks_.size(); ++i) ::operator delete(blocks_[i], alignment_of_block(i));
  }

  /// Any thread: storage for an object of `n` bytes, aligned to `granule`. Throws `std::bad_alloc`.
  void* allocate(std::size_t n) {
    const std::size_t s = slot_size(n);
    if (s == 0) return ::operator new(n, std::align_val_t{granule});
    void* p;
    {
      std::lock_guard lk(mu_);
      if (auto* f = free_[s / granule]) {
        NERVE_ARENA_UNPOISON(f, sizeof(free_slot));
        free_[s / granule] = f->next;
        ++reused_;
        p = f;
      } else {
        if (static_cast<std::size_t>(limit_ - cursor_) < s) grow();
        p = cursor_;
        cursor_ += s;
      }
      ++live_;
    }
    NERVE_ARENA_UNPOISON(p, s);
    return p;
  }

  /// Any thread: gives back what `allocate(n)` returned (the same `n`).
  void deallocate(void* p, std::size_t n) noexcept {
    const std::size_t s = slot_size(n);
    if (s == 0) {
      ::operator delete(p, std::align_val_t{granule});
      return;
    }
    NERVE_ARENA_POISON(p, s);
    NERVE_ARENA_UNPOISON(p, sizeof(free_slot));
    std::lock_guard lk(mu_);
    auto* f = static_cast<free_slot*>(p);
    f->next = free_[s / granule];
    free_[s / granule] = f;
    NERVE_ARENA_POISON(p, sizeof(free_slot));
    --live_;
  }

  /// Slots handed out and not given back (for tests and leak checks).
  std::size_t live() const {
    std::lock_guard lk(mu_);
    return live_;
  }
  /// Allocations served from a free list (a reused slot).
  std::size_t reused() const {
    std::lock_guard lk(mu_);
    return reused_;
  }
  /// Blocks taken from the system.
  std::size_t blocks() const {
    std::lock_guard lk(mu_);
    return blocks_.size();
  }

 private:
  struct free_slot {
    free_slot* next;
  };

  void grow() {
    // The first block is small (most runtimes spawn a handful of actors); the next ones are
    // huge pages. What is left of the old block is not used.
    // From operator new, like every other allocation of a spawn: out of memory is
    // std::bad_alloc (and tests that make the Nth allocation fail reach this one too).
    const std::size_t bytes = blocks_.empty() ? first_block : block;
    void* b = ::operator new(bytes, alignment_of_block(blocks_.size()));
#ifdef MADV_HUGEPAGE
    if (bytes == block) (void)madvise(b, bytes, MADV_HUGEPAGE);  // advice: without THP it is a no-op
#endif
    try {
      blocks_.push_back(b);
    } catch (...) {
      ::operator delete(b, alignment_of_block(blocks_.size()));
      throw;
    }
    cursor_ = static_cast<char*>(b);
    limit_ = cursor_ + bytes;
    NERVE_ARENA_POISON(b, bytes);
  }

  /// Block `i`'s alignment: the first block is small, the next ones huge pages.
  static std::align_val_t alignment_of_block(std::size_t i) noexcept {
    return std::align_val_t{i == 0 ? granule : block};
  }

  mutable std::mutex mu_;
  std::array<free_slot*, max_slot / granule + 1> free_{};
  char* cursor_ = nullptr;
  char* limit_ = nullptr;
  std::size_t live_ = 0;
  std::size_t reused_ = 0;
  std::vector<void*> blocks_;
};

}  // namespace nerve::actors::detail

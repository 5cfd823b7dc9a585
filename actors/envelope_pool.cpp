#include "actors/detail/envelope_pool.hpp"

#include <new>

namespace nerve::actors::detail {

namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool pooled = false;  // ASan must see each envelope's free, and any use after it
#else
constexpr bool pooled = true;
#endif

constexpr std::size_t granule = 32;   // size classes 32, 64, ..., 256 bytes
constexpr std::size_t classes = 8;
constexpr unsigned keep = 256;        // blocks kept per class and thread; more go back to malloc

struct free_block {
  free_block* next;
};

/// One thread's lists. Freed at thread exit (a loop thread's, the main thread's).
/// A class's head and count side by side, on a cache line of their own placement: where
/// the other thread-locals put them decided, before, whether a send and a handling
/// touched one line of them or two (a few percent of chain/64 on one loop).
struct alignas(64) thread_lists {
  struct list {
    free_block* head = nullptr;
    unsigned count = 0;
  };
  list of[classes];
  thread_lists() = default;
  thread_lists(const thread_lists&) = delete;
  thread_lists& operator=(const thread_lists&) = delete;
  // Envelopes freed later in the thread's exit (by other thread-local or static objects)
  // find empty, full lists and go straight to the global allocator.
  ~thread_lists() {
    for (std::size_t c = 0; c < classes; ++c) {
      while (free_block* b = of[c].head) {
        of[c].head = b->next;
        ::operator delete(b, (c + 1) * granule);
      }
      of[c].count = keep;
    }
  }
};

constinit thread_local thread_lists lists;

constexpr std::size_t class_of(std::size_t bytes) noexcept { return (bytes - 1) / granule; }

}  // namespace

void* envelope_allocate(std::size_t bytes) {
  const std::size_t c = class_of(bytes);
  if (!pooled || c >= classes) return ::operator new(bytes);
  auto& l = lists.of[c];
  if (free_block* b = l.head) {
    l.head = b->next;
    --l.count;
    return b;
  }
  return ::operator new((c + 1) * granule);
}

void envelope_deallocate(void* p, std::size_t bytes) noexcept {
  const std::size_t c = class_of(bytes);
  if (!pooled || c >= classes) {
    ::operator delete(p, bytes);
    return;
  }
  auto& l = lists.of[c];
  if (l.count == keep) {
    ::operator delete(p, (c + 1) * granule);
    return;
  }
  auto* b = static_cast<free_block*>(p);
  b->next = l.head;
  l.head = b;
  ++l.count;
}

}  // namespace nerve::actors::detail

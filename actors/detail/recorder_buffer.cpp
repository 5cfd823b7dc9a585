#include "actors/detail/recorder_buffer.hpp"

#include <sys/mman.h>

#include <cstdlib>
#include <mutex>
#include <new>

namespace nerve::actors::detail {

namespace {
// Chunks a recorder gives back are kept for the next one, up to `pool_chunks`: a process
// records again and again (every benchmark repeat, every test, a training run per epoch
// with a fresh runtime), and a fresh chunk costs a huge-page fault plus the kernel zeroing
// 2 MiB, which was most of what recording cost chain/64 (clear_page ~14% of the run's
// samples). A reused chunk is already mapped: writing records into it faults nothing.
constexpr std::size_t pool_chunks = 64;  // 128 MiB at most stays mapped for reuse
struct chunk_pool {
  std::mutex mu;
  std::vector<void*> free;
};
chunk_pool& pool() noexcept {
  static auto* p = new chunk_pool;  // never destroyed: recorders may outlive static destruction
  return *p;
}
}  // namespace

void chunk_free::operator()(packed_message* p) const noexcept {
  auto& pl = pool();
  {
    std::lock_guard lk(pl.mu);
    if (pl.free.size() < pool_chunks) {
      try {
        pl.free.push_back(p);
        return;
      } catch (...) {
      }
    }
  }
  std::free(p);
}

chunk_ptr new_chunk() {
  {
    auto& pl = pool();
    std::lock_guard lk(pl.mu);
    if (!pl.free.empty()) {
      void* p = pl.free.back();
      pl.free.pop_back();
      return chunk_ptr(static_cast<packed_message*>(p));
    }
  }
  void* p = std::aligned_alloc(chunk_bytes, chunk_bytes);
  if (!p) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  (void)madvise(p, chunk_bytes, MADV_HUGEPAGE);  // advice only: without THP it is a no-op
#endif
  return chunk_ptr(static_cast<packed_message*>(p));
}

}  // namespace nerve::actors::detail

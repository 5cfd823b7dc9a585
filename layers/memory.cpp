#include "layers/memory.hpp"

#include <cstdlib>  // defines __GLIBC__ on glibc systems

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace nerve::layers {

void keep_freed_memory() noexcept {
  [[maybe_unused]] static const bool once = [] {
#if defined(__GLIBC__)
    // Fixed values also switch off glibc's dynamic threshold, whose level depended on the
    // largest block freed so far (so the same step faulted or not depending on what ran before).
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
    return true;
  }();
}

}  // namespace nerve::layers

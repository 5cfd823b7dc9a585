#pragma once
/// \file
/// Per-thread free lists for envelopes.
///
/// Every message is one envelope, allocated by the sender and freed on the receiver's loop
/// right after its handler ran. glibc's malloc keeps only 7 freed blocks per size in its
/// thread cache; a drain frees up to a batch (64) of them, so most frees and the sender's
/// next allocations went through malloc's shared bins (compare-and-swap, arena lock): 10%
/// of chain/64's samples. These lists keep up to 256 blocks of each 32-byte size class up
/// to 256 bytes, per thread, with no atomics. A block freed on another thread than the one
/// that allocated it simply joins that thread's list. Larger or over-aligned envelopes go
/// straight to the global allocator, and so does everything under AddressSanitizer, so
/// that it still sees every use after free.

#include <cstddef>

namespace nerve::actors::detail {

/// A block of at least `bytes` bytes, aligned for any standard type.
void* envelope_allocate(std::size_t bytes);
/// Gives back a block from envelope_allocate(`bytes`).
void envelope_deallocate(void* p, std::size_t bytes) noexcept;

}  // namespace nerve::actors::detail

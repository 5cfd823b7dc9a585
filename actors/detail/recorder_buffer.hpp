#pragma once
/// \file
/// What a thread records into: `recorder_buffer`, its chunks of packed message records and
/// its other records, and the pool of 2 MiB chunks that recorders share. Written by the
/// recording thread (`recorder::local` and the writes in actors/recorder.cpp), read by
/// `recorder::snapshot` (actors/recorder_snapshot.cpp) when no thread records.

#include "actors/recorder.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <numeric>
#include <thread>
#include <vector>

namespace nerve::actors::detail {

// Message records go to 2 MiB chunks, aligned and marked for transparent huge pages: on a
// VM every fresh 4 KiB page costs a fault of several microseconds; a huge page takes one
// fault per 2 MiB. The chunk is left uninitialised (`packed_message` is trivial, so writing
// into malloc'd storage is fine); the kernel hands it over zeroed anyway.
constexpr std::size_t chunk_bytes = std::size_t{2} << 20;
constexpr std::size_t chunk_records = chunk_bytes / sizeof(packed_message);

/// Gives a chunk back to the pool, or to the system when the pool is full. Any thread.
struct chunk_free {
  void operator()(packed_message* p) const noexcept;
};
using chunk_ptr = std::unique_ptr<packed_message[], chunk_free>;
/// A chunk from the pool, or a fresh one; throws `std::bad_alloc`. Any thread.
chunk_ptr new_chunk();

/// A record other than a handled message, as written.
struct stored_record {
  record r;
  bool in_ticks = false;  // r.ts_ns holds ticks, converted at export
};
/// One thread's records in one recorder.
struct recorder_buffer {
  recorder_chunk_cursor cursor;
  std::thread::id thread;
  std::uint32_t index = 0;
  std::uint64_t flows = 0;
  // Records (message and group) in each chunk before the last: a chunk is not always full
  // when the next begins (a wide record takes a slot off its end; the record limit cuts
  // it short).
  std::vector<std::size_t> filled;
  std::vector<chunk_ptr> chunks;
  std::vector<message_record> wide;   // handled messages that do not pack (rare)
  std::vector<stored_record> others;  // everything but handled messages (rare)
  std::size_t packed() const noexcept {
    if (chunks.empty()) return 0;
    return std::accumulate(filled.begin(), filled.end(), static_cast<std::size_t>(cursor.next - chunks.back().get()));
  }
  /// Handled messages recorded: packed (less the group records among them) and wide.
  std::size_t messages() const noexcept { return packed() - cursor.groups + wide.size(); }
};

}  // namespace nerve::actors::detail

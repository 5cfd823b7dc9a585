#pragma once
/// \file
/// `recorder`: records every send, handler run and drop (and events that upper layers add:
/// pipeline idle time and actions, GPU spans) into per-thread buffers, and exports them in
/// the Chrome trace event format (docs/trace-format.md).
///
/// Off, it costs one relaxed atomic load per send and per handler run. On, a record is a
/// clock read plus a 64-byte append to the calling thread's own buffer: no lock, no
/// allocation except when a chunk fills.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "actors/message.hpp"

namespace nerve::actors {

/// What a record describes.
enum class record_kind : std::uint8_t {
  send,     ///< a message was enqueued: flow start on the sender's track
  handle,   ///< a handler ran: slice on the receiver's track, flow end
  drop,     ///< a message was dropped (receiver closed or full)
  failure,  ///< a handler threw
  span,     ///< a span added by upper layers (idle, action, gpu)
  instant,  ///< an instant added by upper layers
  counter,  ///< a counter value (mailbox depth, credits)
};

/// One recorded event. Strings are static (string literals or type tags): records never own memory.
struct record {
  std::int64_t ts_ns = 0;      ///< start, recorder clock
  std::int64_t dur_ns = 0;     ///< handle/span: duration
  std::uint64_t flow = 0;      ///< flow id linking a send to its handling
  std::uint64_t bytes = 0;
  std::int64_t mb = -1;        ///< micro-batch id
  std::int64_t value = 0;      ///< handle: queue wait ns; counter: the value; action span: chunk
  const char* name = nullptr;  ///< span/instant/counter name (null: the tag names it)
  const char* cat = nullptr;   ///< span/instant category
  const char* text = nullptr;  ///< drop: reason; idle span: cause; counter: the arg key
  const type_tag* tag = nullptr;
  std::uint32_t track = 0;     ///< the actor (or GPU stream track) the event is drawn on
  std::uint32_t peer = 0;      ///< send: receiver; handle: sender
  std::int32_t aux = -1;       ///< handle: loop; span: stage (action) or stream (gpu)
  std::int32_t aux2 = -1;      ///< span: planned step (action) or device (gpu)
  std::int32_t depth = -1;     ///< send: receiver's queued messages after the enqueue; handle: before the run
  record_kind kind = record_kind::send;
};

class recorder {
 public:
  recorder();
  ~recorder();

  /// Any thread. Turns recording on or off; records already taken stay.
  void enable(bool on = true) noexcept { on_.store(on, std::memory_order_relaxed); }
  /// Any thread; cheap (a relaxed load).
  bool enabled() const noexcept { return on_.load(std::memory_order_relaxed); }

  /// Any thread: nanoseconds on the recorder clock (steady, origin at construction).
  std::int64_t now() const noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - epoch_).count();
  }
  /// Any thread: a fresh flow id (unique within this recorder).
  std::uint64_t next_flow() noexcept;

  /// Any thread: appends a record to the calling thread's buffer.
  void write(const record& r) noexcept;

  /// Convenience for upper layers: a span on `track` (an actor id, or a GPU stream track).
  void span(std::uint32_t track, const char* cat, const char* name, std::int64_t start_ns, std::int64_t end_ns,
            std::int64_t mb = -1, const char* text = nullptr, std::int32_t aux = -1, std::int32_t aux2 = -1,
            std::int64_t value = 0) noexcept;
  /// A counter sample on `track`.
  void counter(std::uint32_t track, const char* name, const char* key, std::int64_t value) noexcept;

  /// Records taken so far, and records lost because a thread's buffer hit `max_records`.
  std::size_t size() const;
  std::size_t lost() const noexcept { return lost_.load(std::memory_order_relaxed); }
  /// Per-thread record limit (default 8 M records = 512 MiB per thread at most).
  void set_max_records(std::size_t n) noexcept { max_records_ = n; }
  /// Drops all records. Not while other threads record.
  void clear();

  /// All records, merged and sorted by time. Not while other threads record.
  std::vector<record> snapshot() const;

  /// Chrome trace JSON: `traceEvents` from the records; `actors` is the `nerve.actors` array
  /// ({id, name, loop, stage, group}); `extra` is merged into the `nerve` object.
  nlohmann::json to_chrome_trace(const nlohmann::json& actors, const nlohmann::json& extra) const;

 private:
  struct thread_buffer;
  thread_buffer& local() noexcept;

  std::atomic<bool> on_{false};
  std::chrono::steady_clock::time_point epoch_;
  std::size_t max_records_ = std::size_t{8} << 20;
  std::atomic<std::size_t> lost_{0};
  std::atomic<std::uint32_t> next_thread_{0};
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<thread_buffer>> buffers_;
  std::uint64_t instance_;  // distinguishes recorders in the thread-local cache
};

}  // namespace nerve::actors

#pragma once
/// \file
/// `recorder`: records every send, handler run and drop (and events that upper layers add:
/// pipeline idle time and actions, GPU spans) into per-thread buffers, and exports them in
/// the Chrome trace event format (docs/trace-format.md).
///
/// Off, it costs one relaxed atomic load (a predictable branch) per send and per handler
/// run. On, a message costs three reads of a cheap clock (the TSC on x86-64: at the send,
/// and at the start and end of its handler run) and one 72-byte `message_record` appended
/// to the handling thread's own chunk: the send's time and the receiver's mailbox depth
/// travel in the envelope, so a send and its handling are one record, written once, with
/// no lock, no atomic read-modify-write and no allocation except when a 2 MiB chunk fills.
/// Everything else (flow ids, names, nanoseconds, JSON) is worked out at export.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

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
  flow_start,  ///< a flow arrow starts here (upper layers: an enqueuing handler, a GPU span)
  flow_end,    ///< a flow arrow ends here (binds to the enclosing slice)
};

/// One recorded event, as `snapshot()` returns it. Strings are static (string literals or
/// type tags): records never own memory.
struct record {
  std::int64_t ts_ns = 0;      ///< start, recorder clock
  std::int64_t dur_ns = 0;     ///< handle/span: duration
  std::uint64_t flow = 0;      ///< flow id linking a send to its handling (flow_start/flow_end: the arrow)
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

/// One handled message in its compact form: the send and the handler run together.
/// Times are recorder ticks (`recorder::ticks()`), converted to nanoseconds at export.
struct message_record {
  std::int64_t sent = 0;     ///< ticks at the enqueue
  std::int64_t start = 0;    ///< ticks when the handler started
  std::int64_t end = 0;      ///< ticks when it returned
  const type_tag* tag = nullptr;
  std::uint64_t bytes = 0;
  std::int64_t mb = -1;
  actor_id sender = 0;
  actor_id receiver = 0;
  std::int32_t sent_depth = -1;  ///< receiver's queued messages just after the enqueue
  std::int32_t run_depth = -1;   ///< receiver's queued messages when the run ended
  std::uint32_t loop = 0;
};

namespace detail {
struct recorder_buffer;
/// Where a thread appends message records: a cursor into its current chunk. Written only
/// by its thread; read by `snapshot` when no thread records.
struct recorder_chunk_cursor {
  message_record* next = nullptr;
  message_record* end = nullptr;
};
/// The calling thread's buffer in the recorder it wrote to last (one entry: a thread
/// records into one runtime's recorder nearly always; constant-initialised, so reading
/// it is a plain TLS load).
struct recorder_tls {
  std::uint64_t instance = 0;
  recorder_chunk_cursor* cursor = nullptr;
};
inline constinit thread_local recorder_tls tls_last_recorder{};
}  // namespace detail

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
  /// Any thread: the hot-path clock, in ticks (the TSC on x86-64, steady-clock
  /// nanoseconds elsewhere); never 0. Converted to nanoseconds at export, against the
  /// steady clock.
  static std::int64_t ticks() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    return static_cast<std::int64_t>(__rdtsc()) | 1;
#else
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
               .count() |
           1;
#endif
  }
  /// Any thread: `ticks` as nanoseconds on the `now()` clock (for upper layers that time with ticks).
  std::int64_t ns_of_ticks(std::int64_t t) const noexcept;

  /// Any thread: a fresh flow id (unique within this recorder).
  std::uint64_t next_flow() noexcept;

  /// Any thread: appends a handled message (the hot path: no lock, no atomic).
  void write(const message_record& m) noexcept {
    auto& tl = detail::tls_last_recorder;
    if (tl.instance == instance_) [[likely]] {
      auto* c = tl.cursor;
      if (c->next != c->end) [[likely]] {
        *c->next++ = m;
        return;
      }
    }
    write_slow(m);
  }
  /// Any thread: appends a record to the calling thread's buffer (`ts_ns` in nanoseconds).
  void write(const record& r) noexcept { write_other(r, false); }
  /// Same, with `ts_ns` in ticks (converted at export).
  void write_ticks(const record& r) noexcept { write_other(r, true); }

  /// Convenience for upper layers: a span on `track` (an actor id, or a GPU stream track).
  void span(std::uint32_t track, const char* cat, const char* name, std::int64_t start_ns, std::int64_t end_ns,
            std::int64_t mb = -1, const char* text = nullptr, std::int32_t aux = -1, std::int32_t aux2 = -1,
            std::int64_t value = 0) noexcept;
  /// A counter sample on `track`.
  void counter(std::uint32_t track, const char* name, const char* key, std::int64_t value) noexcept;
  /// A flow arrow's start (`s`) or end (`f`) at `ts_ns` on `track`; it binds to the slice
  /// enclosing that time there. `id` from `next_flow()`.
  void flow(record_kind start_or_end, std::uint32_t track, const char* name, std::uint64_t id,
            std::int64_t ts_ns) noexcept;
  /// Names a track that is not an actor (a GPU stream, a stage): `thread_name` metadata at export.
  void name_track(std::uint32_t track, std::string name, long sort_index = -1);

  /// Records taken so far (a handled message counts as its send and its handling), and
  /// records lost because a thread's buffer hit `max_records`.
  std::size_t size() const;
  std::size_t lost() const noexcept { return lost_.load(std::memory_order_relaxed); }
  /// Per-thread record limit (default 8 M records).
  void set_max_records(std::size_t n) noexcept { max_records_ = n; }
  /// Drops all records. Not while other threads record.
  void clear();

  /// All records, merged and sorted by time, times in nanoseconds. Not while other threads record.
  std::vector<record> snapshot() const;

  /// Chrome trace JSON: `traceEvents` from the records; `actors` is the `nerve.actors` array
  /// ({id, name, loop, stage, group}); `extra` is merged into the `nerve` object.
  nlohmann::json to_chrome_trace(const nlohmann::json& actors, const nlohmann::json& extra) const;
  /// Writes `to_chrome_trace(actors, extra)` to `path` (through a temporary file renamed
  /// into place, so a reader never sees half a trace). Throws on I/O errors.
  void write_file(const std::string& path, const nlohmann::json& actors, const nlohmann::json& extra) const;

 private:
  struct named_track {
    std::uint32_t track;
    std::string name;
    long sort_index;
  };
  detail::recorder_buffer& local() noexcept;
  void write_slow(const message_record& m) noexcept;
  void write_other(const record& r, bool in_ticks) noexcept;
  double ns_per_tick() const noexcept;

  std::atomic<bool> on_{false};
  std::chrono::steady_clock::time_point epoch_;
  std::int64_t epoch_ticks_ = 0;  // ticks() read at epoch_
  std::size_t max_records_ = std::size_t{8} << 20;
  std::atomic<std::size_t> lost_{0};
  std::atomic<std::uint32_t> next_thread_{0};
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<detail::recorder_buffer>> buffers_;
  std::vector<named_track> tracks_;  // guarded by mu_
  std::uint64_t instance_;  // distinguishes recorders in the thread-local cache
};

}  // namespace nerve::actors

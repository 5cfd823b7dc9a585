#pragma once
/// \file
/// `recorder`: records every send, handler run and drop (and events that upper layers add:
/// pipeline idle time and actions, GPU spans) into per-thread buffers, and exports them in
/// the Chrome trace event format (docs/trace-format.md).
///
/// Off, it costs one relaxed atomic load (a predictable branch) per send and per handler
/// run. On, a message costs one or two reads of a cheap clock (the TSC on x86-64) and one
/// 48-byte `detail::packed_message` appended to the handling thread's own chunk: the
/// send's time and the receiver's reservation count travel in the envelope, so a send and
/// its handling are one record, written once, with no lock, no atomic read-modify-write
/// and no allocation except when a 2 MiB chunk fills. The clock is read at the end of
/// every handler run (a run's start is the previous run's end within one drain) and at a
/// send, except a send from a handler whose message type's last recorded run took under
/// ~1 µs (`long_run_ticks`): that send is stamped with its handler's start, so it is at
/// most that run's length early and never after its handling (docs/trace.md, "Send
/// times"). Everything else (flow ids, mailbox depths, names, nanoseconds, JSON) is
/// worked out at export.

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
  std::int32_t depth = -1;     ///< send: receiver's queued normal messages after the enqueue (-1: not known)
  record_kind kind = record_kind::send;
};

/// One handled message: the send and the handler run together, as `actor` hands it to
/// `recorder::write`. Times are recorder ticks (`recorder::ticks()`), converted to
/// nanoseconds at export.
struct message_record {
  std::int64_t sent = 0;     ///< ticks at the enqueue
  std::int64_t start = 0;    ///< ticks when the handler started
  std::int64_t end = 0;      ///< ticks when it returned
  const type_tag* tag = nullptr;
  std::uint64_t bytes = 0;
  std::int64_t mb = -1;
  actor_id sender = 0;
  actor_id receiver = 0;
  /// The receiver's normal-lane reservations just after the enqueue (mod 2^32; -1: none).
  std::int64_t reserved = -1;
  /// Which normal message of the receiver this was, counted by its drain (1, 2, ... mod
  /// 2^32; -1: an urgent one). The export works out the mailbox depth at a send from the
  /// two counts: `reserved` less the `taken` of the receiver's last run started before
  /// the send. Reading the drain's count at the send instead would move the drain's cache
  /// line to the sender for every message (actor.hpp), which cost more than the rest of
  /// recording together on two loops.
  std::int64_t taken = -1;
  std::uint32_t loop = 0;
};

/// Handler runs whose message type once took at least this many ticks stamp their sends
/// with a clock read of their own (about 1 µs on a 2 GHz TSC; on the steady-clock
/// fallback, ticks are nanoseconds).
inline constexpr std::int64_t long_run_ticks = 2048;

namespace detail {
/// A `message_record` as a chunk stores it: 48 bytes, where chunks held 72 (at tens of millions
/// of messages a second, the bytes written are much of what recording costs). Times are
/// the end and two 32-bit differences; the two counts are kept modulo 2^24 (the depth is
/// their difference, far below it; 2^24 divides the counts' own 2^32). A record whose
/// fields do not fit (a run or a queue wait over 2^31 ticks, payloads of 4 GiB,
/// micro-batch ids past 2^31, loops past 16,383) is kept whole on a side list instead:
/// nothing is clipped.
struct packed_message {
  std::int64_t end;
  std::int32_t run;   ///< end - start
  std::int32_t wait;  ///< start - sent (a few ticks below 0 when the send's core clock runs ahead)
  const type_tag* tag;
  actor_id sender;
  actor_id receiver;
  std::uint32_t bytes;
  std::int32_t mb;
  /// reserved mod 2^24 (bits 0-23), taken mod 2^24 (bits 24-47), loop (bits 48-61), and
  /// whether each count is set (bits 62, 63): one word, written whole (bit-fields would
  /// read the chunk's cold line before writing it).
  std::uint64_t counts_loop;
};
static_assert(sizeof(packed_message) == 48);
inline constexpr std::int64_t count_modulus = std::int64_t{1} << 24;

/// Packs `m` into `p`; false (and `p` untouched) when a field does not fit.
inline bool pack(packed_message& p, const message_record& m) noexcept {
  const auto run = m.end - m.start, wait = m.start - m.sent;
  constexpr std::int64_t i32 = std::int64_t{1} << 31;
  if (run < -i32 || run >= i32 || wait < -i32 || wait >= i32 || m.bytes > 0xffffffffu || m.mb < -i32 ||
      m.mb >= i32 || m.loop >= (1u << 14)) [[unlikely]]
    return false;
  p.end = m.end;
  p.run = static_cast<std::int32_t>(run);
  p.wait = static_cast<std::int32_t>(wait);
  p.tag = m.tag;
  p.sender = m.sender;
  p.receiver = m.receiver;
  p.bytes = static_cast<std::uint32_t>(m.bytes);
  p.mb = static_cast<std::int32_t>(m.mb);
  constexpr std::uint64_t mask = count_modulus - 1;
  p.counts_loop = (static_cast<std::uint64_t>(m.reserved) & mask) | (static_cast<std::uint64_t>(m.taken) & mask) << 24 |
                  std::uint64_t{m.loop} << 48 | std::uint64_t{m.reserved >= 0} << 62 | std::uint64_t{m.taken >= 0} << 63;
  return true;
}
inline message_record unpack(const packed_message& p) noexcept {
  message_record m;
  m.end = p.end;
  m.start = p.end - p.run;
  m.sent = m.start - p.wait;
  m.tag = p.tag;
  m.bytes = p.bytes;
  m.mb = p.mb;
  m.sender = p.sender;
  m.receiver = p.receiver;
  m.reserved = p.counts_loop >> 62 & 1 ? static_cast<std::int64_t>(p.counts_loop & 0xffffff) : -1;
  m.taken = p.counts_loop >> 63 ? static_cast<std::int64_t>(p.counts_loop >> 24 & 0xffffff) : -1;
  m.loop = static_cast<std::uint32_t>(p.counts_loop >> 48 & 0x3fff);
  return m;
}

/// While a recorded handler runs on this thread: the ticks its sends are stamped with
/// (its start), or 0 when sends read the clock (outside handlers, and in handlers of
/// message types that once ran long). Written only by recorded runs.
inline constinit thread_local std::int64_t tls_send_stamp = 0;
}  // namespace detail

namespace detail {
struct recorder_buffer;
/// Where a thread appends message records: a cursor into its current chunk. Written only
/// by its thread; read by `snapshot` when no thread records.
struct recorder_chunk_cursor {
  packed_message* next = nullptr;
  packed_message* end = nullptr;
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
      if (c->next != c->end && detail::pack(*c->next, m)) [[likely]] {
        ++c->next;
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

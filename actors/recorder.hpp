#pragma once
/// \file
/// `recorder`: records every send, handler run and drop (and events that upper layers add:
/// pipeline idle time and actions, GPU spans) into per-thread buffers, and exports them in
/// the Chrome trace event format (docs/trace-format.md).
///
/// Off, it costs one relaxed atomic load (a predictable branch) per send and per handler
/// run. On, a message costs one 48-byte slot appended to the handling thread's own chunk
/// (`detail::packed_message`: a timed record, or for a run that shares its clock reads, a
/// copy of its envelope's fields), and at most one read of a cheap clock (the TSC on
/// x86-64): the send's time and the receiver's reservation count travel in the envelope,
/// so a send and its handling are one record, written once, with no lock, no atomic
/// read-modify-write and no allocation except when a 2 MiB chunk fills.
///
/// When the clock is read (docs/trace.md, "Handler times" and "Send times"):
/// - A drain reads it when its first recorded run starts; within a drain a run starts
///   where the previous one ended.
/// - A run whose message type's last timed run took ~1 µs or more (`long_run_ticks`) is
///   timed on its own: one read at its end.
/// - Runs of short types share reads (`timing::shared`, the default): up to
///   `shared_group_runs` of them in a row, then one read, at the group's end. Their times
///   are spread evenly over the group's measured span at export; a group that took 1 µs
///   or more, less what the loop's short runs take for each of its other runs (measured
///   by the last runs timed one by one), makes the loop time its next runs one by one, so
///   long runs are caught and timed. One clock read is a good part of a whole delivery's
///   other work (docs/trace.md, "What it costs"); `timing::exact` reads it after every run.
/// - A send from a handler of a short type is stamped with its run's start (for a run in
///   a group: the group's start and the run's place in it, which the export turns into
///   that run's start): early by at most the run's length, never after its handling. The
///   stamp is the loop's clock as the drain left it (`loop_state::run_clock`), so the
///   runtime's own sends between runs (a stop's notices) take the last run's end. Other
///   sends read the clock.
/// Everything else (flow ids, mailbox depths, names, nanoseconds, JSON) is worked out at
/// export.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <limits>
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
  std::int32_t aux = -1;       ///< handle: loop; span: stage (action) or stream (gpu); counter: id; flow_start/flow_end: `bound_to_message` when bound (`recorder::bound_flow`)
  std::int32_t aux2 = -1;      ///< span: planned step (action) or device (gpu); handle: runs timed together (-1: alone)
  std::int32_t depth = -1;     ///< send: receiver's queued normal messages after the enqueue (-1: not known)
  record_kind kind = record_kind::send;
};

/// `record::aux` of a flow start or end that binds to a message (`recorder::bound_flow`).
inline constexpr std::int32_t bound_to_message = 1;

/// One handled message: the send and the handler run together, as `actor` hands a timed
/// run that does not pack (or meets a full chunk) to `recorder::write_slow`, and as the
/// export unpacks every slot. Times are recorder ticks (`recorder::ticks()`), converted to
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
  /// How many runs shared the clock reads that timed this one (0: timed on its own).
  std::uint32_t shared = 0;
  /// The send was stamped by the `sent_run`-th run (from 0) of a group of its sender's
  /// drain that started at `sent`; the export moves it to that run's start.
  std::uint32_t sent_run = 0;
};

/// Handler runs whose message type once took at least this many ticks stamp their sends
/// with a clock read of their own (about 1 µs on a 2 GHz TSC; on the steady-clock
/// fallback, ticks are nanoseconds).
inline constexpr std::int64_t long_run_ticks = 2048;
/// `timing::shared`: at most this many short runs in a row share a clock read.
inline constexpr std::uint32_t shared_group_runs = 8;

namespace detail {
/// A chunk holds 48-byte slots of three kinds, told apart by their first word (`head`):
/// - a *timed* record (`head` is the tag's address plus 1): a handled message with its times;
/// - an *image* (`head` is the tag's address): a run that shares its clock reads with the
///   runs around it (`timing::shared`): the bytes of its envelope from `tag` to
///   `sent_ticks`, copied whole, and the receiver and the drain's count in the envelope's
///   padding (`message_image`);
/// - a *group* record (`head` is 0): the span of the images its receiver's drain wrote
///   since its last group record, the loop, and the drain's count at its last run.
/// Type tags are 8-aligned, so their addresses never have the low bit set.
///
/// A timed record: the end and two 32-bit differences; the two counts are kept modulo
/// 2^24 (the depth is their difference, far below it; 2^24 divides the counts' own
/// 2^32). A record whose fields do not fit (a run or a queue wait over 2^31 ticks,
/// payloads of 4 GiB, micro-batch ids past 2^31, loops past 2,047) is kept whole on a side
/// list instead: nothing is clipped.
struct packed_message {
  std::uint64_t head;
  std::int64_t end;
  std::int32_t run;   ///< end - start
  std::int32_t wait;  ///< start - sent (a few ticks below 0 when the send's core clock runs ahead)
  actor_id sender;
  actor_id receiver;
  std::uint32_t bytes;
  std::int32_t mb;
  /// reserved mod 2^24 (bits 0-23), taken mod 2^24 (bits 24-47), loop (bits 48-58), the
  /// send's run in its group (bits 59-61), and whether each count is set (bits 62, 63):
  /// one word, written whole (bit-fields would read the chunk's cold line before writing it).
  std::uint64_t counts_loop;
};
static_assert(sizeof(packed_message) == 48);
static_assert(alignof(type_tag) >= 2, "a tag's low address bit marks timed records");
inline constexpr std::int64_t count_modulus = std::int64_t{1} << 24;

/// An image: what a shared run's slot holds. The fields mirror `envelope` from `tag` to
/// `sent_ticks` (checked below), so the hot path fills the slot with one 48-byte copy
/// instead of packing fields one by one (that took about 40 instructions a message);
/// `taken8` and `receiver` lie in the envelope's padding and are written after the copy.
/// The loop and the times come from the group record that follows, and so does the rest
/// of the drain's count: a group's runs lie within 8 counts of its last.
struct message_image {
  const type_tag* tag;
  actor_id sender;
  std::uint32_t reserved;  ///< the envelope's `sent_reserved`
  lane where;
  bool counted;            ///< the envelope's `sent_counted`
  std::uint8_t sent_run;
  std::uint8_t taken8;     ///< the drain's normal-lane count at this run, mod 256
  actor_id receiver;
  std::int64_t mb;
  std::uint64_t bytes;
  std::int64_t sent;       ///< the envelope's `sent_ticks`
};
static_assert(sizeof(message_image) == sizeof(packed_message));
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winvalid-offsetof"  // envelope is polymorphic; its data members lie flat all the same
#define NERVE_IMAGE_FIELD(env, img) \
  static_assert(offsetof(envelope, env) - offsetof(envelope, tag) == offsetof(message_image, img))
NERVE_IMAGE_FIELD(sender, sender);
NERVE_IMAGE_FIELD(sent_reserved, reserved);
NERVE_IMAGE_FIELD(where, where);
NERVE_IMAGE_FIELD(sent_counted, counted);
NERVE_IMAGE_FIELD(sent_run, sent_run);
NERVE_IMAGE_FIELD(micro_batch, mb);
NERVE_IMAGE_FIELD(bytes, bytes);
NERVE_IMAGE_FIELD(sent_ticks, sent);
#undef NERVE_IMAGE_FIELD
static_assert(offsetof(envelope, sent_run) + 1 == offsetof(envelope, tag) + offsetof(message_image, taken8) &&
                  offsetof(envelope, tag) + offsetof(message_image, receiver) + 4 <= offsetof(envelope, micro_batch),
              "an image's `taken8` and `receiver` lie in the envelope's padding");
#pragma GCC diagnostic pop

/// Writes `e`'s image into slot `p`: handled by `receiver`, whose drain's normal-lane
/// count was `taken` then.
inline void copy_image(packed_message* p, const envelope& e, actor_id receiver, std::uint32_t taken) noexcept {
  std::memcpy(static_cast<void*>(p), &e.tag, sizeof(message_image));
  auto* bytes = reinterpret_cast<unsigned char*>(p);
  bytes[offsetof(message_image, taken8)] = static_cast<unsigned char>(taken);
  std::memcpy(bytes + offsetof(message_image, receiver), &receiver, sizeof receiver);
}

/// Whether a handled message packs as a timed record with these times (a run and a queue
/// wait in ticks); when it does not, it goes whole to the side list.
inline constexpr std::uint32_t max_packed_loops = 1u << 11;
inline bool fits(std::int64_t run, std::int64_t wait, std::uint64_t bytes, std::int64_t mb,
                 std::uint32_t loop) noexcept {
  constexpr std::int64_t i32 = std::int64_t{1} << 31;
  return run >= -i32 && run < i32 && wait >= -i32 && wait < i32 && bytes <= 0xffffffffu && mb >= -i32 && mb < i32 &&
         loop < max_packed_loops;
}
/// The counts, the loop and the send's run as one word (counts of -1: not set).
inline std::uint64_t pack_counts(std::int64_t reserved, std::int64_t taken, std::uint32_t loop,
                                 std::uint32_t sent_run) noexcept {
  constexpr std::uint64_t mask = count_modulus - 1;
  static_assert(shared_group_runs <= 8, "the send's run takes 3 bits");
  return (reserved >= 0 ? (static_cast<std::uint64_t>(reserved) & mask) | std::uint64_t{1} << 62 : 0) |
         (taken >= 0 ? (static_cast<std::uint64_t>(taken) & mask) << 24 | std::uint64_t{1} << 63 : 0) |
         std::uint64_t{loop} << 48 | std::uint64_t{sent_run & 7} << 59;
}

/// What a timed record keeps of a handled message besides its times.
struct message_fields {
  const type_tag* tag;
  actor_id sender;
  actor_id receiver;
  std::uint64_t bytes;
  std::int64_t mb;
  std::int64_t reserved;
  std::int64_t taken;
  std::uint32_t loop;
  std::uint32_t sent_run;
};
inline message_fields fields_of(const message_record& m) noexcept {
  return {m.tag, m.sender, m.receiver, m.bytes, m.mb, m.reserved, m.taken, m.loop, m.sent_run};
}

/// A timed record (`fits` holds). Every field is written, whole (the slot is fresh memory).
inline void pack_timed(packed_message& p, std::int64_t sent, std::int64_t start, std::int64_t end,
                       const message_fields& f) noexcept {
  p.head = reinterpret_cast<std::uintptr_t>(f.tag) | 1;
  p.end = end;
  p.run = static_cast<std::int32_t>(end - start);
  p.wait = static_cast<std::int32_t>(start - sent);
  p.sender = f.sender;
  p.receiver = f.receiver;
  p.bytes = static_cast<std::uint32_t>(f.bytes);
  p.mb = static_cast<std::int32_t>(f.mb);
  p.counts_loop = pack_counts(f.reserved, f.taken, f.loop, f.sent_run);
}
/// Packs `m` into `p`; false (and `p` untouched) when a field does not fit.
inline bool pack(packed_message& p, const message_record& m) noexcept {
  if (!fits(m.end - m.start, m.start - m.sent, m.bytes, m.mb, m.loop)) return false;
  pack_timed(p, m.sent, m.start, m.end, fields_of(m));
  return true;
}
/// What a group record holds besides `runs` and `receiver`.
struct group_fields {
  std::uint32_t loop;
  std::int64_t from;    ///< ticks: the group's first run starts
  std::int64_t to;      ///< ticks: its last run ends
  std::uint32_t taken;  ///< the drain's normal-lane count at its last run (mod 2^32)
};
/// The group record that times the `runs` images `receiver`'s drain wrote since its last
/// group record: they ran one after another on `g.loop` from `g.from` to `g.to`.
inline void pack_group(packed_message& p, actor_id receiver, std::uint32_t runs, const group_fields& g) noexcept {
  p.head = 0;
  p.end = g.to;
  p.run = 0;
  p.wait = 0;
  p.sender = runs;
  p.receiver = receiver;
  p.bytes = g.loop;
  p.mb = static_cast<std::int32_t>(g.taken);
  p.counts_loop = static_cast<std::uint64_t>(g.from);
}
inline group_fields group_of(const packed_message& p) noexcept {
  return {p.bytes, static_cast<std::int64_t>(p.counts_loop), p.end, static_cast<std::uint32_t>(p.mb)};
}

/// What a slot holds.
enum class slot_kind : std::uint8_t { timed, image, group };
inline slot_kind kind_of(const packed_message& p) noexcept {
  return p.head == 0 ? slot_kind::group : (p.head & 1) != 0 ? slot_kind::timed : slot_kind::image;
}
/// A timed record as a `message_record`.
inline message_record unpack(const packed_message& p) noexcept {
  message_record m;
  m.end = p.end;
  m.start = p.end - p.run;
  m.sent = m.start - p.wait;
  m.tag = reinterpret_cast<const type_tag*>(p.head & ~std::uint64_t{1});
  m.bytes = p.bytes;
  m.mb = p.mb;
  m.sender = p.sender;
  m.receiver = p.receiver;
  m.reserved = p.counts_loop >> 62 & 1 ? static_cast<std::int64_t>(p.counts_loop & 0xffffff) : -1;
  m.taken = p.counts_loop >> 63 ? static_cast<std::int64_t>(p.counts_loop >> 24 & 0xffffff) : -1;
  m.loop = static_cast<std::uint32_t>(p.counts_loop >> 48 & (max_packed_loops - 1));
  m.sent_run = static_cast<std::uint32_t>(p.counts_loop >> 59 & 7);
  return m;
}
/// An image as a `message_record`: everything but its loop and times (its group's); its
/// `taken` holds the count mod 256 (-1: an urgent message) until its group completes it.
inline message_record unpack_image(const packed_message& p) noexcept {
  message_image i;
  std::memcpy(&i, &p, sizeof i);
  message_record m;
  m.sent = i.sent;
  m.tag = i.tag;
  m.bytes = i.bytes;
  m.mb = i.mb;
  m.sender = i.sender;
  m.receiver = i.receiver;
  m.reserved = i.counted ? static_cast<std::int64_t>(i.reserved & (count_modulus - 1)) : -1;
  m.taken = i.where == lane::normal ? std::int64_t{i.taken8} : -1;
  m.sent_run = i.sent_run;
  return m;
}
}  // namespace detail

namespace detail {
struct recorder_buffer;
/// Where a thread appends message records: a cursor into its current chunk. Written only
/// by its thread; read by `snapshot` when no thread records.
struct recorder_chunk_cursor {
  packed_message* next = nullptr;
  packed_message* end = nullptr;
  std::size_t groups = 0;  ///< group records among those written (they are not messages)
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

/// Writes `text` to `path` through a temporary file in the same folder renamed into place,
/// so a reader never sees half a file: follows symlinks to the file they name, replaces only
/// a regular file and keeps its permission bits, and leaves no temporary behind when a write
/// fails. Throws `std::runtime_error` naming the path and the reason. Any thread.
void write_file_atomically(const std::string& path, std::string_view text, std::string_view what = "trace file");

class recorder {
 public:
  /// How handler runs are timed (see the file comment).
  enum class timing : std::uint8_t {
    shared,  ///< short runs in a row share a clock read (default)
    exact,   ///< a clock read after every run
  };

  recorder();
  ~recorder();

  /// Any thread. Turns recording on or off; records already taken stay.
  void enable(bool on = true) noexcept {
    if (on) mode_.fetch_or(mode_on, std::memory_order_relaxed);
    else mode_.fetch_and(static_cast<std::uint8_t>(~mode_on), std::memory_order_relaxed);
  }
  /// Any thread; cheap (a relaxed load).
  bool enabled() const noexcept { return (mode() & mode_on) != 0; }
  /// Any thread: `mode_on` and `mode_exact` in one load (the drain's hot path).
  std::uint8_t mode() const noexcept { return mode_.load(std::memory_order_relaxed); }
  static constexpr std::uint8_t mode_on = 1, mode_exact = 2;
  /// Any thread; takes effect at the next run of each loop.
  void set_timing(timing t) noexcept {
    if (t == timing::exact) mode_.fetch_or(mode_exact, std::memory_order_relaxed);
    else mode_.fetch_and(static_cast<std::uint8_t>(~mode_exact), std::memory_order_relaxed);
  }
  timing get_timing() const noexcept { return (mode() & mode_exact) != 0 ? timing::exact : timing::shared; }
  /// Any thread: a run this long or longer (ticks; default `long_run_ticks`) is long: its
  /// type's next runs are timed alone, and a group that took this long has the loop time
  /// its next runs alone. Tests raise it to make grouping independent of the machine's speed.
  void set_long_run(std::int64_t ticks) noexcept { long_run_.store(ticks, std::memory_order_relaxed); }
  std::int64_t long_run() const noexcept { return long_run_.load(std::memory_order_relaxed); }

  /// Any thread: nanoseconds on the recorder clock (steady, origin at construction).
  std::int64_t now() const noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - epoch_).count();
  }
  /// Any thread: the recorder clock's origin as `std::chrono::steady_clock` nanoseconds
  /// since its epoch (`now()` + `origin_ns()` is the steady clock), for aligning the traces
  /// of several processes (bus/mpi/trace.hpp).
  std::int64_t origin_ns() const noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(epoch_.time_since_epoch()).count();
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

  /// Any thread: the calling thread's cursor in this recorder (its buffer is made on first
  /// use). A drain holds it for its runs (`write_image`, `slot`, `write_group`): one
  /// lookup a drain, not one a message.
  detail::recorder_chunk_cursor* cursor() noexcept {
    auto& tl = detail::tls_last_recorder;
    if (tl.instance == instance_) [[likely]]
      return tl.cursor;
    return cursor_slow();
  }
  /// Any thread, through its own `cursor()`: appends a run timed by the group record that
  /// follows: `e`'s image, handled by `receiver` at the drain's normal-lane count `taken`
  /// (detail::message_image). No lock, no atomic.
  void write_image(detail::recorder_chunk_cursor* c, const envelope& e, actor_id receiver,
                   std::uint32_t taken) noexcept {
    if (c->next != c->end) [[likely]]
      detail::copy_image(c->next++, e, receiver, taken);
    else
      write_image_slow(e, receiver, taken);
  }
  /// Any thread, through its own `cursor()`: the next free slot, or nullptr (then
  /// `write_slow` takes the record). The caller fills it whole (`detail::pack_timed` when
  /// `detail::fits` holds) from what it has at hand: no `message_record` in between, which
  /// the compiler builds in memory for the slow path's sake (that cost about a fifth of
  /// what a recorded message cost).
  static detail::packed_message* slot(detail::recorder_chunk_cursor* c) noexcept {
    return c->next != c->end ? c->next++ : nullptr;
  }
  /// The slow ways: a new chunk, the side list (a record that does not pack), the limit.
  void write_slow(const message_record& m) noexcept;
  void write_image_slow(const envelope& e, actor_id receiver, std::uint32_t taken) noexcept;

  /// Any thread, through its own `cursor()`: times the `runs` images `receiver`'s drain
  /// wrote on this thread since its last group record (detail::pack_group).
  void write_group(detail::recorder_chunk_cursor* c, actor_id receiver, std::uint32_t runs,
                   const detail::group_fields& g) noexcept {
    if (c->next != c->end) [[likely]] {
      detail::pack_group(*c->next++, receiver, runs, g);
      ++c->groups;
      return;
    }
    write_group_slow(receiver, runs, g);
  }
  /// Any thread: appends a record to the calling thread's buffer (`ts_ns` in nanoseconds).
  void write(const record& r) noexcept { write_other(r, false); }
  /// Same, with `ts_ns` in ticks (converted at export).
  void write_ticks(const record& r) noexcept { write_other(r, true); }

  /// Convenience for upper layers: a span on `track` (an actor id, or a GPU stream track).
  void span(std::uint32_t track, const char* cat, const char* name, std::int64_t start_ns, std::int64_t end_ns,
            std::int64_t mb = -1, const char* text = nullptr, std::int32_t aux = -1, std::int32_t aux2 = -1,
            std::int64_t value = 0) noexcept;
  /// A counter sample on `track`. `id` ≥ 0 is exported as the event's `id`, which keys the
  /// counter's track in Perfetto (several counters of one name on one actor: one per edge).
  void counter(std::uint32_t track, const char* name, const char* key, std::int64_t value,
               std::int32_t id = -1) noexcept;
  /// A copy of `text` that lives as long as the recorder, for the names that records point
  /// to (`counter`'s `name`). Any thread; takes a lock: call at wiring time, not per record.
  const char* intern(std::string_view text);
  /// A flow arrow's start (`s`) or end (`f`) at `ts_ns` on `track`; it binds to the slice
  /// enclosing that time there. `id` from `next_flow()`.
  void flow(record_kind start_or_end, std::uint32_t track, const char* name, std::uint64_t id,
            std::int64_t ts_ns) noexcept;
  /// Any thread: a flow arrow's start or end bound to a message between `track` and
  /// `peer` (the bus across processes: an arrow from a rank's sending handler to the
  /// handler that runs the value on another rank). A start binds to the next message
  /// `track` sends `peer` (exported at that send's time), an end to the next message
  /// `peer` sends `track` (exported at its handling's start, so it binds to that handler
  /// run): the k-th bound start (or end) of a pair, in time order, goes to the k-th
  /// recorded message of that pair in handling order. Write one for *every* message of
  /// the pair sent while recording is on, right after sending it; `id` 0 holds a place in
  /// that order and is not exported. With no recorded message to bind to (fewer were
  /// recorded, or the recorder was toggled during the traffic), it stays at `ts_ns`.
  /// `tag` names the arrow (its message kind).
  void bound_flow(record_kind start_or_end, std::uint32_t track, std::uint32_t peer, const type_tag* tag,
                  std::uint64_t id, std::int64_t ts_ns) noexcept;
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
  detail::recorder_chunk_cursor* cursor_slow() noexcept;
  void write_group_slow(actor_id receiver, std::uint32_t runs, const detail::group_fields& g) noexcept;
  detail::packed_message* next_slot(detail::recorder_buffer& b, bool message = true) noexcept;
  void write_other(const record& r, bool in_ticks) noexcept;
  double ns_per_tick() const noexcept;

  std::atomic<std::uint8_t> mode_{0};  // mode_on | mode_exact
  std::atomic<std::int64_t> long_run_{long_run_ticks};
  std::chrono::steady_clock::time_point epoch_;
  std::int64_t epoch_ticks_ = 0;  // ticks() read at epoch_
  std::size_t max_records_ = std::size_t{8} << 20;
  std::atomic<std::size_t> lost_{0};
  std::atomic<std::uint32_t> next_thread_{0};
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<detail::recorder_buffer>> buffers_;
  std::vector<named_track> tracks_;  // guarded by mu_
  std::deque<std::string> interned_;  // guarded by mu_; a deque never moves its strings
  std::uint64_t instance_;  // distinguishes recorders in the thread-local cache
};

}  // namespace nerve::actors

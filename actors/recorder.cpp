#include "actors/recorder.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include <nlohmann/json.hpp>

namespace nerve::actors {

namespace {
// Message records go to 2 MiB chunks, aligned and marked for transparent huge pages: on a
// VM every fresh 4 KiB page costs a fault of several microseconds; a huge page takes one
// fault per 2 MiB. The chunk is left uninitialised (`packed_message` is trivial, so writing
// into malloc'd storage is fine); the kernel hands it over zeroed anyway.
constexpr std::size_t chunk_bytes = std::size_t{2} << 20;
constexpr std::size_t chunk_records = chunk_bytes / sizeof(detail::packed_message);

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
struct chunk_free {
  void operator()(detail::packed_message* p) const noexcept {
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
};
using chunk_ptr = std::unique_ptr<detail::packed_message[], chunk_free>;
chunk_ptr new_chunk() {
  {
    auto& pl = pool();
    std::lock_guard lk(pl.mu);
    if (!pl.free.empty()) {
      void* p = pl.free.back();
      pl.free.pop_back();
      return chunk_ptr(static_cast<detail::packed_message*>(p));
    }
  }
  void* p = std::aligned_alloc(chunk_bytes, chunk_bytes);
  if (!p) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  (void)madvise(p, chunk_bytes, MADV_HUGEPAGE);  // advice only: without THP it is a no-op
#endif
  return chunk_ptr(static_cast<detail::packed_message*>(p));
}
std::atomic<std::uint64_t> next_instance{1};

struct cache_entry {
  std::uint64_t instance = 0;
  detail::recorder_buffer* buffer = nullptr;
};
// A thread records into few recorders; behind the one-entry cache of the header, a tiny
// direct cache avoids the lock when a thread alternates between two.
thread_local cache_entry tl_cache[4];
thread_local unsigned tl_cache_next = 0;

std::int64_t steady_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// A pair of readings of the tick clock and the steady clock taken as close together as
/// the machine allows (the narrowest of a few tries; a preempted try is discarded).
struct clock_pair {
  std::int64_t ticks = 0;
  std::int64_t ns = 0;
};
clock_pair read_pair() noexcept {
  clock_pair best;
  std::int64_t width = -1;
  for (int i = 0; i < 5; ++i) {
    const auto a = recorder::ticks();
    const auto ns = steady_ns();
    const auto b = recorder::ticks();
    if (width < 0 || b - a < width) {
      width = b - a;
      best = {a + (b - a) / 2, ns};
    }
  }
  return best;
}
/// The first pair this process read: the longer the interval to a later pair, the more
/// exact the tick rate measured over it.
const clock_pair& process_pair() noexcept {
  static const clock_pair p = read_pair();
  return p;
}
}  // namespace

namespace detail {
struct stored_record {
  record r;
  bool in_ticks = false;  // r.ts_ns holds ticks, converted at export
};
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
}  // namespace detail

using detail::recorder_buffer;

namespace {
// The groups a snapshot met, for the sends their runs made (stamped with the group's
// start and the run's place in it): where each run started, as exported.
struct group_starts {
  struct group {
    actor_id actor;
    std::int64_t from;
    std::int64_t to;
    std::size_t first;  // into starts
    std::size_t runs;
  };
  std::vector<group> groups;
  std::vector<std::int64_t> starts;
  void sort() {
    std::sort(groups.begin(), groups.end(),
              [](const group& a, const group& b) { return a.actor != b.actor ? a.actor < b.actor : a.from < b.from; });
  }
  // The start of the `run`-th run of `actor`'s group that started at `from`: its end for
  // a send made after the group's last run (by the runtime, between runs), `from` itself
  // when there is no such group (its record lost to the limit).
  std::int64_t start_of(actor_id actor, std::int64_t from, std::uint32_t run) const {
    auto it = std::lower_bound(groups.begin(), groups.end(), std::pair{actor, from}, [](const group& g, const auto& key) {
      return g.actor != key.first ? g.actor < key.first : g.from < key.second;
    });
    if (it == groups.end() || it->actor != actor || it->from != from) return from;
    return run < it->runs ? starts[it->first + run] : it->to;
  }
};

// Times the images of `group`'s receiver among `pending` (indices into `out`, in the
// order they ran) and takes them off the list: the group's measured span split evenly, in
// order, none before its own send (a send stamped on another core may come a little after
// the span's even share says the run began). Images of other receivers stay: a drain
// nested in a handler (or the one it nested in) closes its groups on its own. Each image's
// drain count, kept mod 256, is completed from the group's (at its last run, at most 8
// counts on).
void time_group(std::vector<message_record>& out, std::vector<std::size_t>& pending,
                const detail::packed_message& group, group_starts& seen) {
  const auto receiver = group.receiver;
  const auto g = detail::group_of(group);
  std::int64_t n = 0;
  for (auto i : pending) n += out[i].receiver == receiver;
  seen.groups.push_back({receiver, g.from, g.to, seen.starts.size(), static_cast<std::size_t>(n)});
  if (n == 0) return;  // its runs' records lost to the limit
  std::int64_t k = 0, prev = g.from;
  const std::int64_t d = g.to - g.from;
  auto at = [&](std::int64_t j) { return g.from + d / n * j + d % n * j / n; };  // from + d*j/n, no overflow
  auto keep = pending.begin();
  for (auto i : pending) {
    auto& m = out[i];
    if (m.receiver != receiver) {
      *keep++ = i;
      continue;
    }
    m.loop = g.loop;
    m.start = std::max({at(k), prev, m.sent});
    m.end = std::max(at(++k), m.start);
    m.shared = group.sender;
    if (m.taken >= 0)
      m.taken = static_cast<std::int64_t>((g.taken - ((g.taken - static_cast<std::uint32_t>(m.taken)) & 0xffu)) &
                                          (detail::count_modulus - 1));
    seen.starts.push_back(m.start);
    prev = m.end;
  }
  pending.erase(keep, pending.end());
}

// A thread's handled messages in the order it wrote them, shared runs timed by their groups.
void unpack_buffer(const recorder_buffer& b, std::vector<message_record>& out, group_starts& seen) {
  std::vector<std::size_t> pending;
  for (std::size_t c = 0; c < b.chunks.size(); ++c) {
    const std::size_t n =
        c + 1 < b.chunks.size() ? b.filled[c] : static_cast<std::size_t>(b.cursor.next - b.chunks[c].get());
    for (std::size_t i = 0; i < n; ++i) {
      const auto& p = b.chunks[c][i];
      switch (detail::kind_of(p)) {
        case detail::slot_kind::group:
          time_group(out, pending, p, seen);
          break;
        case detail::slot_kind::timed:
          out.push_back(detail::unpack(p));
          break;
        case detail::slot_kind::image:
          out.push_back(detail::unpack_image(p));
          pending.push_back(out.size() - 1);
          break;
      }
    }
  }
  // Images whose group record was not written (the record limit): at their send, their
  // drain count unknown.
  for (auto i : pending) {
    out[i].start = out[i].end = out[i].sent;
    out[i].taken = -1;
  }
  out.insert(out.end(), b.wide.begin(), b.wide.end());
}
}  // namespace

recorder::recorder() : instance_(next_instance.fetch_add(1)) {
  (void)process_pair();
  const auto p = read_pair();
  epoch_ = std::chrono::steady_clock::time_point(std::chrono::nanoseconds(p.ns));
  epoch_ticks_ = p.ticks;
}
recorder::~recorder() {
  // A thread's one-entry cache may still name this recorder; instances are never reused,
  // so a stale entry never matches again.
}

recorder_buffer& recorder::local() noexcept {
  auto& tl = detail::tls_last_recorder;
  for (auto& c : tl_cache)
    if (c.instance == instance_) {
      tl = {instance_, &c.buffer->cursor};
      return *c.buffer;
    }
  std::lock_guard lk(mu_);
  recorder_buffer* found = nullptr;
  for (auto& b : buffers_)
    if (b->thread == std::this_thread::get_id()) found = b.get();
  if (!found) {
    buffers_.push_back(std::make_unique<recorder_buffer>());
    found = buffers_.back().get();
    found->thread = std::this_thread::get_id();
    found->index = next_thread_.fetch_add(1);
  }
  tl_cache[tl_cache_next++ % 4] = {instance_, found};
  tl = {instance_, &found->cursor};
  return *found;
}

std::uint64_t recorder::next_flow() noexcept {
  auto& b = local();
  return (std::uint64_t{b.index} + 1) << 40 | ++b.flows;
}

detail::packed_message* recorder::next_slot(recorder_buffer& b, bool message) noexcept {
  // A group record lost is no message lost: its runs show at their send times instead.
  const auto lose = [&] {
    if (message) lost_.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  };
  if (b.messages() >= max_records_) return lose();
  if (b.cursor.next == b.cursor.end) {
    const std::size_t room = max_records_ - b.messages();
    const std::size_t filled = b.filled.size();
    try {
      if (!b.chunks.empty()) b.filled.push_back(static_cast<std::size_t>(b.cursor.next - b.chunks.back().get()));
      b.chunks.push_back(new_chunk());
    } catch (...) {
      b.filled.resize(filled);
      return lose();
    }
    auto* first = b.chunks.back().get();
    b.cursor.next = first;
    b.cursor.end = first + std::min(chunk_records, room);
  }
  return b.cursor.next++;
}

void recorder::write_slow(const message_record& m) noexcept {
  auto& b = local();
  detail::packed_message p;
  if (!detail::pack(p, m)) {
    if (b.messages() >= max_records_) {
      lost_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    try {
      b.wide.push_back(m);
      if (b.cursor.end != b.cursor.next) --b.cursor.end;  // the limit counts both kinds
    } catch (...) {
      lost_.fetch_add(1, std::memory_order_relaxed);
    }
    return;
  }
  if (auto* slot = next_slot(b)) *slot = p;
}

detail::recorder_chunk_cursor* recorder::cursor_slow() noexcept { return &local().cursor; }

void recorder::write_image_slow(const envelope& e, actor_id receiver, std::uint32_t taken) noexcept {
  if (auto* slot = next_slot(local())) detail::copy_image(slot, e, receiver, taken);
}

void recorder::write_group_slow(actor_id receiver, std::uint32_t runs, const detail::group_fields& g) noexcept {
  auto& b = local();
  if (auto* slot = next_slot(b, false)) {
    detail::pack_group(*slot, receiver, runs, g);
    ++b.cursor.groups;
  }
}

void recorder::write_other(const record& r, bool in_ticks) noexcept {
  auto& b = local();
  if (b.others.size() >= max_records_) {
    lost_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  try {
    b.others.push_back({r, in_ticks});
  } catch (...) {
    lost_.fetch_add(1, std::memory_order_relaxed);
  }
}

void recorder::span(std::uint32_t track, const char* cat, const char* name, std::int64_t start_ns,
                    std::int64_t end_ns, std::int64_t mb, const char* text, std::int32_t aux, std::int32_t aux2,
                    std::int64_t value) noexcept {
  record r;
  r.kind = record_kind::span;
  r.ts_ns = start_ns;
  r.dur_ns = end_ns - start_ns;
  r.track = track;
  r.cat = cat;
  r.name = name;
  r.mb = mb;
  r.text = text;
  r.aux = aux;
  r.aux2 = aux2;
  r.value = value;
  write(r);
}

void recorder::counter(std::uint32_t track, const char* name, const char* key, std::int64_t value,
                       std::int32_t id) noexcept {
  record r;
  r.kind = record_kind::counter;
  r.ts_ns = now();
  r.track = track;
  r.name = name;
  r.text = key;
  r.value = value;
  r.aux = id;
  write(r);
}

const char* recorder::intern(std::string_view text) {
  std::lock_guard lk(mu_);
  for (auto& s : interned_)
    if (s == text) return s.c_str();
  return interned_.emplace_back(text).c_str();
}

void recorder::flow(record_kind start_or_end, std::uint32_t track, const char* name, std::uint64_t id,
                    std::int64_t ts_ns) noexcept {
  record r;
  r.kind = start_or_end;
  r.ts_ns = ts_ns;
  r.track = track;
  r.name = name;
  r.flow = id;
  write(r);
}

void recorder::bound_flow(record_kind start_or_end, std::uint32_t track, std::uint32_t peer, const type_tag* tag,
                          std::uint64_t id, std::int64_t ts_ns) noexcept {
  record r;
  r.kind = start_or_end;
  r.ts_ns = ts_ns;
  r.track = track;
  r.peer = peer;
  r.tag = tag;
  r.flow = id;
  r.aux = bound_to_message;
  write(r);
}

void recorder::name_track(std::uint32_t track, std::string name, long sort_index) {
  std::lock_guard lk(mu_);
  for (auto& t : tracks_)
    if (t.track == track) {
      t.name = std::move(name);
      t.sort_index = sort_index;
      return;
    }
  tracks_.push_back({track, std::move(name), sort_index});
}

std::size_t recorder::size() const {
  std::lock_guard lk(mu_);
  std::size_t n = 0;
  for (auto& b : buffers_) n += 2 * b->messages() + b->others.size();
  return n;
}

void recorder::clear() {
  std::lock_guard lk(mu_);
  for (auto& b : buffers_) {
    b->chunks.clear();
    b->cursor = {};
    b->filled.clear();
    b->wide.clear();
    b->others.clear();
  }
  lost_.store(0);
}

double recorder::ns_per_tick() const noexcept {
#if defined(__x86_64__) || defined(__i386__)
  // The rate over the longest interval at hand: from the first pair this process read to
  // now. Under 2 ms, wait until 2 ms have passed (a read pair is exact to a few tens of
  // ns, so the rate is then exact to about 1e-5: 10 µs over a second of trace).
  const auto& p0 = process_pair();
  auto p1 = read_pair();
  while (p1.ns - p0.ns < 2'000'000) {
    std::this_thread::yield();
    p1 = read_pair();
  }
  if (p1.ticks <= p0.ticks) return 1.0;
  return static_cast<double>(p1.ns - p0.ns) / static_cast<double>(p1.ticks - p0.ticks);
#else
  return 1.0;  // ticks are steady-clock nanoseconds
#endif
}

std::int64_t recorder::ns_of_ticks(std::int64_t t) const noexcept {
  return static_cast<std::int64_t>(static_cast<double>(t - epoch_ticks_) * ns_per_tick());
}

std::vector<record> recorder::snapshot() const {
  const double k = ns_per_tick();
  auto ns = [&](std::int64_t t) { return static_cast<std::int64_t>(static_cast<double>(t - epoch_ticks_) * k); };
  auto span_ns = [&](std::int64_t d) { return static_cast<std::int64_t>(static_cast<double>(d) * k); };
  std::vector<record> out;
  std::lock_guard lk(mu_);
  std::size_t n = 0;
  for (auto& b : buffers_) n += 2 * b->messages() + b->others.size();
  out.reserve(n);
  // Handled messages first, unpacked, for the depth at each send: the receiver's
  // reservations just after it (carried from the send) less the normal messages its
  // drain had taken by then (the `taken` of its last run started before the send).
  std::vector<message_record> msgs;
  {
    std::size_t m = 0;
    for (auto& b : buffers_) m += b->messages();
    msgs.reserve(m);
  }
  group_starts groups;
  for (auto& b : buffers_) unpack_buffer(*b, msgs, groups);
  // A send stamped by a run in a group carries the group's start: it moves to the start
  // of the run that made it, as exported, so its arrow leaves that run's slice. Each side
  // of a flow is spread over its own group, so the handling may then come before it: the
  // send moves back to the handling's start (arrows never point backwards).
  groups.sort();
  for (auto& m : msgs) {
    if (m.sent_run == 0) continue;
    m.sent = std::min(groups.start_of(m.sender, m.sent, m.sent_run), m.start);
  }
  // Flow ends and starts bound to messages (bound_flow): the k-th of a pair, in time
  // order, takes the time of the k-th message of that pair, in handling order (one
  // sender's messages to one receiver are handled in the order they were sent).
  std::unordered_map<const record*, std::int64_t> bound_at;  // ns
  {
    std::vector<const record*> bound;
    for (auto& b : buffers_)
      for (auto& o : b->others)
        if ((o.r.kind == record_kind::flow_start || o.r.kind == record_kind::flow_end) && o.r.aux == bound_to_message)
          bound.push_back(&o.r);
    if (!bound.empty()) {
      // Pair keys: (sender, receiver) of the message each binds to.
      auto key_of = [](const record& r) {
        return r.kind == record_kind::flow_start ? std::pair{r.track, r.peer} : std::pair{r.peer, r.track};
      };
      std::stable_sort(bound.begin(), bound.end(), [&](const record* a, const record* b) {
        if (a->kind != b->kind) return a->kind < b->kind;
        if (key_of(*a) != key_of(*b)) return key_of(*a) < key_of(*b);
        return a->ts_ns < b->ts_ns;
      });
      std::vector<const message_record*> pair_msgs;
      for (auto& m : msgs) pair_msgs.push_back(&m);
      std::sort(pair_msgs.begin(), pair_msgs.end(), [](const message_record* a, const message_record* b) {
        if (a->sender != b->sender) return a->sender < b->sender;
        if (a->receiver != b->receiver) return a->receiver < b->receiver;
        return a->start < b->start;
      });
      for (std::size_t i = 0; i < bound.size();) {
        const auto kind = bound[i]->kind;
        const auto key = key_of(*bound[i]);
        auto lo = std::lower_bound(pair_msgs.begin(), pair_msgs.end(), key, [](const message_record* m, const auto& want) {
          return std::pair{m->sender, m->receiver} < want;
        });
        for (; i < bound.size() && bound[i]->kind == kind && key_of(*bound[i]) == key; ++i) {
          if (lo == pair_msgs.end() || std::pair{(*lo)->sender, (*lo)->receiver} != key) continue;
          bound_at[bound[i]] = ns(kind == record_kind::flow_start ? (*lo)->sent : (*lo)->start);
          ++lo;
        }
      }
    }
  }
  struct pop_at {
    actor_id receiver;
    std::int64_t start;
    std::int64_t taken;  // mod count_modulus
  };
  std::vector<pop_at> pops;
  for (const auto& m : msgs)
    if (m.taken >= 0) pops.push_back({m.receiver, m.start, m.taken % detail::count_modulus});
  auto before = [](const pop_at& a, const pop_at& b) { return a.receiver != b.receiver ? a.receiver < b.receiver : a.start < b.start; };
  std::sort(pops.begin(), pops.end(), before);
  auto depth_at = [&](const message_record& m) -> std::int32_t {
    if (m.reserved < 0) return -1;
    constexpr auto lowest = std::numeric_limits<std::int64_t>::min();
    constexpr auto highest = std::numeric_limits<std::int64_t>::max();
    const auto lo = std::lower_bound(pops.begin(), pops.end(), pop_at{m.receiver, lowest, 0}, before);
    const auto hi = std::upper_bound(lo, pops.end(), pop_at{m.receiver, highest, 0}, before);
    if (lo == hi) return -1;  // no run of the receiver recorded: nothing to count against
    const auto it = std::lower_bound(lo, hi, pop_at{m.receiver, m.sent, 0}, before);  // first run at or after the send
    // Taken by the send: as of the last run before it, or one less than the first after it.
    const std::int64_t taken = it != lo ? std::prev(it)->taken : it->taken - 1;
    constexpr auto mod = detail::count_modulus;
    auto d = ((m.reserved % mod - taken) % mod + mod) % mod;
    // A difference that wraps is a run that a core's clock puts just before the send (or a
    // send stamped with its run's start): nothing more was queued. A normal message counts
    // itself, so its depth is at least 1; an urgent one is not in the normal lane.
    if (d > mod / 2) d = 0;
    if (m.taken >= 0 && d == 0) d = 1;
    return static_cast<std::int32_t>(d);
  };
  std::uint64_t flow = 0;  // message flows: 1, 2, ... (next_flow() ids start at 2^40)
  for (const auto& m : msgs) {
    ++flow;
    record s;
    s.kind = record_kind::send;
    s.ts_ns = ns(m.sent);
    s.flow = flow;
    s.bytes = m.bytes;
    s.mb = m.mb;
    s.tag = m.tag;
    s.track = m.sender;
    s.peer = m.receiver;
    s.depth = depth_at(m);
    out.push_back(s);
    record h;
    h.kind = record_kind::handle;
    h.ts_ns = ns(m.start);
    h.dur_ns = span_ns(m.end - m.start);
    h.flow = flow;
    h.bytes = m.bytes;
    h.mb = m.mb;
    h.value = std::max<std::int64_t>(0, span_ns(m.start - m.sent));
    h.tag = m.tag;
    h.track = m.receiver;
    h.peer = m.sender;
    h.aux = static_cast<std::int32_t>(m.loop);
    if (m.shared > 1) h.aux2 = static_cast<std::int32_t>(m.shared);
    out.push_back(h);
  }
  for (auto& b : buffers_) {
    for (const auto& o : b->others) {
      out.push_back(o.r);
      if (o.in_ticks) out.back().ts_ns = ns(o.r.ts_ns);
      if (auto it = bound_at.find(&o.r); it != bound_at.end()) out.back().ts_ns = it->second;
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const record& a, const record& b) { return a.ts_ns < b.ts_ns; });
  return out;
}

namespace {
double us(std::int64_t ns) { return static_cast<double>(ns) / 1000.0; }
std::string kind_of(const record& r) {
  if (r.name) return r.name;
  if (r.tag) return std::string(r.tag->name);
  return "message";
}
}  // namespace

nlohmann::json recorder::to_chrome_trace(const nlohmann::json& actors, const nlohmann::json& extra) const {
  using nlohmann::json;
  json events = json::array();
  events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", 0}, {"tid", 0}, {"args", {{"name", "nerve rank 0"}}}});
  events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", 0}, {"tid", 0}, {"args", {{"name", "outside"}}}});
  if (actors.is_array()) {
    for (const auto& a : actors) {
      auto id = a.value("id", 0);
      events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", 0}, {"tid", id}, {"args", {{"name", a.value("name", "")}}}});
      // Lanes group by loop, then stage, then spawn order.
      long sort = (a.value("loop", 0) + 1) * 100000000L + (a.value("stage", -1) + 1) * 1000000L + id;
      events.push_back({{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", 0}, {"tid", id}, {"args", {{"sort_index", sort}}}});
    }
  }
  {
    std::lock_guard lk(mu_);
    for (const auto& t : tracks_) {
      events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", 0}, {"tid", t.track}, {"args", {{"name", t.name}}}});
      if (t.sort_index >= 0)
        events.push_back({{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", 0}, {"tid", t.track},
                          {"args", {{"sort_index", t.sort_index}}}});
    }
  }
  for (const auto& r : snapshot()) {
    const auto name = kind_of(r);
    switch (r.kind) {
      case record_kind::send:
        events.push_back({{"ph", "s"}, {"cat", "msg"}, {"name", name}, {"id", r.flow}, {"pid", 0}, {"tid", r.track},
                          {"ts", us(r.ts_ns)}, {"args", {{"bytes", r.bytes}, {"mb", r.mb}, {"to", r.peer}}}});
        if (r.depth >= 0)
          events.push_back({{"ph", "C"}, {"cat", "mailbox"}, {"name", "mailbox"}, {"pid", 0}, {"tid", r.peer},
                            {"ts", us(r.ts_ns)}, {"args", {{"depth", r.depth}}}});
        break;
      case record_kind::handle:
        events.push_back({{"ph", "X"}, {"cat", "handler"}, {"name", name}, {"pid", 0}, {"tid", r.track},
                          {"ts", us(r.ts_ns)}, {"dur", us(r.dur_ns)},
                          {"args", {{"loop", r.aux}, {"mb", r.mb}, {"bytes", r.bytes}, {"queue_us", us(r.value)},
                                    {"sender", r.peer}}}});
        if (r.aux2 > 1) events.back()["args"]["shared"] = r.aux2;
        if (r.flow)
          events.push_back({{"ph", "f"}, {"bp", "e"}, {"cat", "msg"}, {"name", name}, {"id", r.flow}, {"pid", 0},
                            {"tid", r.track}, {"ts", us(r.ts_ns)}});
        break;
      case record_kind::drop:
        events.push_back({{"ph", "i"}, {"s", "t"}, {"cat", "drop"}, {"name", name}, {"pid", 0}, {"tid", r.track},
                          {"ts", us(r.ts_ns)}, {"args", {{"to", r.peer}, {"reason", r.text ? r.text : "closed"}}}});
        break;
      case record_kind::failure:
        events.push_back({{"ph", "i"}, {"s", "t"}, {"cat", "failure"}, {"name", "failure"}, {"pid", 0},
                          {"tid", r.track}, {"ts", us(r.ts_ns)}, {"args", {{"what", name}}}});
        break;
      case record_kind::span: {
        json args = {{"mb", r.mb}};
        std::string cat = r.cat ? r.cat : "span";
        if (cat == "idle") args["cause"] = r.text ? r.text : "input";
        else if (cat == "action") args.update({{"chunk", r.value}, {"stage", r.aux}, {"step", r.aux2}});
        else if (cat == "step") args = {{"step", r.value}};
        else if (cat == "gpu") args.update({{"stream", r.aux}, {"device", r.aux2}});
        else if (r.text) args["text"] = r.text;
        events.push_back({{"ph", "X"}, {"cat", cat}, {"name", name}, {"pid", 0}, {"tid", r.track},
                          {"ts", us(r.ts_ns)}, {"dur", us(r.dur_ns)}, {"args", std::move(args)}});
        break;
      }
      case record_kind::instant:
        events.push_back({{"ph", "i"}, {"s", "t"}, {"cat", r.cat ? r.cat : "instant"}, {"name", name}, {"pid", 0},
                          {"tid", r.track}, {"ts", us(r.ts_ns)}, {"args", {{"mb", r.mb}}}});
        break;
      case record_kind::flow_start:
        if (r.flow == 0) break;  // a bound flow's place holder (bound_flow)
        events.push_back({{"ph", "s"}, {"cat", r.cat ? r.cat : "msg"}, {"name", name}, {"id", r.flow}, {"pid", 0},
                          {"tid", r.track}, {"ts", us(r.ts_ns)}});
        break;
      case record_kind::flow_end:
        if (r.flow == 0) break;
        events.push_back({{"ph", "f"}, {"bp", "e"}, {"cat", r.cat ? r.cat : "msg"}, {"name", name}, {"id", r.flow},
                          {"pid", 0}, {"tid", r.track}, {"ts", us(r.ts_ns)}});
        break;
      case record_kind::counter:
        events.push_back({{"ph", "C"}, {"cat", r.text ? r.text : "counter"}, {"name", name}, {"pid", 0},
                          {"tid", r.track}, {"ts", us(r.ts_ns)}, {"args", {{r.text ? r.text : "value", r.value}}}});
        if (r.aux >= 0) events.back()["id"] = r.aux;
        break;
    }
  }
  json nerve = {{"version", 1}, {"actors", actors.is_array() ? actors : json::array()}, {"lost_records", lost()}};
  if (extra.is_object()) nerve.update(extra);
  return {{"displayTimeUnit", "ns"}, {"traceEvents", std::move(events)}, {"nerve", std::move(nerve)}};
}

void recorder::write_file(const std::string& path, const nlohmann::json& actors, const nlohmann::json& extra) const {
  write_file_atomically(path, to_chrome_trace(actors, extra).dump());
}

void write_file_atomically(const std::string& path, std::string_view text, std::string_view what) {
  // The same rules as a checkpoint's atomic_file (layers/checkpoint, which actors/ cannot
  // use): follow symlinks to the file they name, replace only a regular file and keep its
  // permission bits, and leave no temporary behind when a write fails (a full disk).
  auto fail = [&](const std::string& why, int err) {
    throw std::runtime_error(std::string(what) + " '" + path + "': " + why + (err ? std::string(": ") + std::strerror(err) : ""));
  };
  std::filesystem::path target = path;
  struct stat old {};
  bool replacing = false;
  for (int hops = 0;; ++hops) {
    if (::lstat(target.c_str(), &old) != 0) {
      if (errno != ENOENT) fail("cannot inspect " + target.string(), errno);
      break;
    }
    if (S_ISLNK(old.st_mode)) {
      if (hops == 40) fail("more than 40 symlinks in a row (a loop?)", 0);
      const auto link = std::filesystem::read_symlink(target);
      target = link.is_absolute() ? link : target.parent_path() / link;
      continue;
    }
    if (!S_ISREG(old.st_mode)) {
      const char* kind = S_ISDIR(old.st_mode)    ? "a directory"
                         : S_ISFIFO(old.st_mode) ? "a FIFO"
                         : S_ISCHR(old.st_mode)  ? "a character device"
                         : S_ISBLK(old.st_mode)  ? "a block device"
                         : S_ISSOCK(old.st_mode) ? "a socket"
                                                 : "something";
      fail((target.string() == path ? std::string() : "leads to '" + target.string() + "', which ") + "is " + kind +
               ", not a regular file: refusing to replace it",
           0);
    }
    replacing = true;
    break;
  }
  static std::atomic<unsigned> counter{0};
  std::string name(1, '.');  // appended piece by piece: "." + std::string trips GCC 12's -Wrestrict (bug 105329)
  name += target.filename().string();
  name += ".tmp-";
  name += std::to_string(::getpid());
  name += '-';
  name += std::to_string(counter++);
  const auto tmp = target.parent_path() / name;
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) fail("cannot create " + tmp.string(), errno);
  auto abandon = [&](const std::string& why) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    fail(why, err);
  };
  if (replacing && ::fchmod(fd, old.st_mode & 07777) != 0) abandon("cannot set the mode of " + tmp.string());
  for (std::size_t at = 0; at < text.size();) {
    const ssize_t n = ::write(fd, text.data() + at, text.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) abandon("error writing " + tmp.string());
    at += static_cast<std::size_t>(n);
  }
  const int closed = ::close(fd);
  fd = -1;
  if (closed != 0) abandon("error writing " + tmp.string());
  if (std::rename(tmp.c_str(), target.c_str()) != 0) abandon("cannot rename " + tmp.string() + " over it");
}

}  // namespace nerve::actors

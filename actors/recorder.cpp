// The recording side of `recorder`: the per-thread buffers it hands out, the writes that
// fill them, track names, and the tick clock's epoch and rate. Turning the buffers into
// records is actors/recorder_snapshot.cpp; the Chrome trace and the file,
// actors/recorder_export.cpp.
#include "actors/recorder.hpp"

#include "actors/detail/recorder_buffer.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

namespace nerve::actors {

namespace {
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

using detail::chunk_records;
using detail::new_chunk;
using detail::recorder_buffer;

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

}  // namespace nerve::actors

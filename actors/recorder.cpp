#include "actors/recorder.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include <nlohmann/json.hpp>

namespace nerve::actors {

namespace {
// Records go to 2 MiB chunks, aligned and marked for transparent huge pages: recording
// writes about 200 bytes per message, and on a VM every fresh 4 KiB page costs a fault
// of several microseconds (most of the recorder's cost before); a huge page takes one
// fault per 2 MiB. The chunk is left uninitialised (`record` is an aggregate, so
// assigning into malloc'd storage is fine); the kernel hands it over zeroed anyway.
constexpr std::size_t chunk_bytes = std::size_t{2} << 20;
constexpr std::size_t chunk_records = chunk_bytes / sizeof(record);
struct chunk_free {
  void operator()(record* p) const noexcept { std::free(p); }
};
using chunk_ptr = std::unique_ptr<record[], chunk_free>;
chunk_ptr new_chunk() {
  void* p = std::aligned_alloc(chunk_bytes, chunk_bytes);
  if (!p) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  (void)madvise(p, chunk_bytes, MADV_HUGEPAGE);  // advice only: without THP it is a no-op
#endif
  return chunk_ptr(static_cast<record*>(p));
}
std::atomic<std::uint64_t> next_instance{1};

struct cache_entry {
  std::uint64_t instance = 0;
  void* buffer = nullptr;
};
// A thread records into few recorders; a tiny direct cache avoids the lock on the hot path.
thread_local cache_entry tl_cache[4];
thread_local unsigned tl_cache_next = 0;
}  // namespace

struct recorder::thread_buffer {
  std::thread::id thread;
  std::uint32_t index = 0;
  std::uint64_t flows = 0;
  std::size_t count = 0;
  std::vector<chunk_ptr> chunks;
};

recorder::recorder() : epoch_(std::chrono::steady_clock::now()), instance_(next_instance.fetch_add(1)) {}
recorder::~recorder() = default;

recorder::thread_buffer& recorder::local() noexcept {
  for (auto& c : tl_cache)
    if (c.instance == instance_) return *static_cast<thread_buffer*>(c.buffer);
  std::lock_guard lk(mu_);
  thread_buffer* found = nullptr;
  for (auto& b : buffers_)
    if (b->thread == std::this_thread::get_id()) found = b.get();
  if (!found) {
    buffers_.push_back(std::make_unique<thread_buffer>());
    found = buffers_.back().get();
    found->thread = std::this_thread::get_id();
    found->index = next_thread_.fetch_add(1);
  }
  tl_cache[tl_cache_next++ % 4] = {instance_, found};
  return *found;
}

std::uint64_t recorder::next_flow() noexcept {
  auto& b = local();
  return (std::uint64_t{b.index} + 1) << 40 | ++b.flows;
}

void recorder::write(const record& r) noexcept {
  auto& b = local();
  if (b.count >= max_records_) {
    lost_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  auto slot = b.count % chunk_records;
  if (slot == 0) {
    try {
      b.chunks.push_back(new_chunk());
    } catch (...) {
      lost_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
  }
  b.chunks.back()[slot] = r;
  ++b.count;
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

void recorder::counter(std::uint32_t track, const char* name, const char* key, std::int64_t value) noexcept {
  record r;
  r.kind = record_kind::counter;
  r.ts_ns = now();
  r.track = track;
  r.name = name;
  r.text = key;
  r.value = value;
  write(r);
}

std::size_t recorder::size() const {
  std::lock_guard lk(mu_);
  std::size_t n = 0;
  for (auto& b : buffers_) n += b->count;
  return n;
}

void recorder::clear() {
  std::lock_guard lk(mu_);
  for (auto& b : buffers_) {
    b->chunks.clear();
    b->count = 0;
  }
  lost_.store(0);
}

std::vector<record> recorder::snapshot() const {
  std::vector<record> out;
  std::lock_guard lk(mu_);
  for (auto& b : buffers_)
    for (std::size_t i = 0; i < b->count; ++i) out.push_back(b->chunks[i / chunk_records][i % chunk_records]);
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
      case record_kind::counter:
        events.push_back({{"ph", "C"}, {"cat", r.text ? r.text : "counter"}, {"name", name}, {"pid", 0},
                          {"tid", r.track}, {"ts", us(r.ts_ns)}, {"args", {{r.text ? r.text : "value", r.value}}}});
        break;
    }
  }
  json nerve = {{"version", 1}, {"actors", actors.is_array() ? actors : json::array()}, {"lost_records", lost()}};
  if (extra.is_object()) nerve.update(extra);
  return {{"displayTimeUnit", "ns"}, {"traceEvents", std::move(events)}, {"nerve", std::move(nerve)}};
}

}  // namespace nerve::actors

// `recorder::snapshot`: the per-thread buffers turned into records. Packed messages are
// unpacked, shared runs timed by their groups, sends moved to the run that made them,
// flows bound to messages placed, and mailbox depths worked out at each send.
#include "actors/recorder.hpp"

#include "actors/detail/recorder_buffer.hpp"

#include <algorithm>
#include <iterator>
#include <limits>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace nerve::actors {

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

}  // namespace nerve::actors

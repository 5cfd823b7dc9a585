#pragma once
/// \file
/// The viewer's model of one or more trace files merged into one view.
///
/// Reading turns the Chrome trace events into compact `event` records (B/E pairs
/// become complete slices, flows are matched into `flow` pairs) and keeps the
/// nerve metadata (actors, stages, planned schedule). Nothing here depends on the
/// runtime: the viewer reads files. All of it is single-threaded.

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace nerve::trace {

/// Track id offsets used by nerve traces (see docs/trace-format.md).
inline constexpr std::int64_t gpu_stream_tid_base = 1000000;
inline constexpr std::int64_t stage_tid_base = 2000000;

/// The latest time a trace may hold, in µs: every event's `ts` and end (`ts + dur`)
/// lie in [0, max_time_us]. 4·10^15 µs is about 127 years, enough for timestamps
/// counted from the Unix epoch, and 1000 times it still fits the 64-bit nanoseconds
/// the page is drawn in.
inline constexpr double max_time_us = 4e15;

/// One trace event after reading. B/E pairs are joined into `ph == 'X'` slices.
/// Numeric nerve arguments are lifted out of `args`; -1 (or < 0) means absent.
struct event {
  double ts = 0;            ///< start in µs
  double dur = -1;          ///< duration in µs; -1 when the event has none
  std::int64_t pid = 0;
  std::int64_t tid = 0;
  std::int64_t bytes = -1;
  std::int64_t sender = -1;  ///< handler: the sending actor's id (0 = outside)
  std::int64_t to = -1;      ///< send/drop: the receiving actor's id
  double queue_us = -1;      ///< handler: enqueue to start
  double value = 0;          ///< counter: the first numeric argument
  std::uint32_t name = 0;    ///< index into `timeline::strings`
  std::uint32_t cat = 0;
  std::uint32_t cause = 0;   ///< idle: `cause`; drop: `reason` (string index, 0 = none)
  std::uint32_t extra = 0;   ///< index into `timeline::extras` (args as JSON text), 0 = none
  std::uint32_t index = 0;   ///< position in its file's event array
  std::int32_t file = 0;     ///< index into `timeline::files`
  std::int32_t mb = -1;      ///< micro-batch id
  std::int32_t loop = -1;
  std::int32_t stage = -1;   ///< action/idle: the stage (from `args.stage`)
  std::int32_t step = -1;    ///< action: planned step index; step marker: the training step
  std::int32_t chunk = -1;
  std::uint32_t async = 0;   ///< async and object events (b n e S T p F N O D): their id, numbered per view; 0 = none
  char ph = 'X';
  bool bind_enclosing = false;  ///< flow end with `"bp": "e"`

  [[nodiscard]] double end() const { return dur > 0 ? ts + dur : ts; }
};

/// A send matched to its handling: indices into `timeline::events` of the `s` and `f` events.
struct flow {
  std::uint32_t start = 0;
  std::uint32_t finish = 0;
};

/// An actor (a track that handles messages), from `nerve.actors` and thread metadata.
struct actor_info {
  std::int64_t pid = 0;
  std::int64_t tid = 0;
  std::string name;
  std::int32_t loop = -1;
  std::int32_t stage = -1;
  std::int64_t sort_index = 0;
  std::string group;
};

/// A pipeline stage from `nerve.stages` (one per pid it belongs to).
struct stage_info {
  std::int64_t pid = 0;
  std::int32_t stage = 0;
  std::vector<std::int64_t> actors;
  std::int32_t loop = -1;
  std::string device;
};

/// One planned action of `nerve.schedule`.
struct planned_action {
  char op = 'F';  ///< F, B or W
  std::int32_t mb = 0;
  std::int32_t chunk = 0;
};

/// The planned pipeline schedule of one file, with the pids it applies to.
struct schedule_info {
  std::int32_t file = 0;
  std::vector<std::int64_t> pids;
  std::string name;
  std::int32_t stages = 0;
  std::int32_t microbatches = 0;
  std::int32_t chunks = 1;
  std::vector<std::vector<planned_action>> actions;  ///< per stage, in run order
};

/// One MPI rank of a merged trace (`nerve.ranks`, written by bus::mpi::write_merged_trace):
/// its process and how its clock was aligned onto rank 0's.
struct rank_info {
  std::int64_t pid = 0;
  std::int32_t rank = 0;
  std::int64_t offset_ns = 0;  ///< its steady clock minus rank 0's
  std::int64_t rtt_ns = 0;     ///< the round trip the offset was measured in (error ≤ half)
};

/// A file that went into the view, and how its pids were renumbered on merge.
struct source_file {
  std::string path;
  bool nerve = false;                          ///< has a top-level `nerve` object
  std::map<std::int64_t, std::int64_t> pid_map;  ///< pid in the file -> pid in the view
};

/// One or more traces merged into one view. Pids are unique across files: a pid
/// already taken by an earlier file is renumbered (see `append`).
class timeline {
 public:
  timeline() { strings_.emplace_back(); extras.emplace_back(); }

  std::vector<event> events;        ///< in file order, file after file
  std::vector<flow> flows;          ///< matched send -> handling pairs
  std::vector<std::string> extras;  ///< `args` JSON text of events with arguments nerve does not lift
  std::map<std::pair<std::int64_t, std::int64_t>, actor_info> actors;  ///< by (pid, tid)
  std::vector<stage_info> stages;
  std::vector<schedule_info> schedules;
  std::map<std::int64_t, std::string> process_names;
  /// The ranks of a merged trace (empty for a trace of one process). Their pids are the
  /// processes of one job: the summary and the page look at them over one window and follow
  /// arrows between them for one critical path.
  std::vector<rank_info> ranks;
  /// Matched flows whose ends lie in different processes (arrows across ranks), and how
  /// many of them end before they start (clocks aligned wrongly; `validate` reports each).
  std::size_t cross_process_flows = 0;
  std::size_t backward_flows = 0;
  std::vector<source_file> files;
  std::uint32_t async_ids = 0;      ///< the largest `event::async` in use (ids are 1..async_ids)

  /// Index of `s` in the string table, adding it when new.
  std::uint32_t intern(std::string_view s);
  /// The string at `index`.
  [[nodiscard]] const std::string& str(std::uint32_t index) const { return strings_[index]; }
  /// Index of `s` if already interned, else 0 (the empty string).
  [[nodiscard]] std::uint32_t find(std::string_view s) const;
  [[nodiscard]] const std::vector<std::string>& strings() const { return strings_; }

  /// Moves `other` into this view. Pids of `other` that are already used here are
  /// renumbered to the next free pid (recorded in `files[i].pid_map`).
  void append(timeline&& other);

  /// The actor's display name: its metadata name, else "tid N" (or "outside" for tid 0).
  [[nodiscard]] std::string actor_name(std::int64_t pid, std::int64_t tid) const;
  /// The stage an actor belongs to (-1 if none).
  [[nodiscard]] std::int32_t actor_stage(std::int64_t pid, std::int64_t tid) const;
  /// All pids that appear in events or metadata, ascending.
  [[nodiscard]] std::vector<std::int64_t> pids() const;

 private:
  std::vector<std::string> strings_;
  std::unordered_map<std::string, std::uint32_t> string_index_;
};

}  // namespace nerve::trace

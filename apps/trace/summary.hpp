#pragma once
/// \file
/// `nerve-trace summary`: per-actor utilisation and latencies, per-stage bubbles,
/// the critical path of one step, and the slowest messages.

#include "apps/trace/analysis.hpp"
#include "apps/trace/critical_path.hpp"

#include <nlohmann/json.hpp>

#include <map>
#include <ostream>
#include <string>
#include <vector>

namespace nerve::trace {

/// p50, p99 (nearest rank) and max of a set of durations, in µs.
struct distribution {
  std::size_t count = 0;
  double p50 = 0;
  double p99 = 0;
  double max = 0;
};

/// One actor over the selected window.
struct actor_summary {
  std::int64_t pid = 0;
  std::int64_t tid = 0;
  std::string name;
  std::int32_t loop = -1;
  std::int32_t stage = -1;
  double busy_us = 0;      ///< union of its handler runs inside the window
  double busy_pct = 0;     ///< busy_us / window length * 100
  std::size_t messages_in = 0;   ///< handler runs that started in the window
  std::size_t messages_out = 0;  ///< sends (flow starts) in the window
  std::size_t dropped = 0;       ///< drops of messages it sent or should have received
  distribution queue_us;   ///< from `args.queue_us` of its handler runs
  distribution handler_us; ///< handler run durations
};

/// One pipeline stage over the selected window.
struct stage_summary {
  std::int64_t pid = 0;
  std::int32_t stage = 0;
  double window_us = 0;
  double evaluation_us = 0;  ///< evaluation inside the window (`trace_index::evaluation_in`): its own phase
  double training_us = 0;    ///< window - evaluation: the time busy and bubble cover
  double busy_us = 0;        ///< union of the handler runs of its actors in training time
  double bubble_pct = 0;     ///< (training - busy) / training * 100
  std::map<std::string, double> idle_by_cause;  ///< from `idle` slices, clipped to training time
  double idle_unattributed_us = 0;  ///< bubble time no `idle` slice explains
  double planned_bubble_pct = -1;   ///< from `nerve.schedule` played with measured durations; -1 if none
};

/// One handler run ranked by queue wait + handler time.
struct slow_message {
  std::uint32_t run = 0;
  std::int64_t pid = 0;
  std::string actor;
  std::string kind;
  std::string sender;
  std::int32_t mb = -1;
  double ts = 0;
  double queue_us = 0;
  double handler_us = 0;
};

/// Options of `nerve-trace summary`.
struct summary_options {
  selection select;
  std::size_t top = 10;  ///< how many slowest messages
};

/// Everything `summary` prints.
struct summary {
  std::vector<std::string> files;
  std::map<std::int64_t, window> windows;    ///< per pid, what the numbers cover
  std::map<std::int64_t, std::size_t> step_counts;
  /// Per pid with evaluation slices: how many lie in its window, and their time there.
  std::map<std::int64_t, std::size_t> evaluation_counts;
  std::map<std::int64_t, double> evaluation_us;
  std::vector<actor_summary> actors;
  std::vector<stage_summary> stages;
  std::vector<critical_path> paths;          ///< one per pid that has handler runs
  std::vector<slow_message> slowest;
  std::size_t events = 0;
  std::size_t flows = 0;
};

summary summarize(const trace_index& index, const summary_options& options);

/// The summary as one JSON object (`--json`); times in µs, percentages 0..100.
nlohmann::json to_json(const summary& s, const timeline& t);

/// The human-readable tables.
void print_summary(const summary& s, const timeline& t, std::ostream& out);

}  // namespace nerve::trace

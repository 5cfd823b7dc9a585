// nerve-trace: validate, summarise and draw nerve traces (Chrome trace event format).
//
//   nerve-trace validate TRACE...           check files against the format
//   nerve-trace summary TRACE... [--json]   utilisation, queue waits, bubbles, critical path
//   nerve-trace html TRACE... -o PAGE        one self-contained page with the timeline
//   nerve-trace merge TRACE... -o OUT       several traces as one file (for Perfetto)
//   nerve-trace synth -o OUT [...]          a synthetic 1F1B pipeline trace
//   nerve-trace curves METRICS -o PAGE       the training curves of a --metrics file
//
// Exit status: 0 fine, 1 the trace has errors (or a file could not be read or written,
// or anything else failed: one line on stderr, never an abort), 2 usage.

#include "apps/trace/curves.hpp"
#include "apps/trace/html_page.hpp"
#include "apps/trace/reader.hpp"
#include "apps/trace/summary.hpp"
#include "apps/trace/synth.hpp"
#include "apps/trace/writer.hpp"
#include "apps/common/options.hpp"

#include <CLI/CLI.hpp>

#include <fstream>
#include <iostream>
#include <limits>
#include <optional>

namespace {

using namespace nerve::trace;
using nerve::apps::finite_number;
using nerve::apps::readable;
using nerve::apps::real_in;
using nerve::apps::whole_in;

// Prints the findings; returns false when the files cannot be used.
bool report(const diagnostics& diags, bool strict, bool quiet, std::size_t limit = 50) {
  std::size_t shown = 0;
  for (const auto& d : diags.items) {
    if (quiet && d.level == severity::warning) continue;
    if (shown++ < limit) std::cerr << d.to_string() << "\n";
  }
  if (shown > limit) std::cerr << "... and " << shown - limit << " more\n";
  return diags.error_count() == 0 && (!strict || diags.warning_count() == 0);
}

// `--window A:B`: two finite times with 0 <= A < B <= max_time_us (an empty or reversed
// window has no time to divide by).
std::optional<window> parse_window(const std::string& text) {
  auto colon = text.find(':');
  if (colon == std::string::npos) return std::nullopt;
  auto a = finite_number(text.substr(0, colon)), b = finite_number(text.substr(colon + 1));
  if (!a || !b || *a < 0 || *a >= *b || *b > max_time_us) return std::nullopt;
  return window{*a, *b};
}

int run(int argc, char** argv);

}  // namespace

int main(int argc, char** argv) {
  // Whatever escapes (a file that vanished, memory) ends in one line and status 1,
  // never in std::terminate's abort.
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::string what = e.what();
    for (auto& c : what)
      if (c == '\n' || c == '\r') c = ' ';
    if (what.size() > 300) what = what.substr(0, 300) + "…";
    std::cerr << "nerve-trace: error: " << what << "\n";
    return 1;
  } catch (...) {
    std::cerr << "nerve-trace: error: an unknown exception\n";
    return 1;
  }
}

namespace {

int run(int argc, char** argv) {
  CLI::App app{"nerve-trace: validate, summarise and draw nerve traces (Chrome trace event format), and training curves"};
  app.require_subcommand(1);

  std::vector<std::string> files;
  bool strict = false, quiet = false, as_json = false;
  std::string output, title, window_text;
  int step = -1;
  std::size_t top = 10;

  auto* validate = app.add_subcommand("validate", "check trace files against the Chrome trace event format");
  validate->add_option("TRACE", files, "trace files (JSON object or bare array form)")->required();
  validate->add_flag("--strict", strict, "treat warnings (unclosed B, flows that never end, ...) as errors");
  validate->add_flag("-q,--quiet", quiet, "print errors only");

  constexpr int max_int = std::numeric_limits<std::int32_t>::max();
  constexpr std::size_t max_top = 1000000;
  using L = synth_limits;

  auto* summary_cmd = app.add_subcommand("summary", "per-actor busy %, queue wait, handler time, bubbles, critical path");
  summary_cmd->add_option("TRACE", files, "trace files; several merge into one view")->required();
  summary_cmd->add_flag("--json", as_json, "print one JSON object instead of tables");
  summary_cmd->add_option("--step", step, "look at training step N only (from `step` slices); default: the whole trace, "
                                          "critical path of the last step")
      ->transform(whole_in(0, max_int, "2^31-1"));
  summary_cmd->add_option("--window", window_text, "look at the time range A:B (µs) only, 0 <= A < B <= 4e15");
  summary_cmd->add_option("--top", top, "how many slowest messages to list")->capture_default_str()->transform(whole_in<std::size_t>(0, max_top));

  auto* html = app.add_subcommand("html", "write one self-contained HTML page with the timeline");
  html->add_option("TRACE", files, "trace files; several merge into one view")->required();
  html->add_option("-o,--output", output, "the page to write")->required();
  html->add_option("--title", title, "page title (default: the file names)");
  html->add_option("--step", step, "highlight the critical path of step N (default: the last step)")->transform(whole_in(0, max_int, "2^31-1"));

  auto* merge = app.add_subcommand("merge", "write several traces as one file (pids renumbered on conflict)");
  merge->add_option("TRACE", files, "trace files")->required();
  merge->add_option("-o,--output", output, "the merged trace to write")->required();

  // A run's curves, not its messages: a file of their own (nerve-train --metrics) and a
  // page of their own, with steps across rather than microseconds.
  std::string metrics_file;
  auto* curves = app.add_subcommand("curves", "draw the training curves of a --metrics file (nerve-train, "
                                              "nerve-pipeline) as one self-contained HTML page");
  curves->add_option("METRICS", metrics_file, "the JSON lines file --metrics wrote")->required();
  curves->add_option("-o,--output", output, "the page to write")->required();
  curves->add_option("--title", title, "page title (default: the file name)");

  synth_options so;
  auto* synth = app.add_subcommand("synth", "write a synthetic 1F1B pipeline trace with known bubbles");
  synth->add_option("-o,--output", output, "the trace to write")->required();
  synth->add_option("--events", so.events, "write whole steps until at least this many events")
      ->transform(whole_in<std::size_t>(0, L::max_events));
  synth->add_option("--steps", so.steps, "minimum number of training steps")->capture_default_str()->transform(whole_in(1, L::max_steps));
  synth->add_option("--stages", so.stages, "pipeline stages")->capture_default_str()->transform(whole_in(1, L::max_stages));
  synth->add_option("--microbatches", so.microbatches, "micro-batches per step")
      ->capture_default_str()
      ->transform(whole_in(1, L::max_microbatches));
  synth->add_option("--actors-per-stage", so.actors_per_stage, "layer actors per stage")
      ->capture_default_str()
      ->transform(whole_in(1, L::max_actors_per_stage));
  const auto time_range = real_in(0, L::max_time_us, " µs");
  synth->add_option("--forward-us", so.forward_us, "forward handler time per actor")->capture_default_str()->transform(time_range);
  synth->add_option("--backward-us", so.backward_us, "backward handler time per actor")->capture_default_str()->transform(time_range);
  synth->add_option("--load-us", so.load_us, "data loading per micro-batch")->capture_default_str()->transform(time_range);
  synth->add_option("--optimizer-us", so.optimizer_us, "optimizer step per actor")->capture_default_str()->transform(time_range);
  synth->add_option("--jitter", so.jitter, "vary durations by up to this fraction")
      ->capture_default_str()
      ->transform(real_in(0, L::max_jitter));
  synth->add_option("--seed", so.seed, "random seed for --jitter")
      ->capture_default_str()
      ->transform(nerve::apps::any_whole<std::uint64_t>());

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help is a ParseError too (status 0); every other one is a usage error, status 2.
    return app.exit(e) == 0 ? 0 : 2;
  }

  selection sel;
  if (step >= 0) sel.step = step;
  if (!window_text.empty()) {
    sel.range = parse_window(window_text);
    if (!sel.range) {
      std::cerr << "nerve-trace: --window wants A:B in µs, two finite numbers with 0 <= A < B <= " << readable(max_time_us)
                << ", got '" << window_text << "'\n";
      return 2;
    }
  }

  if (*synth) {
    try {  // the options' joint limit (how long the whole run lasts), before any file is written
      check(so);
    } catch (const std::invalid_argument& e) {
      std::cerr << "nerve-trace: " << e.what() << "\n";
      return 2;
    }
    std::ofstream out(output, std::ios::binary);
    if (!out) {
      std::cerr << "nerve-trace: cannot write " << output << "\n";
      return 1;
    }
    auto truth = write_synthetic_trace(so, out);
    out.close();
    if (!out) {
      std::cerr << "nerve-trace: cannot write " << output << "\n";
      return 1;
    }
    std::cout << "wrote " << output << ": " << truth.events << " events, " << truth.steps << " steps, " << truth.handler_runs
              << " handler runs, " << truth.flows << " messages\n";
    for (std::size_t s = 0; s < truth.stage_busy_us.size(); ++s) {
      std::cout << "  stage " << s << ": bubble " << (1.0 - truth.stage_busy_us[s] / truth.span_us) * 100.0 << "%";
      for (const auto& [cause, us] : truth.stage_idle_us[s]) std::cout << ", " << cause << " " << us << " µs";
      std::cout << "\n";
    }
    return 0;
  }

  if (*curves) {
    diagnostics cd;
    const auto c = read_metrics_file(metrics_file, cd);
    if (!report(cd, false, false)) {
      std::cerr << "nerve-trace: " << metrics_file << " has errors (see above); no page written\n";
      return 1;
    }
    if (c.steps.empty() && c.epochs.empty()) {
      std::cerr << "nerve-trace: " << metrics_file << ": no step or epoch lines, nothing to draw yet\n";
      return 1;
    }
    std::ofstream out(output, std::ios::binary);
    if (!out) {
      std::cerr << "nerve-trace: cannot write " << output << "\n";
      return 1;
    }
    auto stats = write_curves_page(c, title.empty() ? "training curves: " + metrics_file : title, out);
    out.close();
    if (!out) {
      std::cerr << "nerve-trace: cannot write " << output << "\n";
      return 1;
    }
    std::cout << "wrote " << output << ": " << stats.steps << " steps, " << stats.epochs << " epochs, " << stats.runs
              << " run(s)";
    if (c.superseded) std::cout << ", " << c.superseded << " replayed records replaced";
    std::cout << ", " << stats.bytes << " bytes\n";
    return 0;
  }

  diagnostics diags;
  timeline tl = read_trace_files(files, diags);

  if (*validate) {
    const bool ok = report(diags, strict, quiet, 1000);
    std::size_t slices = 0;
    for (const auto& e : tl.events) slices += e.ph == 'X';
    std::cout << (ok ? "valid: " : "INVALID: ") << files.size() << " file(s), " << tl.events.size() << " events (" << slices
              << " slices), " << tl.flows.size() << " matched flows";
    // Arrows between processes (the ranks of a merged trace) must go forward in time.
    if (tl.cross_process_flows > 0 || tl.backward_flows > 0)
      std::cout << " (" << tl.cross_process_flows << " across processes, "
                << (tl.backward_flows == 0 ? std::string("all forward") : std::to_string(tl.backward_flows) + " backward") << ")";
    std::cout << "; " << diags.error_count() << " error(s), "
              << diags.warning_count() << " warning(s)\n";
    return ok ? 0 : 1;
  }

  if (!report(diags, false, true)) {
    std::cerr << "nerve-trace: the trace has errors (see above; `nerve-trace validate` lists warnings too)\n";
    return 1;
  }
  trace_index index(tl);

  if (*summary_cmd) {
    summary_options opts;
    opts.select = sel;
    opts.top = top;
    auto s = summarize(index, opts);
    if (sel.step && s.windows.empty()) {
      std::cerr << "nerve-trace: no process has step " << *sel.step << "\n";
      return 1;
    }
    if (as_json) std::cout << to_json(s, tl).dump(2) << "\n";
    else print_summary(s, tl, std::cout);
    return 0;
  }

  if (*html) {
    html_options opts;
    opts.select = sel;
    if (title.empty()) {
      for (std::size_t i = 0; i < files.size(); ++i) title += (i ? " + " : "") + files[i];
    }
    opts.title = title;
    std::ofstream out(output, std::ios::binary);
    if (!out) {
      std::cerr << "nerve-trace: cannot write " << output << "\n";
      return 1;
    }
    auto stats = write_html_page(index, opts, out);
    out.close();
    if (!out) {
      std::cerr << "nerve-trace: cannot write " << output << "\n";
      return 1;
    }
    std::cout << "wrote " << output << ": " << stats.lanes << " lanes, " << stats.rows << " rows, " << stats.events << " items, "
              << stats.flows << " flows, " << stats.bytes << " bytes\n";
    return 0;
  }

  if (*merge) {
    std::ofstream out(output, std::ios::binary);
    if (!out) {
      std::cerr << "nerve-trace: cannot write " << output << "\n";
      return 1;
    }
    write_trace(tl, out);
    for (const auto& f : tl.files)
      for (const auto& [from, to] : f.pid_map)
        if (from != to) std::cout << f.path << ": pid " << from << " -> " << to << "\n";
    out.close();
    if (!out) {
      std::cerr << "nerve-trace: cannot write " << output << "\n";
      return 1;
    }
    std::cout << "wrote " << output << ": " << tl.events.size() << " events from " << files.size() << " file(s)\n";
    return 0;
  }
  return 2;
}

}  // namespace

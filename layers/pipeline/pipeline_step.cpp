// A pipeline's step, evaluation and prediction: the requests to the stages, the wait for
// their reports under the stall watch, and the figures. Construction and wiring are in
// layers/pipeline/pipeline.cpp, what crosses between ranks in pipeline_exchange.cpp.
#include "layers/pipeline/pipeline.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <future>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "bus/all_reduce.hpp"
#include "layers/pipeline/stage_gate.hpp"
#include "layers/pipeline/stall_watch.hpp"

namespace nerve::pipeline {

using detail::stage_aborted;
using detail::stage_report;
using detail::step_msg;

std::vector<stage_report> pipeline::run_stages(std::vector<step_msg>& msgs, const std::vector<bool>& local) {
  std::vector<std::future<stage_report>> futures(msgs.size());
  // Last stage first: a stage's first message of the step is then usually its step_msg.
  for (std::size_t i = msgs.size(); i-- > 0;)
    if (local[i]) futures[i] = rt_.ask<stage_report>(stages_[i], std::move(msgs[i]), std::chrono::nanoseconds::max());
  std::vector<stage_report> reports(msgs.size());
  if (options_.stall_timeout_s > 0) watch_stages(futures, local);
  // A failing stage fails its request with its error and makes every other stage fail
  // with `stage_aborted` (see abort_msg): rethrow the error itself.
  std::exception_ptr first_error, aborted;
  for (std::size_t i = 0; i < msgs.size(); ++i) {
    if (!local[i]) continue;
    try {
      reports[i] = futures[i].get();
    } catch (const stage_aborted&) {
      if (!aborted) aborted = std::current_exception();
    } catch (...) {
      if (!first_error) first_error = std::current_exception();
    }
  }
  if (!first_error) first_error = aborted;
  if (first_error) {
    failed_ = true;
    // Wait until the stops are handled and the stages let go of their requests, while the
    // futures still hold the errors: the last reference to each is then on this thread,
    // and every stage has stopped when the error reaches the caller.
    stop_all();
    std::rethrow_exception(first_error);
  }
  return reports;
}

void pipeline::watch_stages(std::vector<std::future<stage_report>>& futures, const std::vector<bool>& local) {
  using clock = std::chrono::steady_clock;
  const auto timeout = std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(options_.stall_timeout_s));
  // A look every eighth of the timeout: a stall is told between 1 and 1⅛ timeouts after
  // the last message, and a step that moves costs one clock read per finished stage.
  const auto look = std::max<clock::duration>(timeout / 8, std::chrono::milliseconds(1));
  const auto moved = [&] {
    std::uint64_t n = 0;
    for (auto& w : watches_)
      if (w) n += w->events();
    return n;
  };
  auto seen = moved();
  auto since = clock::now();
  for (std::size_t i = 0; i < futures.size(); ++i) {
    if (!local[i]) continue;
    while (futures[i].wait_for(look) == std::future_status::timeout) {
      const auto n = moved();
      const auto t = clock::now();
      if (n != seen) {
        seen = n;
        since = t;
        continue;
      }
      if (t - since < timeout) continue;
      stall(stall_report(options_.stall_timeout_s, local));
    }
  }
}

void pipeline::stall(const std::string& report) {
  // The stages are told to stop; a stage whose loop is blocked hears it once it is free
  // (the destructor waits for that), so the caller hears of the stall now.
  failed_ = true;
  for (std::size_t k = 0; k < stages_.size(); ++k)
    if (stages_[k] && !stages_[k].stopped())
      (void)stages_[k].get()->try_tell(detail::abort_msg{std::uint32_t(k % plan_.stages), "the step stalled"},
                                       actors::lane::urgent);
  if (options_.on_stall) options_.on_stall(report);
  throw stall_error(report);
}


std::string pipeline::stall_report(double seconds, const std::vector<bool>& local) const {
  const std::uint32_t S = plan_.stages;
  char secs[32];
  std::snprintf(secs, sizeof secs, "%g", seconds);
  std::string out = "pipeline stalled: no stage";
  out += options_.link ? " of rank " + std::to_string(me_) : std::string();
  out += " handled a message for " + std::string(secs) + " s (--stall-timeout) while a step was in flight";
  const auto name = [&](std::uint32_t r, std::uint32_t s) {
    std::string n = (replicas_ > 1 ? "replica " + std::to_string(r) + " " : std::string()) + "stage " + std::to_string(s);
    if (options_.link) n += " (rank " + std::to_string(rank_of(r, s)) + ")";
    return n;
  };
  const auto act = [](const action& a) {
    return std::string(1, char(a.op)) + std::to_string(a.micro_batch) + (a.chunk ? " of chunk " + std::to_string(a.chunk) : "");
  };
  std::set<int> silent;  // ranks this one waits for
  for (std::size_t k = 0; k < watches_.size(); ++k) {
    if (!watches_[k] || !local[k]) continue;
    const auto r = std::uint32_t(k / S), s = std::uint32_t(k % S);
    const auto g = watches_[k]->state();
    out += "\n  " + name(r, s) + ": ";
    using ph = gate_state::phase;
    switch (g.now) {
      case ph::idle: out += "has not started the step"; break;
      case ph::failed: out += "failed"; break;
      case ph::stepping:
        out += "stopped in its optimizer step: " + std::to_string(g.done) + " of " + std::to_string(g.layers) +
               " layers done";
        break;
      case ph::running:
        out += "stopped in " + act(g.next) + ", admitted and running: " + std::to_string(g.done) + " of " +
               std::to_string(g.layers) + " layers done (a layer of this stage does not return)";
        break;
      case ph::waiting:
        out += g.has_next ? "admitted to run " + act(g.next) + " next, " : std::string();
        if (g.credits) {
          out += "waits for a credit: a gradient from " + name(r, std::uint32_t(g.from_stage));
        } else if (g.from_stage >= 0 && !g.has_next) {
          out += "waits for gradients from " + name(r, std::uint32_t(g.from_stage));
        } else if (g.from_stage >= 0) {
          out += "waits for the " + std::string(g.forward ? "activations" : "gradients") + " of micro-batch " +
                 std::to_string(g.next.micro_batch) + " from " + name(r, std::uint32_t(g.from_stage)) + " (" +
                 std::to_string(g.have) + " of " + std::to_string(g.need) + " arrived)";
        } else {
          out += "waits";
        }
        if (g.from_stage >= 0 && rank_of(r, std::uint32_t(g.from_stage)) != me_)
          silent.insert(rank_of(r, std::uint32_t(g.from_stage)));
        break;
    }
    out += "; " + std::to_string(g.actions_done) + " of " + std::to_string(g.actions) + " actions done";
    if (s + 1 < S || plan_.chunks > 1)
      out += "; edge to " + name(r, (s + 1) % S) + ": " + std::to_string(g.out) + " micro-batches out, gradients not back" +
             (g.credit_limit ? " (credits " + std::to_string(g.credit_limit) + ")" : std::string());
  }
  for (int q : silent) out += "\n  nothing came from rank " + std::to_string(q) + " for " + secs + " s";
  return out;
}

layers::step_result pipeline::evaluate(layers::tensor input, const layers::targets& t) {
  return forward_only(std::move(input), &t, nullptr);
}

layers::tensor pipeline::predict(layers::tensor input) {
  layers::tensor out;
  forward_only(std::move(input), nullptr, &out);
  return out;
}

layers::step_result pipeline::forward_only(layers::tensor input, const layers::targets* t, layers::tensor* out) {
  if (failed_) throw std::logic_error("pipeline: a previous step failed; the stages are stopped");
  const std::int64_t n = input.batch();
  if (n < 1) throw std::invalid_argument("pipeline: nothing to evaluate (a batch of 0 rows)");
  if (t && t->size() != n)
    throw std::invalid_argument("pipeline: " + std::to_string(t->size()) + " targets for a batch of " +
                                std::to_string(n));
  const std::uint32_t S = plan_.stages;
  // As many replicas and micro-batches as the rows allow: a small last batch still runs.
  const auto R = std::uint32_t(std::min<std::int64_t>(replicas_, n));
  auto addrs = std::make_shared<const std::vector<actors::address>>(stages_);
  std::vector<step_msg> msgs(std::size_t(S) * replicas_);
  std::vector<bool> local(msgs.size());
  for (std::size_t i = 0; i < msgs.size(); ++i) {
    const auto r = std::uint32_t(i / S);
    local[i] = r < R && here(r, std::uint32_t(i % S));
    msgs[i] = {.stages = addrs, .replica = r, .train = false, .want_output = out != nullptr};
  }
  const auto parts = layers::split_micro_batches(n, R);
  std::vector<std::int64_t> counts;  // per (replica, micro-batch), in row order
  std::vector<std::size_t> last_of;  // the report index of each of those micro-batches
  for (std::uint32_t r = 0; r < R; ++r) {
    const auto M = std::uint32_t(std::min<std::int64_t>(plan_.micro_batches, parts[r].count));
    const auto micro = layers::split_micro_batches(parts[r].count, M);
    for (std::uint32_t m = 0; m < M; ++m) {
      const std::int64_t first = parts[r].first + micro[m].first, count = micro[m].count;
      for (std::uint32_t s = 0; s < S; ++s) ++msgs[r * S + s].evaluations;
      if (local[r * S]) msgs[r * S].inputs.push_back(input.slice(first, count));
      if (local[r * S + S - 1]) msgs[r * S + S - 1].targets.push_back(t ? t->slice(first, count) : layers::targets{});
      counts.push_back(count);
      last_of.push_back(r * S + S - 1);
    }
  }
  auto reports = run_stages(msgs, local);
  if (options_.link) {
    exchange(reports, local);
    if (out) exchange_outputs(reports, local);
  }
  layers::step_result result;
  result.samples = n;
  std::vector<std::size_t> next(reports.size(), 0);  // the next micro-batch of each last stage
  std::vector<const layers::tensor*> rows;
  for (std::size_t k = 0; k < counts.size(); ++k) {
    const auto& last = reports[last_of[k]];
    const auto m = next[last_of[k]]++;
    result.loss += double(counts[k]) / double(n) * last.losses.at(m);
    result.correct += last.correct.at(m);
    if (out) rows.push_back(&last.outputs.at(m));
  }
  if (out) {
    *out = layers::tensor(n, rows.front()->sample_shape());
    std::int64_t at = 0;
    for (const auto* r : rows) {
      out->matrix().middleRows(at, r->batch()) = r->matrix();
      at += r->batch();
    }
  }
  return result;
}

layers::step_result pipeline::train_step(layers::tensor input, const layers::targets& t, std::uint64_t step, double lr) {
  if (failed_) throw std::logic_error("pipeline: a previous step failed; the stages are stopped");
  const std::int64_t n = input.batch();
  const std::uint32_t M = plan_.micro_batches, S = plan_.stages, R = replicas_;
  if (n < std::int64_t(M) * R)
    throw std::invalid_argument("pipeline: cannot split a batch of " + std::to_string(n) + " into " +
                                (R > 1 ? std::to_string(R) + " replicas × " : std::string()) + std::to_string(M) +
                                " micro-batches");
  if (t.size() != n)
    throw std::invalid_argument("pipeline: " + std::to_string(t.size()) + " targets for a batch of " + std::to_string(n));
  auto addrs = std::make_shared<const std::vector<actors::address>>(stages_);
  // Replica r takes rows [first_r, first_r + n_r), cut into M micro-batches; the loss
  // gradient of each is scaled by its share of all n rows, so the replicas' sum is the
  // gradient of the mean over the whole batch.
  std::vector<step_msg> msgs(std::size_t(S) * R);
  std::vector<std::int64_t> counts;  // per (replica, micro-batch)
  // The one split rule (layers/plan.hpp), twice: the batch over the replicas, each part
  // over the micro-batches.
  const auto parts = layers::split_micro_batches(n, R);
  // Across ranks a rank asks only its own stages (the others' slices are not cut).
  std::vector<bool> local(msgs.size());
  for (std::size_t i = 0; i < msgs.size(); ++i) {
    local[i] = here(std::uint32_t(i / S), std::uint32_t(i % S));
    msgs[i] = {.step = step, .lr = lr, .stages = addrs, .replica = std::uint32_t(i / S)};
  }
  for (std::uint32_t r = 0; r < R; ++r) {
    const auto micro = layers::split_micro_batches(parts[r].count, M);
    for (std::uint32_t m = 0; m < M; ++m) {
      const std::int64_t first = parts[r].first + micro[m].first, count = micro[m].count;
      auto& out = msgs[r * S + S - 1];
      if (local[r * S]) msgs[r * S].inputs.push_back(M == 1 && R == 1 ? std::move(input) : input.slice(first, count));
      if (local[r * S + S - 1]) {
        out.targets.push_back(M == 1 && R == 1 ? t.clone() : t.slice(first, count));
        out.shares.push_back(double(count) / double(n));
      }
      counts.push_back(count);
    }
  }
  const auto t0 = rt_.trace().now();
  for (auto& m : msgs) m.t0_ns = t0;
  auto reports = run_stages(msgs, local);
  const auto t1 = rt_.trace().now();
  const double wall = double(t1 - t0) * 1e-9;
  if (options_.link) exchange(reports, local);
  layers::step_result result;
  result.samples = n;
  for (std::uint32_t r = 0; r < R; ++r) {
    const auto& last = reports[r * S + S - 1];
    for (std::uint32_t m = 0; m < M; ++m) {
      const double share = double(counts[r * M + m]) / double(n);
      result.loss += share * last.losses[m];  // the direct executor's expression, so the same rounding
      result.correct += last.correct[m];
    }
  }
  last_step_.assign(S, {});
  for (std::uint32_t s = 0; s < S; ++s) {
    auto& r = reports[s];  // replica 0
    auto& x = metrics_[s];
    const double busy = double(r.busy_ns) * 1e-9, waited = double(r.input_wait_ns) * 1e-9,
                 bp = double(r.backpressure_ns) * 1e-9;
    x.busy_s += busy;
    x.idle_s += std::max(0.0, wall - busy);
    x.idle_input_s += waited;
    x.idle_backpressure_s += bp;
    x.idle_optimizer_s += std::max(0.0, wall - busy - waited - bp);
    x.wall_s += wall;
    ++x.steps;
    x.actions += std::int64_t(r.actions.size());
    x.peak_stashed = std::max(x.peak_stashed, r.peak_stashed);
    x.peak_stash_bytes = std::max(x.peak_stash_bytes, r.peak_bytes);
    x.optimizer_s += double(r.optimizer_ns) * 1e-9;
    for (const auto& done : r.actions) {
      const double d = done.end - done.start;
      switch (done.a.op) {
        case op::F: x.f_s += d, ++x.f_count; break;
        case op::B: x.b_s += d, ++x.b_count; break;
        case op::W: x.w_s += d, ++x.w_count; break;
      }
    }
    last_step_[s] = std::move(r.actions);
  }
  auto& rec = rt_.trace();
  if (rec.enabled()) {
    for (std::size_t i = 0; i < reports.size(); ++i) {
      if (!local[i]) continue;  // another rank records its own
      // The wait before the first action and after the optimizer: the step barrier.
      const auto track = stage_track(std::uint32_t(i));
      if (reports[i].begin_ns > t0) rec.span(track, "idle", "idle", t0, reports[i].begin_ns, -1, "optimizer", int(i % S));
      if (t1 > reports[i].end_ns) rec.span(track, "idle", "idle", reports[i].end_ns, t1, -1, "optimizer", int(i % S));
    }
    rec.span(0, "step", "step", t0, t1, -1, nullptr, -1, -1, std::int64_t(step));
  }
  return result;
}

}  // namespace nerve::pipeline

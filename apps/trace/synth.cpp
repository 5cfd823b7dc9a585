#include "apps/trace/synth.hpp"

#include "apps/trace/schedule_plan.hpp"
#include "apps/trace/timeline.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <random>
#include <sstream>
#include <stdexcept>

namespace nerve::trace {
namespace {

// A send happens inside its handler, just before it returns (1 ns before its end), so
// the flow start binds to that slice in every viewer.
constexpr double send_lead_us = 0.001;

struct message {
  double arrival = 0;
  std::int64_t flow = -1;  // -1: from outside (no arrow)
  std::int64_t sender = 0;
};

class generator {
 public:
  generator(const synth_options& o, std::ostream& out) : o_(o), out_(out), rng_(o.seed) {
    truth_.stage_busy_us.assign(static_cast<std::size_t>(o.stages), 0.0);
    truth_.stage_idle_us.assign(static_cast<std::size_t>(o.stages), {});
  }

  synth_truth run() {
    out_ << "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n";
    metadata();
    double t = 0;
    std::int32_t step = 0;
    while (step < std::max(1, o_.steps) || truth_.events < o_.events) t = one_step(step++, t);
    truth_.steps = step;
    truth_.span_us = t;
    out_ << "\n],\n\"nerve\":" << nerve_block().dump() << "}\n";
    return truth_;
  }

 private:
  std::int64_t actor(std::int32_t stage, std::int32_t k) const { return 2 + stage * o_.actors_per_stage + k; }
  static std::int64_t stage_track(std::int32_t stage) { return stage_tid_base + stage; }

  double jittered(double base) {
    if (o_.jitter <= 0) return base;
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    // Whole nanoseconds, as written: then start + dur of one run is the next run's start.
    return std::round(base * (1.0 + o_.jitter * u(rng_)) * 1000.0) / 1000.0;
  }

  void emit(const char* format, ...) __attribute__((format(printf, 2, 3))) {
    char buf[640];
    va_list ap;
    va_start(ap, format);
    const int n = std::vsnprintf(buf, sizeof buf, format, ap);
    va_end(ap);
    if (truth_.events > 0) out_.write(",\n", 2);
    out_.write(buf, std::min<int>(n, static_cast<int>(sizeof buf) - 1));
    ++truth_.events;
  }

  void metadata() {
    const auto pid = static_cast<long long>(o_.pid);
    emit(R"j({"ph":"M","name":"process_name","pid":%lld,"tid":0,"args":{"name":"nerve rank %lld (synthetic 1f1b)"}})j", pid, pid);
    auto thread = [&](std::int64_t tid, const std::string& name, long long sort) {
      emit(R"j({"ph":"M","name":"thread_name","pid":%lld,"tid":%lld,"args":{"name":"%s"}})j", pid, static_cast<long long>(tid), name.c_str());
      emit(R"j({"ph":"M","name":"thread_sort_index","pid":%lld,"tid":%lld,"args":{"sort_index":%lld}})j", pid, static_cast<long long>(tid), sort);
    };
    thread(0, "outside", -20);
    thread(1, "data", -10);
    for (std::int32_t s = 0; s < o_.stages; ++s) {
      thread(stage_track(s), "stage " + std::to_string(s), s * 100);
      for (std::int32_t k = 0; k < o_.actors_per_stage; ++k) thread(actor(s, k), actor_name(s, k), s * 100 + 1 + k);
    }
  }

  std::string actor_name(std::int32_t s, std::int32_t k) const {
    // Appended piece by piece: GCC 12 warns falsely (-Wrestrict) on "s" + std::to_string(...).
    std::string name("s");
    name += std::to_string(s);
    name += ".fc";
    name += std::to_string(k);
    return name;
  }

  nlohmann::json nerve_block() const {
    using json = nlohmann::json;
    json actors = json::array();
    actors.push_back({{"id", 1}, {"name", "data"}, {"loop", o_.stages}, {"stage", -1}, {"group", "data"}});
    json stages = json::array();
    json actions = json::array();
    for (std::int32_t s = 0; s < o_.stages; ++s) {
      json ids = json::array();
      for (std::int32_t k = 0; k < o_.actors_per_stage; ++k) {
        actors.push_back({{"id", actor(s, k)}, {"name", actor_name(s, k)}, {"loop", s}, {"stage", s}, {"group", "net"}});
        ids.push_back(actor(s, k));
      }
      stages.push_back({{"stage", s}, {"actors", ids}, {"loop", s}, {"device", "cpu"}});
      json list = json::array();
      for (const auto& a : one_f_one_b(o_.stages, s, o_.microbatches))
        list.push_back({{"op", std::string(1, a.op)}, {"mb", a.mb}, {"chunk", a.chunk}});
      actions.push_back(std::move(list));
    }
    return {{"version", 1}, {"actors", actors}, {"stages", stages},
            {"schedule", {{"name", "1f1b"}, {"stages", o_.stages}, {"microbatches", o_.microbatches}, {"chunks", 1}, {"actions", actions}}}};
  }

  message send(std::int64_t from, std::int64_t to, const char* kind, std::int32_t mb, double ts) {
    // A send just before a run that ends at 0 (a zero-time load) would come before the
    // trace's start; traces hold no negative times.
    ts = std::max(0.0, ts);
    const auto id = static_cast<long long>(next_flow_++);
    emit(R"j({"ph":"s","cat":"msg","name":"%s","pid":%lld,"tid":%lld,"ts":%.3f,"id":%lld,"args":{"id":%lld,"bytes":%d,"mb":%d,"to":%lld}})j",
         kind, static_cast<long long>(o_.pid), static_cast<long long>(from), ts, id, id, bytes(kind), mb, static_cast<long long>(to));
    ++truth_.flows;
    ++truth_.actor_messages_out[from];
    return {ts, id, from};
  }

  static int bytes(const char* kind) { return kind[0] == 's' ? 64 : 4096; }

  // One handler run, with the flow end of the message it handles.
  void handle(std::int64_t tid, std::int32_t loop, const char* kind, std::int32_t mb, double start, double dur, const message& in) {
    const auto pid = static_cast<long long>(o_.pid);
    if (in.flow >= 0)
      emit(R"j({"ph":"f","bp":"e","cat":"msg","name":"%s","pid":%lld,"tid":%lld,"ts":%.3f,"id":%lld,"args":{"id":%lld}})j", kind, pid,
           static_cast<long long>(tid), start, static_cast<long long>(in.flow), static_cast<long long>(in.flow));
    emit(R"j({"ph":"X","cat":"handler","name":"%s","pid":%lld,"tid":%lld,"ts":%.3f,"dur":%.3f,"args":{"loop":%d,"mb":%d,"bytes":%d,"queue_us":%.3f,"sender":%lld}})j",
         kind, pid, static_cast<long long>(tid), start, dur, loop, mb, bytes(kind), start - in.arrival, static_cast<long long>(in.sender));
    ++truth_.handler_runs;
    truth_.actor_busy_us[tid] += dur;
    ++truth_.actor_messages_in[tid];
    mailbox_[tid].push_back({in.arrival, start});
  }

  struct span {
    double start, end;
    char op;
    std::int32_t mb;
  };

  double one_step(std::int32_t step, double t0) {
    const auto S = o_.stages, M = o_.microbatches, K = o_.actors_per_stage;
    const auto pid = static_cast<long long>(o_.pid);
    mailbox_.clear();
    truth_.step_start_us.push_back(t0);
    std::vector<std::vector<message>> fin(S, std::vector<message>(M)), bin(S, std::vector<message>(M));
    std::vector<std::vector<char>> fready(S, std::vector<char>(M, 0)), bready(S, std::vector<char>(M, 0));

    // The data actor loads micro-batches one after the other and sends each on.
    double t = t0;
    for (std::int32_t m = 0; m < M; ++m) {
      const double dur = jittered(o_.load_us);
      handle(1, S, "load", m, t, dur, message{t, -1, 0});
      t += dur;
      fin[0][m] = send(1, actor(0, 0), "forward", m, t - send_lead_us);
      fready[0][m] = 1;
    }

    std::vector<std::vector<planned_action>> lists(S);
    for (std::int32_t s = 0; s < S; ++s) lists[s] = one_f_one_b(S, s, M);
    std::vector<double> free_at(S, t0);
    std::vector<std::size_t> next(S, 0);
    std::vector<std::vector<span>> spans(S);
    std::vector<std::int32_t> in_flight(S, 0);
    std::size_t placed = 0, total = static_cast<std::size_t>(S) * 2 * M;
    std::int64_t last_tid = 1;
    double last_end = t;
    while (placed < total) {
      bool progress = false;
      for (std::int32_t s = 0; s < S; ++s) {
        while (next[s] < lists[s].size()) {
          const auto a = lists[s][next[s]];
          const bool fwd = a.op == 'F';
          if (!(fwd ? fready[s][a.mb] : bready[s][a.mb])) break;
          message in = fwd ? fin[s][a.mb] : bin[s][a.mb];
          const double start = std::max(free_at[s], in.arrival);
          const char* kind = fwd ? "forward" : "backward";
          if (fwd) {
            ++in_flight[s];
            emit(R"j({"ph":"C","cat":"credits","name":"credits","pid":%lld,"tid":%lld,"id":%d,"ts":%.3f,"args":{"available":%d}})j", pid,
                 static_cast<long long>(stage_track(s)), s, start, (S - s) - in_flight[s]);
          }
          double now = start;
          for (std::int32_t j = 0; j < K; ++j) {
            const std::int32_t k = fwd ? j : K - 1 - j;
            const auto tid = actor(s, k);
            const double dur = jittered(fwd ? o_.forward_us : o_.backward_us);
            handle(tid, s, kind, a.mb, now, dur, in);
            now += dur;
            const double sent = now - send_lead_us;
            if (j + 1 < K) {
              in = send(tid, actor(s, fwd ? k + 1 : k - 1), kind, a.mb, sent);
            } else if (fwd && s + 1 < S) {
              fin[s + 1][a.mb] = send(tid, actor(s + 1, 0), "forward", a.mb, sent);
              fready[s + 1][a.mb] = 1;
            } else if (fwd) {  // the loss: backward starts on the last actor itself
              bin[s][a.mb] = send(tid, tid, "backward", a.mb, sent);
              bready[s][a.mb] = 1;
            } else if (s > 0) {
              bin[s - 1][a.mb] = send(tid, actor(s - 1, K - 1), "backward", a.mb, sent);
              bready[s - 1][a.mb] = 1;
            }
            if (now > last_end) {
              last_end = now;
              last_tid = tid;
            }
          }
          emit(R"j({"ph":"X","cat":"action","name":"%c","pid":%lld,"tid":%lld,"ts":%.3f,"dur":%.3f,"args":{"mb":%d,"chunk":0,"stage":%d,"step":%zu}})j",
               a.op, pid, static_cast<long long>(stage_track(s)), start, now - start, a.mb, s, next[s]);
          if (!fwd) {
            --in_flight[s];
            emit(R"j({"ph":"C","cat":"credits","name":"credits","pid":%lld,"tid":%lld,"id":%d,"ts":%.3f,"args":{"available":%d}})j", pid,
                 static_cast<long long>(stage_track(s)), s, now, (S - s) - in_flight[s]);
          }
          spans[s].push_back({start, now, a.op, a.mb});
          truth_.stage_busy_us[s] += now - start;
          free_at[s] = now;
          ++next[s];
          ++placed;
          progress = true;
        }
      }
      if (!progress) break;  // cannot happen for 1F1B; guards a future schedule change
    }

    // The optimizer: the run that finished last tells every actor to step.
    std::vector<message> step_msgs;
    for (std::int32_t s = 0; s < S; ++s)
      for (std::int32_t k = 0; k < K; ++k) step_msgs.push_back(send(last_tid, actor(s, k), "step", -1, last_end - send_lead_us));
    double step_end = last_end;
    std::vector<std::pair<double, double>> optimizer(S);
    for (std::int32_t s = 0; s < S; ++s) {
      double now = std::max(free_at[s], last_end - send_lead_us);
      optimizer[s].first = now;
      for (std::int32_t k = 0; k < K; ++k) {
        const double dur = jittered(o_.optimizer_us);
        handle(actor(s, k), s, "step", -1, now, dur, step_msgs[static_cast<std::size_t>(s * K + k)]);
        now += dur;
      }
      optimizer[s].second = now;
      truth_.stage_busy_us[s] += now - optimizer[s].first;
      step_end = std::max(step_end, now);
    }

    // Idle gaps per stage, with their cause.
    for (std::int32_t s = 0; s < S; ++s) {
      auto idle = [&](double a, double b, const char* cause) {
        if (b - a <= 1e-9) return;
        emit(R"j({"ph":"X","cat":"idle","name":"idle","pid":%lld,"tid":%lld,"ts":%.3f,"dur":%.3f,"args":{"cause":"%s","stage":%d}})j", pid,
             static_cast<long long>(stage_track(s)), a, b - a, cause, s);
        truth_.stage_idle_us[s][cause] += b - a;
      };
      double cursor = t0;
      for (const auto& sp : spans[s]) {
        const char* cause = "input";
        if (sp.op == 'B') {
          // Waiting for a backward while a forward sits in the mailbox: held back by credits.
          for (std::int32_t m = 0; m < M; ++m) {
            if (!fready[s][m] || fin[s][m].arrival > cursor) continue;
            bool started = false;
            for (const auto& other : spans[s])
              if (other.op == 'F' && other.mb == m && other.start <= cursor) started = true;
            if (!started) cause = "backpressure";
          }
        }
        idle(cursor, sp.start, cause);
        cursor = sp.end;
      }
      idle(cursor, optimizer[s].first, "optimizer");
      idle(optimizer[s].second, step_end, "optimizer");
    }

    // Mailbox depth after each enqueue and dequeue, per actor (`id` keeps one counter track per actor).
    for (auto& [tid, list] : mailbox_) {
      for (std::size_t i = 0; i < list.size(); ++i) {
        std::int32_t at_enqueue = 0, at_dequeue = 0;
        for (std::size_t j = 0; j < list.size(); ++j) {
          if (list[j].first <= list[i].first && (list[j].second > list[i].first || j == i)) ++at_enqueue;
          if (j != i && list[j].first <= list[i].second && list[j].second > list[i].second) ++at_dequeue;
        }
        emit(R"j({"ph":"C","cat":"mailbox","name":"mailbox","pid":%lld,"tid":%lld,"id":%lld,"ts":%.3f,"args":{"depth":%d}})j", pid,
             static_cast<long long>(tid), static_cast<long long>(tid), list[i].first, at_enqueue);
        emit(R"j({"ph":"C","cat":"mailbox","name":"mailbox","pid":%lld,"tid":%lld,"id":%lld,"ts":%.3f,"args":{"depth":%d}})j", pid,
             static_cast<long long>(tid), static_cast<long long>(tid), list[i].second, at_dequeue);
      }
    }

    emit(R"j({"ph":"X","cat":"step","name":"step","pid":%lld,"tid":0,"ts":%.3f,"dur":%.3f,"args":{"step":%d}})j", pid, t0, step_end - t0, step);
    truth_.step_end_us.push_back(step_end);
    return step_end;
  }

  synth_options o_;
  std::ostream& out_;
  std::mt19937_64 rng_;
  synth_truth truth_;
  std::int64_t next_flow_ = 1;
  std::map<std::int64_t, std::vector<std::pair<double, double>>> mailbox_;  // (arrival, start) per actor, this step
};

}  // namespace

void check(const synth_options& o) {
  using L = synth_limits;
  auto fail = [](const std::string& field, const std::string& range, double got) {
    std::ostringstream os;
    os << "synth: " << field << " " << got << " is out of range: it must be " << range;
    throw std::invalid_argument(os.str());
  };
  if (o.events > L::max_events) fail("events", "from 0 to " + std::to_string(L::max_events), double(o.events));
  if (o.steps < 1 || o.steps > L::max_steps) fail("steps", "from 1 to " + std::to_string(L::max_steps), o.steps);
  if (o.stages < 1 || o.stages > L::max_stages) fail("stages", "from 1 to " + std::to_string(L::max_stages), o.stages);
  if (o.microbatches < 1 || o.microbatches > L::max_microbatches)
    fail("microbatches", "from 1 to " + std::to_string(L::max_microbatches), o.microbatches);
  if (o.actors_per_stage < 1 || o.actors_per_stage > L::max_actors_per_stage)
    fail("actors_per_stage", "from 1 to " + std::to_string(L::max_actors_per_stage), o.actors_per_stage);
  const std::pair<const char*, double> times[] = {
      {"forward_us", o.forward_us}, {"backward_us", o.backward_us}, {"load_us", o.load_us}, {"optimizer_us", o.optimizer_us}};
  for (auto [field, us] : times)
    if (!(us >= 0 && us <= L::max_time_us)) fail(field, "a finite number from 0 to 10000000 (µs)", us);
  if (!(o.jitter >= 0 && o.jitter <= L::max_jitter)) fail("jitter", "a finite number from 0 to 0.99", o.jitter);

  // No stage waits while nothing runs (messages arrive as they are sent), so a step
  // lasts at most the sum of its handler runs, each at most (1 + jitter) times its base.
  const double S = o.stages, M = o.microbatches, K = o.actors_per_stage;
  const double runs_per_step = M + S * K * (2 * M + 1);
  const double steps = std::max<double>(o.steps, std::ceil(double(o.events) / runs_per_step) + 1);
  if (steps * runs_per_step > double(L::max_handler_runs)) {
    std::ostringstream os;
    os << "synth: the run would write " << steps * runs_per_step << " handler runs (" << steps << " steps), more than the "
       << L::max_handler_runs << " allowed; ask for fewer steps, events, stages, micro-batches or actors";
    throw std::invalid_argument(os.str());
  }
  const double step_us = (1 + o.jitter) * (M * o.load_us + S * K * (M * (o.forward_us + o.backward_us) + o.optimizer_us)) + 1;
  if (steps * step_us > nerve::trace::max_time_us) {
    std::ostringstream os;
    os << "synth: the run would last up to " << steps * step_us << " µs (" << steps << " steps), beyond the " << nerve::trace::max_time_us
       << " µs a trace may hold; ask for fewer steps or events, or shorter times";
    throw std::invalid_argument(os.str());
  }
}

synth_truth write_synthetic_trace(const synth_options& options, std::ostream& out) {
  check(options);
  return generator(options, out).run();
}

}  // namespace nerve::trace

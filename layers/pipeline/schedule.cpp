#include "layers/pipeline/schedule.hpp"

#include <algorithm>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>

namespace nerve::pipeline {

namespace {

constexpr double never = std::numeric_limits<double>::infinity();

/// An action of a piece that another action waits for (or its own F for B, its B for W).
struct dependency {
  op o;
  std::uint32_t micro_batch, piece;
};

/// End times of every (op, micro-batch, piece), `never` until it ran.
struct done_table {
  std::uint32_t micro_batches, pieces;
  std::vector<double> end = std::vector<double>(std::size_t(3) * micro_batches * pieces, never);
  double& operator[](const dependency& d) {
    const std::size_t o = d.o == op::F ? 0 : d.o == op::B ? 1 : 2;
    return end[(o * micro_batches + d.micro_batch) * pieces + d.piece];
  }
};

std::vector<dependency> dependencies_of(const schedule& s, std::uint32_t stage, const action& a) {
  const std::uint32_t p = s.piece(stage, a.chunk);
  std::vector<dependency> d;
  switch (a.op) {
    case op::F:
      if (p > 0) d.push_back({op::F, a.micro_batch, p - 1});
      break;
    case op::B:
      d.push_back({op::F, a.micro_batch, p});
      if (p + 1 < s.pieces()) d.push_back({op::B, a.micro_batch, p + 1});
      break;
    case op::W:
      d.push_back({op::B, a.micro_batch, p});
      break;
  }
  return d;
}

double cost_of(const schedule& s, op o, const action_costs& c) {
  switch (o) {
    case op::F: return c.f;
    case op::B: return s.split_backward ? c.b : c.b + c.w;
    case op::W: return c.w;
  }
  return 0;
}

std::string where(std::uint32_t stage, std::size_t step) {
  return "stage " + std::to_string(stage) + ", step " + std::to_string(step);
}

std::string describe(const schedule& s, const action& a) {
  std::string t = std::string(1, char(a.op)) + " of micro-batch " + std::to_string(a.micro_batch);
  if (s.chunks > 1) t += " chunk " + std::to_string(a.chunk);
  return t;
}

/// A run of a schedule: its timeline, the position each stage got to (all sizes:
/// finished), and when each action ended (`never`: it did not run).
struct run_state {
  simulation sim;
  std::vector<std::size_t> next;
  done_table done;
};

/// Runs the schedule: each stage's next action starts once its stage is free and its
/// dependencies ended. `costs` has one entry per stage.
run_state run(const schedule& s, const std::vector<action_costs>& costs) {
  run_state r{{}, std::vector<std::size_t>(s.stages, 0), {s.micro_batches, s.pieces()}};
  for (const auto& l : s.actions) {
    r.sim.start.emplace_back(l.size());
    r.sim.end.emplace_back(l.size());
  }
  for (bool progress = true; progress;) {
    progress = false;
    for (std::uint32_t st = 0; st < s.stages; ++st) {
      for (auto& i = r.next[st]; i < s.actions[st].size(); ++i) {
        const action& a = s.actions[st][i];
        const auto deps = dependencies_of(s, st, a);
        if (std::any_of(deps.begin(), deps.end(), [&](auto& d) { return r.done[d] == never; })) break;
        double ready = i > 0 ? r.sim.end[st][i - 1] : 0;  // when the stage is free
        for (const auto& d : deps) ready = std::max(ready, r.done[d]);
        const double end = ready + cost_of(s, a.op, costs[st]);
        r.done[{a.op, a.micro_batch, s.piece(st, a.chunk)}] = end;
        if (!s.split_backward && a.op == op::B) r.done[{op::W, a.micro_batch, s.piece(st, a.chunk)}] = end;
        r.sim.start[st][i] = ready;
        r.sim.end[st][i] = end;
        progress = true;
      }
    }
  }
  return r;
}

void check_shape(const schedule& s) {
  if (s.stages == 0) throw schedule_error("schedule: 0 stages", -1, -1);
  if (s.micro_batches == 0) throw schedule_error("schedule: 0 micro-batches", -1, -1);
  if (s.chunks == 0) throw schedule_error("schedule: 0 chunks", -1, -1);
  if (s.actions.size() != s.stages)
    throw schedule_error("schedule: " + std::to_string(s.stages) + " stages but " + std::to_string(s.actions.size()) +
                             " action lists",
                         int(std::min(s.actions.size(), std::size_t(s.stages))), 0);
}

/// Interleaved 1F1B when S does not divide M: Megatron's priorities (B first; among ready
/// actions the smallest (group of S micro-batches, chunk, position) key, chunks ascending for
/// F and descending for B; F bounded by `in_flight_limit`) by a unit-time list simulation.
schedule interleave_by_simulation(schedule s, const std::vector<std::uint32_t>& in_flight_limit) {
  const std::uint32_t S = s.stages, M = s.micro_batches, V = s.chunks;
  done_table done{M, s.pieces()};
  struct stage_state {
    double free_at = 0;
    std::set<std::pair<std::uint32_t, std::uint32_t>> f_left, b_left;  // (mb, chunk)
    std::uint32_t in_flight = 0;                                        // F done, B not
  };
  std::vector<stage_state> st(S);
  for (auto& x : st)
    for (std::uint32_t m = 0; m < M; ++m)
      for (std::uint32_t c = 0; c < V; ++c) x.f_left.insert({m, c}), x.b_left.insert({m, c});
  auto best_ready = [&](std::uint32_t stage, op o, const auto& left, double t) {
    std::optional<action> pick;
    std::tuple<std::uint32_t, std::uint32_t, std::uint32_t> best;
    for (auto [m, c] : left) {
      const action a{o, m, c};
      const auto deps = dependencies_of(s, stage, a);
      if (std::any_of(deps.begin(), deps.end(), [&](auto& d) { return done[d] > t; }))
        continue;
      const auto k = std::make_tuple(m / S, o == op::F ? c : V - 1 - c, m % S);
      if (!pick || k < best) best = k, pick = a;
    }
    return pick;
  };
  std::size_t remaining = std::size_t(S) * M * V * 2;
  bool relaxed = false;
  double t = 0;
  while (remaining > 0) {
    bool acted = false;
    for (std::uint32_t i = 0; i < S; ++i) {
      auto& x = st[i];
      if (x.free_at > t) continue;
      // B first (frees memory, unblocks the stage above).
      auto pick = best_ready(i, op::B, x.b_left, t);
      if (!pick && (relaxed || x.in_flight < in_flight_limit[i])) pick = best_ready(i, op::F, x.f_left, t);
      if (!pick) continue;
      const action a = *pick;
      const double end = t + cost_of(s, a.op, {1, 2, 1});
      done[{a.op, a.micro_batch, s.piece(i, a.chunk)}] = end;
      x.free_at = end;
      s.actions[i].push_back(a);
      --remaining;
      acted = true;
      if (a.op == op::F) x.f_left.erase({a.micro_batch, a.chunk}), ++x.in_flight;
      else x.b_left.erase({a.micro_batch, a.chunk}), --x.in_flight;
    }
    // Next event: the earliest time after t at which a stage frees up.
    double next = never;
    for (auto& x : st)
      if (x.free_at > t) next = std::min(next, x.free_at);
    if (next == never) {
      if (!acted && remaining > 0) {
        if (relaxed) throw std::logic_error("schedule: the generator for '" + s.name + "' stalled");
        relaxed = true;  // the limits admit no progress: let forwards through
      }
      continue;
    }
    t = next;
  }
  return s;
}

}  // namespace

std::string to_string(const action& a, bool with_chunk) {
  std::string t = std::string(1, char(a.op)) + std::to_string(a.micro_batch);
  if (with_chunk) t += "." + std::to_string(a.chunk);
  return t;
}

std::string_view to_string(schedule_kind k) noexcept {
  switch (k) {
    case schedule_kind::gpipe: return "gpipe";
    case schedule_kind::one_f_one_b: return "1f1b";
    case schedule_kind::interleaved: return "interleaved";
    case schedule_kind::zb_h1: return "zb-h1";
  }
  return "?";
}

schedule make_schedule(std::string_view name, std::uint32_t stages, std::uint32_t micro_batches,
                       std::uint32_t chunks) {
  for (auto k : {schedule_kind::gpipe, schedule_kind::one_f_one_b, schedule_kind::interleaved, schedule_kind::zb_h1})
    if (name == to_string(k)) return make_schedule(k, stages, micro_batches, chunks);
  throw std::invalid_argument("schedule: unknown schedule '" + std::string(name) +
                              "' (known: gpipe, 1f1b, interleaved, zb-h1)");
}

schedule make_schedule(schedule_kind kind, std::uint32_t stages, std::uint32_t micro_batches, std::uint32_t chunks) {
  if (stages == 0 || micro_batches == 0 || chunks == 0)
    throw std::invalid_argument("schedule: stages, micro-batches and chunks must be at least 1 (got " +
                                std::to_string(stages) + ", " + std::to_string(micro_batches) + ", " +
                                std::to_string(chunks) + ")");
  if (kind == schedule_kind::interleaved && chunks < 2)
    throw std::invalid_argument("schedule: interleaved needs at least 2 chunks per stage (got " +
                                std::to_string(chunks) + ")");
  if (kind != schedule_kind::interleaved && chunks != 1)
    throw std::invalid_argument("schedule: " + std::string(to_string(kind)) + " runs one chunk per stage (got " +
                                std::to_string(chunks) + "); use interleaved");
  schedule s;
  s.name = std::string(to_string(kind));
  s.stages = stages;
  s.micro_batches = micro_batches;
  s.chunks = chunks;
  s.actions.assign(stages, {});
  s.split_backward = kind == schedule_kind::zb_h1;
  const std::uint32_t S = stages, M = micro_batches, V = chunks, total = M * V;
  // Interleaved's warm-up on stage i, and its bound on forwards ahead of backwards.
  const auto interleaved_warm = [&](std::uint32_t i) { return (S - 1 - i) * 2 + (V - 1) * S; };
  if (kind == schedule_kind::interleaved && M % S != 0) {
    std::vector<std::uint32_t> limit;
    for (std::uint32_t i = 0; i < S; ++i) limit.push_back(std::min(interleaved_warm(i) + 1, total));
    return interleave_by_simulation(std::move(s), limit);
  }
  // Every other case is 1F1B's shape (schedule.hpp): stage i's warm-up forwards, then one F
  // and one B in turn, then the remaining Bs; interleaved in Megatron-LM's order (forwards
  // in groups of S micro-batches per chunk, chunk 0 first; backwards last chunk first);
  // zb-h1 with the W of micro-batch k-i after B of k, the first i deferred to the end.
  for (std::uint32_t i = 0; i < S; ++i) {
    auto& a = s.actions[i];
    std::uint32_t warm = std::min(S - 1 - i, M), next_w = 0;
    if (kind == schedule_kind::gpipe) warm = M;
    if (kind == schedule_kind::interleaved) warm = M == S ? total : std::min(interleaved_warm(i), total);
    // The k-th forward and backward (with one chunk, micro-batch k).
    const auto forward = [&](std::uint32_t k) { a.push_back({op::F, (k / (S * V)) * S + k % S, (k % (S * V)) / S}); };
    const auto backward = [&](std::uint32_t k) {
      a.push_back({op::B, (k / (S * V)) * S + k % S, V - 1 - (k % (S * V)) / S});
      if (s.split_backward && k >= i) a.push_back({op::W, next_w++, 0});
    };
    for (std::uint32_t k = 0; k < warm; ++k) forward(k);
    for (std::uint32_t k = 0; k + warm < total; ++k) {
      forward(warm + k);
      backward(k);
    }
    for (std::uint32_t k = total - warm; k < total; ++k) backward(k);
    while (s.split_backward && next_w < M) a.push_back({op::W, next_w++, 0});
  }
  return s;
}

void validate(const schedule& s) {
  check_shape(s);
  const std::uint32_t M = s.micro_batches, V = s.chunks;
  // Per stage: ranges, duplicates, F before B before W.
  for (std::uint32_t st = 0; st < s.stages; ++st) {
    std::set<std::tuple<op, std::uint32_t, std::uint32_t>> seen;
    const auto& list = s.actions[st];
    for (std::size_t i = 0; i < list.size(); ++i) {
      const action& a = list[i];
      const auto fail = [&](const std::string& what) {
        throw schedule_error("schedule '" + s.name + "': " + where(st, i) + ": " + what, int(st), int(i));
      };
      if (a.op != op::F && a.op != op::B && a.op != op::W) fail("unknown action");
      if (a.micro_batch >= M)
        fail(describe(s, a) + ", but there are only " + std::to_string(M) + " micro-batches");
      if (a.chunk >= V) fail("chunk " + std::to_string(a.chunk) + ", but stages have " + std::to_string(V) + " chunks");
      if (a.op == op::W && !s.split_backward) fail("W in a schedule whose B does the whole backward (split 0)");
      if (!seen.insert({a.op, a.micro_batch, a.chunk}).second) fail(describe(s, a) + " runs twice");
      const op before = a.op == op::B ? op::F : op::B;
      if (a.op != op::F && !seen.count({before, a.micro_batch, a.chunk}))
        fail(describe(s, a) + " comes before its " + std::string(1, char(before)));
    }
    // Completeness: what is missing here is awaited elsewhere (F by the next piece, B by the previous).
    for (std::uint32_t c = 0; c < V; ++c)
      for (std::uint32_t m = 0; m < M; ++m)
        for (op o : {op::F, op::B, op::W}) {
          if (o == op::W && !s.split_backward) continue;
          if (seen.count({o, m, c})) continue;
          const action a{o, m, c};
          const std::uint32_t p = s.piece(st, c);
          std::string why;
          if (o == op::F && p + 1 < s.pieces())
            why = "; stage " + std::to_string((p + 1) % s.stages) + " waits for its activation";
          else if (o == op::B && p > 0)
            why = "; stage " + std::to_string((p - 1) % s.stages) + " waits for its gradient";
          else if (o == op::B)
            why = "; the weight gradients of micro-batch " + std::to_string(m) + " would be missing";
          throw schedule_error("schedule '" + s.name + "': stage " + std::to_string(st) + " never runs " +
                                   describe(s, a) + why,
                               int(st), int(list.size()));
        }
  }
  // Wait cycles: simulate, and explain where it stops.
  run_state ran = run(s, std::vector<action_costs>(s.stages));
  const auto& next = ran.next;
  auto& done = ran.done;
  std::uint32_t first = 0;
  while (first < s.stages && next[first] == s.actions[first].size()) ++first;
  if (first == s.stages) return;
  // Each stuck stage waits on the stage owning its first unmet dependency; follow until a repeat.
  auto waits_on = [&](std::uint32_t st) -> std::pair<std::uint32_t, dependency> {
    const action& a = s.actions[st][next[st]];
    for (const auto& d : dependencies_of(s, st, a))
      if (done[d] == never) return {d.piece % s.stages, d};
    return {st, {a.op, a.micro_batch, 0}};
  };
  std::vector<int> visited(s.stages, -1);
  std::vector<std::uint32_t> path;
  std::uint32_t cur = first;
  while (visited[cur] < 0) {
    visited[cur] = int(path.size());
    path.push_back(cur);
    cur = waits_on(cur).first;
  }
  std::string text = "schedule '" + s.name + "': wait cycle: ";
  std::uint32_t fault = cur;
  for (std::size_t k = std::size_t(visited[cur]); k < path.size(); ++k) {
    const std::uint32_t st = path[k];
    fault = std::min(fault, st);
    auto [other, d] = waits_on(st);
    const action& a = s.actions[st][next[st]];
    action dep{d.o, d.micro_batch, d.piece / s.stages};
    if (k != std::size_t(visited[cur])) text += "; ";
    text += where(st, next[st]) + " (" + describe(s, a) + ") waits for stage " + std::to_string(other) + "'s " +
            describe(s, dep);
  }
  throw schedule_error(text, int(fault), int(next[fault]));
}

simulation simulate(const schedule& s, action_costs costs) {
  return simulate(s, std::vector<action_costs>(s.stages, costs));
}

simulation simulate(const schedule& s, const std::vector<action_costs>& per_stage) {
  check_shape(s);
  if (per_stage.size() != s.stages)
    throw std::invalid_argument("simulate: " + std::to_string(per_stage.size()) + " stage costs for " +
                                std::to_string(s.stages) + " stages");
  auto [r, next, done] = run(s, per_stage);
  for (std::uint32_t st = 0; st < s.stages; ++st)
    if (next[st] < s.actions[st].size())
      throw schedule_error("schedule '" + s.name + "': cannot simulate an invalid schedule (validate it)", int(st),
                           int(next[st]));
  for (auto& e : r.end)
    for (double x : e) r.makespan = std::max(r.makespan, x);
  for (std::uint32_t st = 0; st < s.stages; ++st) {
    double busy = 0;
    std::uint32_t held = 0, peak = 0;
    for (std::size_t i = 0; i < s.actions[st].size(); ++i) {
      busy += r.end[st][i] - r.start[st][i];
      const op o = s.actions[st][i].op;
      if (o == op::F) peak = std::max(peak, ++held);
      if ((o == op::B && !s.split_backward) || o == op::W) --held;
    }
    r.bubble.push_back(r.makespan > 0 ? 1.0 - busy / r.makespan : 0.0);
    r.peak_in_flight.push_back(peak);
  }
  return r;
}

double bubble_theory(const schedule& s) {
  if (s.name == "gpipe" || s.name == "1f1b") return double(s.stages - 1) / double(s.micro_batches + s.stages - 1);
  if (s.name == "interleaved") return double(s.stages - 1) / double(s.chunks * s.micro_batches + s.stages - 1);
  if (s.name == "zb-h1") return double(s.stages - 1) / double(3 * s.micro_batches + s.stages - 1);
  const auto sim = simulate(s);
  return std::max(0.0, *std::max_element(sim.bubble.begin(), sim.bubble.end()));
}

std::string to_table(const schedule& s) {
  auto sim = simulate(s);  // unit costs
  const std::size_t slots = static_cast<std::size_t>(sim.makespan + 0.5);
  std::vector<std::vector<std::string>> cells(s.stages, std::vector<std::string>(slots, "."));
  std::size_t width = 1;
  for (std::uint32_t st = 0; st < s.stages; ++st)
    for (std::size_t i = 0; i < s.actions[st].size(); ++i) {
      const auto t0 = static_cast<std::size_t>(sim.start[st][i] + 0.5), t1 = static_cast<std::size_t>(sim.end[st][i] + 0.5);
      const std::string c = to_string(s.actions[st][i], s.chunks > 1);
      for (std::size_t t = t0; t < t1; ++t) cells[st][t] = c;
      width = std::max(width, c.size());
    }
  std::ostringstream o;
  o << s.name << ": " << s.stages << " stage" << (s.stages == 1 ? "" : "s") << ", " << s.micro_batches
    << " micro-batch" << (s.micro_batches == 1 ? "" : "es");
  if (s.chunks > 1) o << ", " << s.chunks << " chunks per stage (F<mb>.<chunk>)";
  o << "; one column per time unit (F, B, W one unit each";
  if (!s.split_backward) o << "; B is the whole backward, two units";
  o << "), '.' = idle\n";
  for (std::uint32_t st = 0; st < s.stages; ++st) {
    o << "stage " << st << " |";
    for (const auto& c : cells[st]) o << ' ' << c << std::string(width - c.size(), ' ');
    o << "  bubble " << static_cast<int>(100 * sim.bubble[st] + 0.5) << "%\n";
  }
  return o.str();
}

std::string to_step_table(const schedule& s) {
  std::size_t width = 1, steps = 0;
  for (const auto& l : s.actions) {
    steps = std::max(steps, l.size());
    for (const auto& a : l) width = std::max(width, to_string(a, s.chunks > 1).size());
  }
  std::ostringstream o;
  o << "step    |";
  for (std::size_t i = 0; i < steps; ++i) {
    auto n = std::to_string(i);
    o << ' ' << n << std::string(width > n.size() ? width - n.size() : 0, ' ');
  }
  o << '\n';
  for (std::uint32_t st = 0; st < s.actions.size(); ++st) {
    o << "stage " << st << " |";
    for (const auto& a : s.actions[st]) {
      auto c = to_string(a, s.chunks > 1);
      o << ' ' << c << std::string(std::max(width, std::to_string(steps).size()) - c.size(), ' ');
    }
    o << '\n';
  }
  return o.str();
}

std::string to_text(const schedule& s) {
  std::ostringstream o;
  o << "# nerve pipeline schedule: one line per stage, actions in the order the stage runs them\n";
  o << "name " << (s.name.empty() ? "custom" : s.name) << "\nstages " << s.stages << "\nmicrobatches "
    << s.micro_batches << "\nchunks " << s.chunks << "\nsplit " << (s.split_backward ? 1 : 0) << '\n';
  for (std::size_t st = 0; st < s.actions.size(); ++st) {
    o << "stage " << st << ':';
    for (const auto& a : s.actions[st]) o << ' ' << to_string(a, s.chunks > 1);
    o << '\n';
  }
  return o.str();
}

schedule parse_schedule(std::string_view text) {
  schedule s;
  s.name = "custom";
  std::istringstream in{std::string(text)};
  std::string line;
  int lineno = 0;
  auto fail = [&](const std::string& why) -> void {
    throw std::invalid_argument("schedule text, line " + std::to_string(lineno) + ": " + why);
  };
  auto number = [&](const std::string& w) -> std::uint32_t {
    if (w.empty() || w.find_first_not_of("0123456789") != std::string::npos || w.size() > 9)
      fail("'" + w + "' is not a count");
    return static_cast<std::uint32_t>(std::stoul(w));
  };
  while (std::getline(in, line)) {
    ++lineno;
    if (auto h = line.find('#'); h != std::string::npos) line.resize(h);
    std::istringstream ls(line);
    std::string key;
    if (!(ls >> key)) continue;
    if (key == "stage") {
      std::string id;
      ls >> id;
      if (id.empty() || id.back() != ':') fail("expected 'stage N:'");
      id.pop_back();
      const std::uint32_t st = number(id);
      if (st != s.actions.size()) fail("stage " + id + " out of order (expected stage " + std::to_string(s.actions.size()) + ")");
      s.actions.emplace_back();
      std::string w;
      while (ls >> w) {
        if (w.size() < 2 || (w[0] != 'F' && w[0] != 'B' && w[0] != 'W'))
          fail("'" + w + "' is not an action (F3, B3, W3, or F3.1 with a chunk)");
        action a;
        a.op = static_cast<op>(w[0]);
        auto dot = w.find('.');
        a.micro_batch = number(w.substr(1, dot == std::string::npos ? std::string::npos : dot - 1));
        if (dot != std::string::npos) a.chunk = number(w.substr(dot + 1));
        s.actions.back().push_back(a);
      }
      continue;
    }
    std::string value;
    if (!(ls >> value)) fail("'" + key + "' needs a value");
    if (key == "name") s.name = value;
    else if (key == "stages") s.stages = number(value);
    else if (key == "microbatches") s.micro_batches = number(value);
    else if (key == "chunks") s.chunks = number(value);
    else if (key == "split") s.split_backward = number(value) != 0;
    else fail("unknown key '" + key + "'");
  }
  return s;
}

void save_schedule(const schedule& s, const std::filesystem::path& path) {
  std::ofstream f(path);
  f << to_text(s);
  f.close();
  if (!f) throw std::runtime_error("schedule: cannot write " + path.string());
}

schedule load_schedule(const std::filesystem::path& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("schedule: cannot read " + path.string());
  std::stringstream buf;
  buf << f.rdbuf();
  try {
    return parse_schedule(buf.str());
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(path.string() + ": " + e.what());
  }
}

}  // namespace nerve::pipeline

// A pipeline whose stages and replicas run on several ranks: run under `mpirun -np N`
// (N = 2 and 3 in ctest). Every rank runs every case and computes the one-process
// reference itself; a failed check on any rank fails the job.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>

#include "bus/mpi/transport.hpp"
#include "gpu/device.hpp"
#include "gpu/layers/device_all_reduce.hpp"
#include "gpu/layers/device_backend.hpp"
#include "gpu/layers/host_all_reduce.hpp"
#include "layers/pipeline/mpi_ranks.hpp"
#include "layers/pipeline/pipeline.hpp"
#include "layers/presets.hpp"
#include "tests/pipeline/chain.hpp"
#include "tests/pipeline/tiny_lm.hpp"

using namespace nerve;
using namespace nerve::pipeline;
using layers::tensor;

namespace {

bus::mpi::transport* world = nullptr;

// Each pipeline takes channels of its own: a transport's listeners stay for its life.
std::shared_ptr<rank_link> fresh_link() {
  static bus::mpi::transport::channel next = 1u << 20;
  next += 1u << 16;
  return mpi_ranks(*world, next);
}

using test::make_batch;

layers::optimizer_factory sgd_factory() {
  return [] { return layers::make_optimizer<float>("sgd", 0.05, 0.9); };
}

layers::graph model(const std::string& name) {
  if (name == "tiny-lm") return test::tiny_lm();  // its head tied to its embedding
  return name == "chain" ? test::small_chain() : layers::make_preset(name, 3);
}

/// `make_batch` for `g`, or token windows with a label per token for the tiny language model.
test::batch batch_of(const std::string& name, const layers::graph& g, std::int64_t n, std::uint64_t seed) {
  if (name != "tiny-lm") return make_batch(g, n, seed);
  auto t = test::tiny_lm_batch(n, seed);
  return {std::move(t.x), std::move(t.t)};
}

/// The number of parameters of `a` that differ from `b`'s by more than `bound` of the
/// tensor's largest entry in `b` (0: by a bit), and that did not move from `start`'s.
int differing(layers::graph& a, layers::graph& b, double bound, layers::graph& start) {
  auto pa = a.parameters(), pb = b.parameters(), p0 = start.parameters();
  REQUIRE(pa.size() == pb.size());
  int n = 0;
  for (std::size_t i = 0; i < pa.size(); ++i) {
    CAPTURE(pa[i].name);
    REQUIRE(pa[i].value->size() == pb[i].value->size());
    double largest = 0, worst = 0, moved = 0;
    for (std::int64_t k = 0; k < pa[i].value->size(); ++k) {
      const double x = pa[i].value->data()[k], y = pb[i].value->data()[k];
      largest = std::max(largest, std::abs(y));
      worst = std::max(worst, std::abs(x - y));
      moved = std::max(moved, std::abs(x - double(p0[i].value->data()[k])));
    }
    CHECK(worst <= bound * largest);
    CHECK(moved > 1e-5);  // it trained: a run that did nothing cannot pass
    n += worst <= bound * largest && moved > 1e-5 ? 0 : 1;
  }
  return n;
}

/// The number of parameters of `a` whose bits differ from `b`'s.
int differing(layers::graph& a, layers::graph& b) {
  auto pa = a.parameters(), pb = b.parameters();
  REQUIRE(pa.size() == pb.size());
  int n = 0;
  for (std::size_t i = 0; i < pa.size(); ++i) {
    CAPTURE(pa[i].name);
    REQUIRE(pa[i].value->size() == pb[i].value->size());
    const bool same =
        std::memcmp(pa[i].value->data(), pb[i].value->data(), std::size_t(pa[i].value->size()) * sizeof(float)) == 0;
    CHECK(same);
    n += same ? 0 : 1;
  }
  return n;
}

/// Sum over the ranks of `v` (every rank gets it).
std::uint64_t total(std::uint64_t v) {
  std::uint64_t sum = 0;
  for (auto& s : world->all_gather(std::to_string(v))) sum += std::stoull(s);
  return sum;
}

/// Where the stages of a run are: the CPU, or the CPU stand-in of a GPU (every stage; the
/// replicas of a stage share its device in one process, each on a stream of its own).
enum class stages_on { cpu, standin };

/// What a run's reducers are, on this rank: how many of each kind.
struct reducer_kinds {
  int on_device = 0, through_host = 0, host = 0;
};
reducer_kinds kinds_of(const nerve::pipeline::pipeline& p) {
  reducer_kinds k;
  for (auto& a : p.reducers()) {
    if (dynamic_cast<gpu::device_all_reduce*>(a.get())) ++k.on_device;
    else if (dynamic_cast<gpu::host_all_reduce*>(a.get())) ++k.through_host;
    else ++k.host;
  }
  return k;
}

/// Trains `steps` steps through `plan` placed on the ranks as `options` says, and through
/// the reference (`replicas` graphs in one process, or the direct executor for one), the
/// stages of each on the CPU or the stand-in; checks weights bitwise on every rank, the
/// loss, and the forwards and gradients counted over the ranks. `inspect` sees the run
/// across the ranks after its steps.
void check_across(const std::string& name, const schedule& plan, std::uint32_t replicas, int steps,
                  std::int64_t batch_size, pipeline_options options = {}, stages_on across_on = stages_on::cpu,
                  stages_on reference_on = stages_on::cpu,
                  const std::function<void(const nerve::pipeline::pipeline&)>& inspect = {}) {
  options.link = fresh_link();
  auto crit = std::make_shared<layers::cross_entropy>();
  actors::runtime rt(actors::runtime_options{.loops = 2});
  // After the runtime, so that it closes first: its completions post to the loops.
  std::optional<gpu::device> standin;
  if (across_on == stages_on::standin || reference_on == stages_on::standin)
    standin.emplace(gpu::device_options{.backend = gpu::backend_kind::standin});
  const auto stages_of = [&](stages_on where) {
    std::vector<stage_backend_factory> f;
    for (std::uint32_t s = 0; s < plan.stages && where == stages_on::standin; ++s)
      f.push_back([d = &*standin](layers::graph& g, const std::vector<std::size_t>& nodes) {
        gpu::device_backend_options so;
        so.make_optimizer = [] { return layers::make_optimizer<float>("sgd", 0.05, 0.9); };  // sgd_factory's
        so.nodes = nodes;
        return std::make_shared<gpu::device_backend>(*d, g, so);
      });
    return f;
  };
  options.backends = stages_of(across_on);
  const bool bitwise = across_on == reference_on;
  std::vector<layers::graph> spread, here;
  for (std::uint32_t r = 0; r < replicas; ++r) {
    spread.push_back(model(name));
    here.push_back(model(name));
  }
  std::vector<layers::graph*> sp, hp;
  for (std::uint32_t r = 0; r < replicas; ++r) {
    sp.push_back(&spread[r]);
    hp.push_back(&here[r]);
  }
  const auto pieces = partition_by_parameters(spread[0], plan.pieces());
  nerve::pipeline::pipeline across(rt, sp, pieces, plan, crit, sgd_factory(), options);
  pipeline_options one_process = options;
  one_process.link = nullptr;
  one_process.ranks.clear();
  one_process.backends = stages_of(reference_on);
  nerve::pipeline::pipeline reference(rt, hp, pieces, plan, crit, sgd_factory(), one_process);
  for (int s = 0; s < steps; ++s) {
    auto a = batch_of(name, spread[0], batch_size, 100 + std::uint64_t(s));
    auto b = batch_of(name, spread[0], batch_size, 100 + std::uint64_t(s));
    const auto ra = across.train_step(std::move(a.x), a.t, std::uint64_t(s));
    const auto rb = reference.train_step(std::move(b.x), b.t, std::uint64_t(s));
    if (bitwise)
      CHECK(ra.loss == rb.loss);  // the same expression over the same per-micro-batch losses
    else
      CHECK(ra.loss == doctest::Approx(rb.loss).epsilon(1e-5));
    CHECK(ra.correct == rb.correct);
    CHECK(ra.samples == rb.samples);
  }
  across.download();
  reference.download();  // device stages: their weights into the graphs
  if (inspect) inspect(across);
  // Every rank's replica-0 graph now holds every stage's weights: the bits of the same
  // stages in one process; against CPU stages, the stand-in's products sum in another
  // order than OpenBLAS's, so within the bound tests/gpu/pipeline_test.cpp derives for
  // device replicas against CPU replicas (this chain, SGD 0.05 with momentum 0.9, 3 steps,
  // R ≤ 3): 1e-4 of each tensor's largest entry.
  if (bitwise) {
    CHECK(differing(spread[0], here[0]) == 0);
  } else {
    auto start = model(name);
    CHECK(differing(spread[0], here[0], 1e-4, start) == 0);
  }
  // What crossed the bus, summed over the ranks: E·M forwards and gradients per replica and step.
  std::uint64_t E = 1;
  for (auto& n : spread[0].nodes())
    for (std::size_t p : n.inputs) E += spread[0].nodes()[p].is_input() ? 0 : 1;
  const auto t = across.traffic();
  const auto want = E * plan.micro_batches * replicas * std::uint64_t(steps);
  CHECK(total(t.forward) == want);
  CHECK(total(t.backward) == want);
  // Every rank sees every stage's figures.
  for (const auto& m : across.metrics()) CHECK(m.actions > 0);
  // Evaluation and prediction run on the ranks' own stages: every rank gets the figures
  // and the outputs of the same stages in one process.
  auto e = batch_of(name, spread[0], 29, 500);
  const auto ea = across.evaluate(e.x.clone(), e.t), eb = reference.evaluate(e.x.clone(), e.t);
  CHECK(ea.samples == 29);
  CHECK(ea.correct == eb.correct);
  if (bitwise) CHECK(ea.loss == eb.loss);
  else CHECK(ea.loss == doctest::Approx(eb.loss).epsilon(1e-5));
  const auto ya = across.predict(e.x.clone()), yb = reference.predict(std::move(e.x));
  REQUIRE(ya.size() == yb.size());
  for (std::int64_t i = 0; i < ya.size(); ++i) {
    if (bitwise) CHECK(ya.data()[i] == yb.data()[i]);
    else CHECK(ya.data()[i] == doctest::Approx(yb.data()[i]).epsilon(1e-4));
  }
  world->barrier();
}

}  // namespace

TEST_CASE("stages on the ranks, one each: every schedule gives the one-process weights bitwise") {
  const auto S = std::uint32_t(world->size());
  for (std::uint32_t M : {1u, S, 2 * S + 1}) {
    CAPTURE(M);
    for (auto name : {"gpipe", "1f1b", "zb-h1"}) {
      CAPTURE(name);
      check_across("chain", make_schedule(name, S, M), 1, 3, 19);
    }
    check_across("chain", make_schedule("interleaved", S, M, 2), 1, 3, 19);
    pipeline_options emergent;
    emergent.emergent = true;
    check_across("chain", make_schedule("1f1b", S, M), 1, 2, 19, emergent);
  }
}

TEST_CASE("skip connections that cross ranks sum in the same order") {
  const auto S = std::uint32_t(world->size());
  check_across("resmlp", make_schedule("1f1b", S, S + 1), 1, 2, 8);
  check_across("resmlp", make_schedule("zb-h1", S, S + 1), 1, 2, 8);
}

TEST_CASE("replicas on the ranks, one each: the weights of the replicas in one process, bitwise") {
  const auto R = std::uint32_t(world->size());
  for (auto name : {"1f1b", "zb-h1"}) {
    CAPTURE(name);
    check_across("chain", make_schedule(name, 1, 2), R, 3, 6 * std::int64_t(R));
  }
}

TEST_CASE("stand-in replicas on the ranks, one each: the weights of stand-in replicas in one process, bitwise") {
  // Their gradients cross through the host to the ranks' all-reduce, which sums in member
  // order as the stand-in's device all-reduce and bus::all_reduce do. Against CPU replicas
  // the sums are the same but the gradients are not (the products' order): within a bound.
  const auto R = std::uint32_t(world->size());
  const int steps = 3;
  for (auto name : {"1f1b", "zb-h1"}) {
    CAPTURE(name);
    const auto plan = make_schedule(name, 1, 2);
    check_across("chain", plan, R, steps, 6 * std::int64_t(R), {}, stages_on::standin, stages_on::standin,
                 [&](const nerve::pipeline::pipeline& p) {
                   const auto k = kinds_of(p);
                   if (R == 1) {  // one replica: nothing to sum
                     CHECK(k.through_host + k.host + k.on_device == 0);
                     return;
                   }
                   // This rank's replica: one reducer per Linear through the host, and the
                   // ranks' all-reduce it sends to; every round summed.
                   CHECK(k.through_host == 5);
                   CHECK(k.host == 5);
                   for (auto& a : p.reducers())
                     if (auto* h = dynamic_cast<gpu::host_all_reduce*>(a.get())) CHECK(h->rounds() == std::uint64_t(steps));
                 });
    check_across("chain", plan, R, steps, 6 * std::int64_t(R), {}, stages_on::standin, stages_on::cpu);
  }
}

TEST_CASE("across ranks too, a layer's gradient all-reduce starts while backward of the step is still running") {
  if (world->size() < 2) return;  // one replica: nothing to reduce
  const auto R = std::uint32_t(world->size()), me = std::uint32_t(world->rank());
  std::vector<layers::graph> reps;
  for (std::uint32_t r = 0; r < R; ++r) reps.push_back(test::small_chain());
  std::vector<layers::graph*> ptrs;
  for (auto& g : reps) ptrs.push_back(&g);
  actors::runtime rt(actors::runtime_options{.loops = 1, .record = true});
  pipeline_options o;
  o.link = fresh_link();
  nerve::pipeline::pipeline dp(rt, ptrs, partition_by_parameters(reps[0], 1), make_schedule("1f1b", 1, 3),
                               std::make_shared<layers::cross_entropy>(), sgd_factory(), o);
  auto d = make_batch(reps[0], 6 * std::int64_t(R), 1);
  dp.train_step(std::move(d.x), d.t);
  rt.synchronize();
  // This rank's replica: its layers' contributions leave for the reducer (and from there to
  // the other ranks) before its stage's last action (fc1's B) has ended.
  const auto& members = dp.stage_group(me, 0).members();
  REQUIRE(members.size() == 9);
  const auto seen = test::sends_against_actions(rt, members, "contribution", stage_track(me), 0);
  REQUIRE(seen.first_send > 0);
  CHECK(seen.first_send < seen.last_action_end);
  world->barrier();
}

TEST_CASE("two stages x two replicas on two ranks: a stage's replicas on one rank reduce in process") {
  if (world->size() != 2) return;
  pipeline_options o;
  o.ranks = {0, 1, 0, 1};  // replica r's stage s at r * 2 + s: stage 0 on rank 0, stage 1 on rank 1
  check_across("chain", make_schedule("1f1b", 2, 3), 2, 3, 12, o);
  o.ranks = {0, 0, 1, 1};  // each replica on a rank of its own
  check_across("chain", make_schedule("zb-h1", 2, 3), 2, 3, 12, o);
}

TEST_CASE("a tied weight across ranks: the embedding on the first rank, the head on the last, bitwise one process") {
  const auto S = std::uint32_t(world->size());
  for (auto name : {"1f1b", "zb-h1"}) {
    CAPTURE(name);
    check_across("tiny-lm", make_schedule(name, S, S + 1), 1, 3, 9);
  }
  check_across("tiny-lm", make_schedule("interleaved", S, S, 2), 1, 2, 9);
  if (S != 2) return;
  // Replicas across the ranks put two of the four copies on a rank, whichever way they are
  // placed: refused on every rank, before a step (the sum would need two levels).
  for (std::vector<int> ranks : {std::vector<int>{0, 1, 0, 1}, std::vector<int>{0, 0, 1, 1}}) {
    pipeline_options o;
    o.ranks = ranks;
    o.link = fresh_link();
    auto a = test::tiny_lm(), b = test::tiny_lm();
    actors::runtime rt(actors::runtime_options{.loops = 1});
    CHECK_THROWS_WITH(nerve::pipeline::pipeline(rt, std::vector<layers::graph*>{&a, &b}, partition_by_parameters(a, 2),
                                                make_schedule("1f1b", 2, 2), std::make_shared<layers::cross_entropy>(),
                                                sgd_factory(), o),
                      "pipeline: the weights of 'head' tied to 'wte' are on ranks that hold several of their 4 "
                      "copies: give each stage with a tied weight a rank of its own");
  }
  world->barrier();
}

TEST_CASE("two stand-in stages x two replicas on two ranks: in process on the device, or through the host") {
  if (world->size() != 2) return;
  pipeline_options o;
  o.ranks = {0, 1, 0, 1};  // a stage's replicas on one rank: its device all-reduce
  check_across("chain", make_schedule("1f1b", 2, 3), 2, 3, 12, o, stages_on::standin, stages_on::standin,
               [](const nerve::pipeline::pipeline& p) {
                 const auto k = kinds_of(p);
                 CHECK(k.on_device == (world->rank() == 0 ? 2 : 3));  // fc1 fc2 | fc3 fc4 fc5
                 CHECK(k.through_host + k.host == 0);
               });
  o.ranks = {0, 0, 1, 1};  // each replica on a rank of its own: both stages through the host
  check_across("chain", make_schedule("zb-h1", 2, 3), 2, 3, 12, o, stages_on::standin, stages_on::standin,
               [](const nerve::pipeline::pipeline& p) {
                 const auto k = kinds_of(p);
                 CHECK(k.through_host == 5);
                 CHECK(k.host == 5);
               });
  check_across("chain", make_schedule("zb-h1", 2, 3), 2, 3, 12, o, stages_on::standin, stages_on::cpu);
}

TEST_CASE("the optimizer state across ranks is the one-process pipeline's, and loads back") {
  const auto S = std::uint32_t(world->size());
  auto crit = std::make_shared<layers::cross_entropy>();
  actors::runtime rt(actors::runtime_options{.loops = 2});
  auto ga = test::small_chain(), gb = test::small_chain(), gc = test::small_chain();
  pipeline_options o;
  o.link = fresh_link();
  const auto plan = make_schedule("1f1b", S, 3);
  nerve::pipeline::pipeline across(rt, ga, partition_by_parameters(ga, S), plan, crit, sgd_factory(), o);
  nerve::pipeline::pipeline one(rt, gb, partition_by_parameters(gb, S), plan, crit, sgd_factory());
  for (std::uint64_t s = 0; s < 2; ++s) {
    auto a = make_batch(ga, 9, 20 + s), b = make_batch(ga, 9, 20 + s);
    across.train_step(std::move(a.x), a.t, s);
    one.train_step(std::move(b.x), b.t, s);
  }
  auto by_name = [](const layers::optimizer_state& st) {
    std::map<std::string, std::vector<float>> m;
    for (auto& b : st.buffers) m[b.parameter + "/" + b.name] = b.values;
    return m;
  };
  const auto sa = across.optimizer_state_of(), sb = one.optimizer_state_of();
  REQUIRE(sa.buffers.size() == 10);  // every layer's, from whichever rank runs it
  CHECK(by_name(sa) == by_name(sb));
  CHECK(sa.counters == sb.counters);
  // Loaded into a fresh pipeline across the ranks, each rank takes its stages' part.
  pipeline_options o2;
  o2.link = fresh_link();
  nerve::pipeline::pipeline fresh(rt, gc, partition_by_parameters(gc, S), plan, crit, sgd_factory(), o2);
  fresh.load_optimizer_state(sa);
  CHECK(by_name(fresh.optimizer_state_of()) == by_name(sa));
  world->barrier();
}

TEST_CASE("a placement that does not fit the job is refused on every rank") {
  auto g = test::small_chain();
  actors::runtime rt(actors::runtime_options{.loops = 1});
  pipeline_options o;
  o.link = fresh_link();
  const auto S = std::uint32_t(world->size()) + 1;
  const std::string want = "run on " + std::to_string(S) + " ranks";
  CHECK_THROWS_WITH_AS(nerve::pipeline::pipeline(rt, g, partition_by_parameters(g, S), make_schedule("1f1b", S, 2),
                                                 std::make_shared<layers::cross_entropy>(), sgd_factory(), o),
                       doctest::Contains(want.c_str()), std::invalid_argument);
  o.ranks = {0, world->size()};
  CHECK_THROWS_WITH_AS(nerve::pipeline::pipeline(rt, g, partition_by_parameters(g, 2), make_schedule("1f1b", 2, 2),
                                                 std::make_shared<layers::cross_entropy>(), sgd_factory(), o),
                       doctest::Contains("is not in a job of"), std::invalid_argument);
}

int main(int argc, char** argv) {
  int rc = 0;
  {
    bus::mpi::transport t;
    world = &t;
    doctest::Context ctx(argc, argv);
    rc = ctx.run();
    world = nullptr;
  }
  return rc;
}

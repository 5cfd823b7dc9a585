// Layers written once with ops (layers/ops.hpp) on a device: the same `compute` the CPU
// runs, on the device backend's op set (gpu/layers/device_op_set.hpp), with the backward
// the tape derives or a hand-written one. Compiled as pipeline_test.cpp: into gpu_test on
// the stand-in and into gpu_device_test on CUDA (skipped without a GPU).
//
// Parity rules: a device run against the CPU within pipeline_test.cpp's documented
// whole-step bound (1e-4 of each tensor's largest entry after 3 steps); a device pipeline
// against one device stage, and R replicas of one micro-batch against one replica of R
// micro-batches, bitwise (the same kernels on the same rows, gradients added in
// micro-batch order, the replicas' sum in member order).
#include "gpu/device.hpp"
#include "gpu/layers/device_backend.hpp"
#include "gpu/layers/device_op_set.hpp"
#include "gpu/memory.hpp"
#include "layers/linear.hpp"
#include "layers/loss.hpp"
#include "layers/norm.hpp"
#include "layers/activation.hpp"
#include "layers/optimizer.hpp"
#include "layers/pipeline/partition.hpp"
#include "layers/pipeline/pipeline.hpp"
#include "layers/pipeline/schedule.hpp"
#include "tests/gpu/gpu_fixture.hpp"
#include "tests/layers/op_layers.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <random>

using namespace nerve;
namespace pl = nerve::pipeline;

namespace {

constexpr double op_lr = 0.05, op_momentum = 0.9;

/// Three Linear layers and two Swish-β, every one written with ops: the first Swish's
/// backward from the tape, the second's by hand.
layers::graph op_chain() {
  layers::graph_builder b;
  b.input("input", {12});
  b.add("fc1", std::make_unique<layers::testing::op_linear>(12, 16), {"input"});
  b.add("act1", std::make_unique<layers::testing::swish>(0.8, false), {"fc1"});
  b.add("fc2", std::make_unique<layers::testing::op_linear>(16, 16), {"act1"});
  b.add("act2", std::make_unique<layers::testing::swish>(1.2, true), {"fc2"});
  b.add("fc3", std::make_unique<layers::testing::op_linear>(16, 4), {"act2"});
  return b.build(5);
}

struct op_batch {
  layers::tensor x;
  layers::targets t;
};

op_batch op_batch_of(std::int64_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d;
  op_batch b{layers::tensor(n, layers::shape{12}), {}};
  for (std::int64_t i = 0; i < b.x.size(); ++i) b.x.data()[i] = d(rng);
  for (std::int64_t i = 0; i < n; ++i) b.t.labels.push_back(std::int32_t(rng() % 4));
  return b;
}

/// Trains `steps` steps of batch 24 with `plan` over the replicas `reps`, every stage on
/// the suite's device or on the CPU; the weights downloaded into the graphs.
void train_ops(std::vector<layers::graph>& reps, const pl::schedule& plan, bool on_device, int steps) {
  actors::runtime rt(actors::runtime_options{.loops = 2});
  gpu::device dev(gpu::test::layers_suite_options());
  pl::pipeline_options options;
  for (std::uint32_t s = 0; on_device && s < plan.stages; ++s)
    options.backends.push_back([&dev](layers::graph& g, const std::vector<std::size_t>& nodes) {
      gpu::device_backend_options so;
      so.make_optimizer = [] { return layers::make_optimizer<float>("sgd", op_lr, op_momentum); };
      so.nodes = nodes;
      return std::make_shared<gpu::device_backend>(dev, g, so);
    });
  std::vector<layers::graph*> ptrs;
  for (auto& g : reps) ptrs.push_back(&g);
  pl::pipeline p(rt, ptrs, pl::partition_by_parameters(reps[0], plan.pieces()), plan,
                 std::make_shared<layers::cross_entropy>(),
                 [] { return layers::make_optimizer<float>("sgd", op_lr, op_momentum); }, std::move(options));
  for (int s = 0; s < steps; ++s) {
    auto b = op_batch_of(24, 300 + std::uint64_t(s));
    (void)p.train_step(std::move(b.x), b.t, std::uint64_t(s));
  }
  p.download();
  rt.synchronize();
}

std::vector<layers::graph> op_replicas(std::uint32_t r) {
  std::vector<layers::graph> reps;
  for (std::uint32_t i = 0; i < r; ++i) reps.push_back(op_chain());
  return reps;
}

void check_same_bits(layers::graph& a, layers::graph& b) {
  auto pa = a.parameters(), pb = b.parameters();
  REQUIRE(pa.size() == pb.size());
  for (std::size_t i = 0; i < pa.size(); ++i) {
    CAPTURE(pa[i].name);
    REQUIRE(pa[i].value->size() == pb[i].value->size());
    CHECK(std::memcmp(pa[i].value->data(), pb[i].value->data(), std::size_t(pa[i].value->size()) * sizeof(float)) ==
          0);
  }
}

}  // namespace

TEST_SUITE("gpu.op_layers") {
  TEST_CASE("layers written with ops train on the device to the CPU's weights") {
    const auto initial = op_chain();
    auto cpu = op_replicas(1), dev = op_replicas(1);
    const auto plan = pl::make_schedule("gpipe", 1, 2);
    train_ops(cpu, plan, false, 3);
    train_ops(dev, plan, true, 3);
    auto pc = cpu[0].parameters(), pd = dev[0].parameters();
    auto p0 = const_cast<layers::graph&>(initial).parameters();
    REQUIRE(pc.size() == 8);  // three weights and biases, two betas
    for (std::size_t i = 0; i < pc.size(); ++i) {
      CAPTURE(pc[i].name);
      double largest = 0, moved = 0, worst = 0;
      for (std::int64_t k = 0; k < pc[i].value->size(); ++k) {
        const double c = pc[i].value->data()[k], d = pd[i].value->data()[k];
        largest = std::max(largest, std::abs(c));
        moved = std::max(moved, std::abs(d - double(p0[i].value->data()[k])));
        worst = std::max(worst, std::abs(c - d));
      }
      CHECK(moved > 1e-5);  // the device trained every tensor, the betas included
      CHECK(worst <= 1e-4 * largest);
    }
  }

  TEST_CASE("layers written with ops in a 2-stage device pipeline give one device stage's bits, every schedule") {
    for (bool on_device : {false, true}) {
      CAPTURE(on_device);
      auto one = op_replicas(1);
      train_ops(one, pl::make_schedule("gpipe", 1, 4), on_device, 3);
      for (const char* kind : {"gpipe", "1f1b", "zb-h1"}) {
        CAPTURE(std::string(kind));
        auto two = op_replicas(1);
        train_ops(two, pl::make_schedule(kind, 2, 4), on_device, 3);
        check_same_bits(two[0], one[0]);
      }
    }
  }

  TEST_CASE("two replicas of one micro-batch each give the bits of one replica of two micro-batches") {
    for (bool on_device : {false, true}) {
      CAPTURE(on_device);
      auto one = op_replicas(1), two = op_replicas(2);
      train_ops(one, pl::make_schedule("1f1b", 2, 2), on_device, 3);
      train_ops(two, pl::make_schedule("1f1b", 2, 1), on_device, 3);
      check_same_bits(two[0], one[0]);
      check_same_bits(two[1], one[0]);
    }
  }
}

namespace {

/// fc1 → bn (BatchNorm, with buffers) → relu → act (a user's op layer) → fc2.
layers::graph mixed_kinds() {
  layers::graph_builder b;
  b.input("input", {12});
  b.add("fc1", layers::linear(12, 16), {"input"});
  b.add("bn", layers::batch_norm(16), {"fc1"});
  b.add("relu", layers::relu(), {"bn"});
  b.add("act", std::make_unique<layers::testing::swish>(0.9, false), {"relu"});
  b.add("fc2", layers::linear(16, 4), {"act"});
  return b.build(9);
}

/// Trains 2 steps (Adam) on one stage on the device or the CPU; its optimizer state after.
layers::optimizer_state state_after(layers::graph& g, bool on_device, const layers::optimizer_state* load = nullptr) {
  actors::runtime rt(actors::runtime_options{.loops = 2});
  gpu::device dev(gpu::test::layers_suite_options());
  pl::pipeline_options options;
  if (on_device)
    options.backends.push_back([&dev](layers::graph& gg, const std::vector<std::size_t>& nodes) {
      gpu::device_backend_options so;
      so.make_optimizer = [] { return layers::make_optimizer<float>("adam", 1e-3); };
      so.nodes = nodes;
      return std::make_shared<gpu::device_backend>(dev, gg, so);
    });
  const auto plan = pl::make_schedule("gpipe", 1, 2);
  pl::pipeline p(rt, g, pl::partition_by_parameters(g, plan.pieces()), plan, std::make_shared<layers::cross_entropy>(),
                 [] { return layers::make_optimizer<float>("adam", 1e-3); }, std::move(options));
  if (load) {
    p.load_optimizer_state(*load);
    return p.optimizer_state_of();
  }
  for (int s = 0; s < 2; ++s) {
    auto b = op_batch_of(24, 500 + std::uint64_t(s));
    (void)p.train_step(std::move(b.x), b.t, std::uint64_t(s));
  }
  return p.optimizer_state_of();
}

}  // namespace

TEST_SUITE("gpu.state") {
  TEST_CASE("every layer's optimizer state comes from its kernels, one format on the CPU and on a device") {
    auto cpu_g = mixed_kinds(), dev_g = mixed_kinds(), fresh_g = mixed_kinds();
    const auto on_cpu = state_after(cpu_g, false);
    const auto on_dev = state_after(dev_g, true);
    // The same buffers under the same names from both backends: exp_avg and exp_avg_sq of
    // fc1, bn, act and fc2's parameters, with their step counts.
    auto names = [](const layers::optimizer_state& st) {
      std::set<std::string> n;
      for (const auto& b : st.buffers) n.insert(b.parameter + "/" + b.name);
      return n;
    };
    CHECK(names(on_cpu) == names(on_dev));
    CHECK(on_dev.buffers.size() == 2 * 7);  // fc1 (2), bn (2), act (1), fc2 (2)
    CHECK(on_dev.counters.at("bn.weight.step") == 2);
    CHECK(on_dev.counters.at("act.beta.step") == 2);
    CHECK(on_dev.counters.at("fc2.bias.step") == 2);
    // The CPU's state loaded on the device comes back with its bits.
    const auto back = state_after(fresh_g, true, &on_cpu);
    REQUIRE(back.buffers.size() == on_cpu.buffers.size());
    for (const auto& want : on_cpu.buffers) {
      CAPTURE(want.parameter + "/" + want.name);
      const auto it = std::find_if(back.buffers.begin(), back.buffers.end(), [&](const auto& b) {
        return b.parameter == want.parameter && b.name == want.name;
      });
      REQUIRE(it != back.buffers.end());
      CHECK(it->values == want.values);
    }
  }

  TEST_CASE("one optimizer class steps a device's arrays as it steps host tensors, state and all") {
    // The CPU's optimizer objects, each stepping a parameter in host memory and one in the
    // device's memory (the device op set's updates). The updates are the CPU's formulas
    // with the CPU's roundings of the scalars; they agree to a few roundings, not bitwise,
    // as Eigen's vector code may fuse a multiply-add that a device kernel rounds twice (or
    // the reverse on CUDA). A formula of its own (dampening, the first momentum step,
    // AdamW's decay, the bias corrections) would be off by far more than the bound.
    struct opt_case {
      const char* name;
      std::function<std::unique_ptr<layers::optimizer>()> make;
    };
    const opt_case cases[] = {
        {"sgd", [] { return layers::make_optimizer<float>("sgd", 0.05); }},
        {"sgd+wd+momentum", [] { return std::make_unique<layers::sgd>(layers::sgd_options{0.05, 0.9, 0.1, 1e-2, false}); }},
        {"sgd+nesterov", [] { return layers::make_optimizer<float>("sgd", 0.05, 0.9, 1e-2, true); }},
        {"adam+wd", [] { return layers::make_optimizer<float>("adam", 1e-2, 0.0, 0.1); }},
        {"adamw", [] { return layers::make_optimizer<float>("adamw", 1e-2, 0.0, 0.1); }},
    };
    gpu::device dev(gpu::test::layers_suite_options());
    gpu::stream st = dev.create_stream();
    gpu::device_op_set set(st, "suite");
    std::mt19937_64 rng(11);
    std::normal_distribution<float> normal;
    const std::int64_t n = 1001;  // not a multiple of any vector width: Eigen's tail runs too
    for (const auto& c : cases) {
      CAPTURE(std::string(c.name));
      layers::tensor w(1, layers::shape{n}), g(1, layers::shape{n});
      for (std::int64_t i = 0; i < n; ++i) w.data()[i] = normal(rng);
      auto host_opt = c.make(), dev_opt = c.make();
      auto dw = gpu::upload(st, w.data(), {1, std::size_t(n)});
      gpu::device_tensor dg(st, {1, std::size_t(n)});
      const std::vector<layers::parameter_ref> host{{"p.weight", &w, &g, {1, n}}};
      const std::vector<layers::optimizer::parameter> on_dev{
          {"p.weight", {{1, n}, dw.data(), nullptr, -1}, {{1, n}, dg.data(), nullptr, -1}}};
      for (int step = 0; step < 3; ++step) {
        for (std::int64_t i = 0; i < n; ++i) g.data()[i] = normal(rng);
        gpu::copy_async(st, dg.data(), g.data(), dg.bytes());
        st.synchronize();
        host_opt->step(host);
        dev_opt->step(set, on_dev);
      }
      const auto got = gpu::download(st, dw);
      // The largest difference relative to max(1, |value|), over two vectors of values.
      auto worst_of = [](const std::vector<float>& a, const float* b) {
        double worst = 0;
        for (std::size_t i = 0; i < a.size(); ++i)
          worst = std::max(worst, std::abs(double(a[i]) - double(b[i])) / std::max(1.0, std::abs(double(b[i]))));
        return worst;
      };
      CHECK(worst_of(got, w.data()) <= 16 * gpu::test::unit_roundoff);
      // The state in the CPU's names, read back from the device, and loaded there again.
      layers::optimizer_state hs, ds;
      host_opt->save_state(hs);
      dev_opt->save_state(ds);
      REQUIRE(ds.buffers.size() == hs.buffers.size());
      CHECK(ds.counters == hs.counters);
      for (std::size_t b = 0; b < hs.buffers.size(); ++b) {
        CHECK(ds.buffers[b].parameter == hs.buffers[b].parameter);
        CHECK(ds.buffers[b].name == hs.buffers[b].name);
        REQUIRE(ds.buffers[b].values.size() == hs.buffers[b].values.size());
        CHECK(worst_of(ds.buffers[b].values, hs.buffers[b].values.data()) <= 16 * gpu::test::unit_roundoff);
      }
      auto again = c.make();
      again->load_state(ds, set, on_dev);
      layers::optimizer_state back;
      again->save_state(back);
      for (std::size_t b = 0; b < ds.buffers.size(); ++b) CHECK(back.buffers[b].values == ds.buffers[b].values);
      // An optimizer's state stays on the op set it was made on.
      if (!hs.buffers.empty())
        CHECK_THROWS_WITH_AS(again->step(host), doctest::Contains("op set, not the cpu one"), std::logic_error);
    }
  }
}

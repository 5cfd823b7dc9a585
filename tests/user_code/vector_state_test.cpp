// A user's code built without AVX, called by a nerve built with it (-march=native):
// every call that passes into it finds the upper vector state clean, so its SSE code
// pays no AVX-SSE transition (layers/detail/vector_state.hpp). This file is compiled
// with -mno-avx (tests/user_code/CMakeLists.txt), as a user's project with the
// compiler's defaults is; XINUSE (XGETBV with ECX = 1) says at each entry whether the
// AVX upper state is in use. Where the CPU cannot say, the binary exits 77: skipped.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>

#include "actors/runtime.hpp"
#include "layers/activation.hpp"
#include "layers/gemm.hpp"
#include "layers/graph.hpp"
#include "layers/linear.hpp"
#include "layers/loss.hpp"
#include "layers/network.hpp"
#include "layers/ops.hpp"
#include "layers/optimizer.hpp"
#include "layers/trainer.hpp"
#include "tests/layers/tiny_fashion_mnist.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

using namespace nerve;
using namespace nerve::layers;

namespace {

#if defined(__x86_64__) || defined(__i386__)
/// XGETBV with ECX = 1 (XINUSE) is there: CPUID.(EAX=0xD, ECX=1):EAX bit 2, under an OS
/// that enabled XSAVE (CPUID.1:ECX bit 27) and the AVX state (XCR0 bits 1 and 2).
bool can_read_xinuse() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false;
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & 6u) != 6u) return false;
  if (__get_cpuid_max(0, nullptr) < 0xD) return false;
  __cpuid_count(0xD, 1, a, b, c, d);
  return (a & (1u << 2)) != 0;
}
/// XINUSE bit 2: the upper halves of the YMM registers are not in their initial state.
bool avx_upper_in_use() {
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(1));
  return (lo & 4u) != 0;
}
#else
bool can_read_xinuse() { return false; }
bool avx_upper_in_use() { return false; }
#endif

/// Entries into user code, and those that found the upper state in use, by site.
struct entries {
  std::atomic<int> calls{0}, dirty{0};
  void note(bool in_use) {
    ++calls;
    if (in_use) ++dirty;
  }
};

/// Swish, x·σ(x), as a user writes it: a pointwise loop with expf in forward and backward.
class user_swish final : public basic_layer<float> {
 public:
  explicit user_swish(entries& seen) : seen_(seen) {}
  std::string_view kind() const noexcept override { return "UserSwish"; }

 protected:
  shape infer_shape(std::span<const shape> inputs) const override { return inputs[0]; }
  forward_result do_forward(std::vector<tensor>& inputs, const forward_context&) override {
    seen_.note(avx_upper_in_use());  // first: before this function's own SSE code
    tensor& x = inputs[0];
    tensor y(x.batch(), x.sample_shape());
    for (std::int64_t i = 0; i < x.size(); ++i) y.data()[i] = x.data()[i] / (1.f + std::exp(-x.data()[i]));
    forward_result r{std::move(y), {}};
    r.stash.tensors.push_back(std::move(x));
    return r;
  }
  std::vector<tensor> do_backward_input(const stash_type& saved, const tensor& dy, input_mask) override {
    seen_.note(avx_upper_in_use());
    const tensor& x = saved.tensors[0];
    std::vector<tensor> g(1);
    g[0] = tensor(dy.batch(), saved.input_shapes[0]);
    for (std::int64_t i = 0; i < x.size(); ++i) {
      const float s = 1.f / (1.f + std::exp(-x.data()[i]));
      g[0].data()[i] = dy.data()[i] * s * (1.f + x.data()[i] * (1.f - s));
    }
    return g;
  }
  void do_backward_weight(const stash_type&, const tensor&) override {}

 private:
  entries& seen_;
};

/// A learnable scale written with ops, its backward by hand: `compute`, `grad_input` and
/// `grad_weight` are user code the op run calls.
class user_op_scale final : public op_layer {
 public:
  explicit user_op_scale(entries& seen)
      : seen_(seen), gain_(tensor::constant(1, {1}, 1.f)), grad_(tensor::zeros(1, {1})) {}
  std::string_view kind() const noexcept override { return "UserOpScale"; }
  std::vector<parameter_ref> parameters() override { return {{"gain", &gain_, &grad_, {1}}}; }
  bool custom_backward() const noexcept override { return true; }
  array compute(ops& o, std::span<const array> in, std::span<const array> p, std::vector<array>& keep,
                const forward_context&) override {
    seen_.note(avx_upper_in_use());
    keep = {in[0]};
    return o.mul_row(in[0], p[0]);
  }
  std::vector<array> grad_input(ops& o, std::span<const array>, std::span<const array> p, const array& dy,
                                input_mask) override {
    seen_.note(avx_upper_in_use());
    auto g = o.set().alloc(dy.dims);
    o.set().broadcast(binary_fn::mul, dy.data, p[0].data, g.data, dy.size(), 1);
    std::vector<array> out;
    out.push_back(std::move(g));
    return out;
  }
  void grad_weight(ops& o, std::span<const array> keep, std::span<const array>, const array& dy,
                   std::span<const array> grads) override {
    seen_.note(avx_upper_in_use());
    auto prod = o.set().alloc(dy.dims);
    o.set().binary(binary_fn::mul, dy.data, keep[0].data, prod.data, dy.size());
    auto s = o.set().alloc({1});
    o.set().column_sums(prod.data, dy.size(), 1, s.data, 0.f);
    o.set().axpy(1, 1.f, s.data, grads[0].data);
  }

 protected:
  shape infer_shape(std::span<const shape> inputs) const override { return inputs[0]; }

 private:
  entries& seen_;
  tensor gain_, grad_;
};

/// Cross-entropy behind a user's own loss class.
class user_loss final : public loss {
 public:
  explicit user_loss(entries& seen) : seen_(seen) {}
  std::string_view kind() const noexcept override { return "UserLoss"; }
  result forward(const tensor& prediction, const targets& target) const override {
    seen_.note(avx_upper_in_use());
    return inner_.forward(prediction, target);
  }
  tensor backward(const stash_type& saved, float scale) const override {
    seen_.note(avx_upper_in_use());
    return inner_.backward(saved, scale);
  }

 private:
  entries& seen_;
  cross_entropy inner_;
};

/// 784 → fc1 (nerve's Linear) → swish (user) → scale (user, ops) → fc2 (nerve's Linear):
/// every user call comes straight after nerve's AVX code.
graph user_graph(entries& layer_calls, entries& op_calls) {
  graph_builder b;
  b.input("x", shape{784});
  b.add("fc1", std::make_unique<linear>(784, 64), {"x"});
  b.add("swish", std::make_unique<user_swish>(layer_calls), {"fc1"});
  b.add("scale", std::make_unique<user_op_scale>(op_calls), {"swish"});
  b.add("fc2", std::make_unique<linear>(64, 10), {"scale"});
  b.output("fc2");
  return b.build(1);
}

tensor random_images(std::int64_t n, std::uint64_t seed) {
  tensor t(n, shape{784});
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  for (std::int64_t i = 0; i < t.size(); ++i) t.data()[i] = u(rng);
  return t;
}

targets random_labels(std::int64_t n, std::uint64_t seed) {
  targets t;
  std::mt19937_64 rng(seed);
  for (std::int64_t i = 0; i < n; ++i) t.labels.push_back(static_cast<std::int32_t>(rng() % 10));
  return t;
}

}  // namespace

TEST_SUITE("layers.vector_state") {
  TEST_CASE("the probe sees the upper state in use after a 256-bit instruction and clean after vzeroupper") {
#if defined(__x86_64__) || defined(__i386__)
    __asm__ volatile("vpcmpeqd %%ymm1, %%ymm1, %%ymm1" ::: "xmm1");  // all ones in ymm1's upper half
    const bool dirty = avx_upper_in_use();
    __asm__ volatile("vzeroupper");
    const bool clean = !avx_upper_in_use();
    CHECK(dirty);
    CHECK(clean);
#endif
  }

  TEST_CASE("a user's layer, op layer, hooks and loss are entered with the upper vector state clean") {
    // Each product engine nerve has: its kernels are what runs just before the user's code.
    const auto engine_before = current_gemm_engine();
    SUBCASE("eigen") { set_gemm_engine(gemm_engine::eigen); }
    if (has_openblas())
      SUBCASE("openblas") { set_gemm_engine(gemm_engine::openblas); }
    entries layer_calls, op_calls, hook_calls, loss_calls;
    auto g = user_graph(layer_calls, op_calls);
    for (const char* name : {"fc1", "fc2"}) {
      g.register_forward_hook(name, [&](const hook_context&, tensor&) { hook_calls.note(avx_upper_in_use()); });
      g.register_backward_hook(name, [&](const hook_context&, std::vector<tensor>&, const tensor&) {
        hook_calls.note(avx_upper_in_use());
      });
    }
    actors::runtime rt({.loops = 2});
    network net(rt, g, std::make_shared<user_loss>(loss_calls),
                [] { return std::make_unique<sgd>(sgd_options{.lr = 0.01}); }, network_options{.spread = true});
    for (std::uint64_t step = 0; step < 4; ++step)
      net.train_step(random_images(64, step), random_labels(64, step), /*micro_batches=*/4, step).get();
    net.evaluate(random_images(32, 9), random_labels(32, 9)).get();

    // Forward and B of each micro-batch of 4 steps, and the evaluation's forward.
    CHECK(layer_calls.calls == 4 * 4 * 2 + 1);
    CHECK(layer_calls.dirty == 0);
    // compute, grad_input and grad_weight of each micro-batch, and the evaluation's compute.
    CHECK(op_calls.calls == 4 * 4 * 3 + 1);
    CHECK(op_calls.dirty == 0);
    CHECK(hook_calls.calls == 4 * 4 * 2 * 2 + 2);
    CHECK(hook_calls.dirty == 0);
    CHECK(loss_calls.calls == 4 * 4 * 2 + 1);
    CHECK(loss_calls.dirty == 0);
    set_gemm_engine(engine_before);
  }

  TEST_CASE("the trainer's progress and epoch callbacks are entered with the upper vector state clean") {
    entries layer_calls, op_calls, progress_calls, epoch_calls;
    nerve::testing::tiny_fashion_mnist data(128, 64);
    train_options o;
    o.data = data.dir;
    o.epochs = 2;
    o.batch = 32;
    o.micro_batches = 2;
    o.threads = 2;
    o.spread = true;
    auto g = user_graph(layer_calls, op_calls);
    const auto report = train(
        g, o, [&](const train_progress&) { progress_calls.note(avx_upper_in_use()); },
        [&](const epoch_stats&) { epoch_calls.note(avx_upper_in_use()); });
    CHECK(report.steps == 8);
    CHECK(progress_calls.calls == 8);
    CHECK(progress_calls.dirty == 0);
    CHECK(epoch_calls.calls == 2);
    CHECK(epoch_calls.dirty == 0);
    CHECK(layer_calls.calls > 0);
    CHECK(layer_calls.dirty == 0);
    CHECK(op_calls.dirty == 0);
  }
}

int main(int argc, char** argv) {
  if (!can_read_xinuse()) {
    std::puts("skipped: this CPU cannot say whether the AVX upper state is in use (no XGETBV with ECX = 1)");
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}

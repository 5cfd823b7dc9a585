// The layers on a device against their CPU twins (layers/*.cpp) on fresh random
// inputs. Compiled twice: into gpu_test on the CPU stand-in (runs everywhere) and
// into gpu_device_test on CUDA (skipped without a GPU).
//
// Tolerances (fp32, TF32 off). A reduction of length k computed in any order has
// |error| ≤ γ_k·Σ|aᵢbᵢ| with γ_k = k·u/(1 − k·u), u = 2⁻²⁴ (Higham, Accuracy and
// Stability, §3.1). The GPU and the CPU each make such an error, in different
// orders, so |gpu − cpu| ≤ 2·γ_k·Σ|aᵢbᵢ|; we take 2·(k+2)·u·m with m = Σ|aᵢbᵢ|
// (plus |bias|) computed by the same CPU layer on |inputs| and |parameters|
// (the +2 covers the bias add and the final rounding). Pointwise functions:
// 12 ulps of the larger of the two results and of the incoming gradient
// (expf/tanhf on the GPU are within 2 ulps, erfcf within 4, glibc's erfcf 3.5 with
// GELU's product, measured; the CPU recomputes sigmoid/tanh from x where the GPU
// reads y). GELU's Φ is ½·erfc(−x/√2): ½·(1 + erf(x/√2)) cancels for negative x, and
// the first run on a GPU (H200) failed this bound by 11x there. A whole training step composes these bounds
// through the network; there we check 1e-4 relative to the tensor's largest entry
// (Adam: see the step test, where a gradient at the noise floor moves a weight by ±lr).
#include "gpu/device.hpp"
#include "gpu/layers/device_backend.hpp"
#include "gpu/layers/device_op_set.hpp"
#include "gpu/layers/train.hpp"
#include "layers/trainer.hpp"
#include "gpu/status.hpp"
#include "gpu/testing.hpp"
#include "layers/activation.hpp"
#include "layers/attention.hpp"
#include "layers/class_token.hpp"
#include "layers/conv2d.hpp"
#include "layers/embedding.hpp"
#include "layers/patch_embedding.hpp"
#include "layers/devices.hpp"
#include "layers/dropout.hpp"
#include "layers/executor.hpp"
#include "layers/flatten.hpp"
#include "layers/join.hpp"
#include "layers/linear.hpp"
#include "layers/loss.hpp"
#include "layers/network.hpp"
#include "layers/norm.hpp"
#include "layers/plan.hpp"
#include "layers/optimizer.hpp"
#include "layers/pool.hpp"
#include "layers/presets.hpp"
#include "tests/gpu/gpu_fixture.hpp"
#include "tests/gpu/loops.hpp"
#include "tests/layers/tiny_fashion_mnist.hpp"
#include "tests/pipeline/tiny_lm.hpp"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <functional>
#include <memory>

using namespace nerve;
using gpu::test::check_within;
using gpu::test::unit_roundoff;

namespace {


struct layer_fixture {
  gpu::device dev{gpu::test::layers_suite_options()};
  gpu::stream s = dev.create_stream();
  // A fixed seed, so a failure reproduces; NERVE_TEST_SEED=N tries other data.
  std::mt19937_64 rng{[] {
    const char* env = std::getenv("NERVE_TEST_SEED");
    const std::uint64_t seed = env ? std::strtoull(env, nullptr, 10) : 20261123u;
    if (env) MESSAGE("seed " << seed);
    return seed;
  }()};

  layers::tensor random(std::int64_t batch, layers::shape shape) {
    layers::tensor t(batch, std::move(shape));
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (std::int64_t i = 0; i < t.size(); ++i) t.data()[i] = d(rng);
    return t;
  }
};

/// A graph's layer actors (`layers::network`) on one loop, their kernels on a stream of
/// the suite's device. Waits for every completion before it goes.
struct device_net {
  actors::runtime rt;
  gpu::device dev;
  std::shared_ptr<gpu::device_backend> be;
  layers::network net;
  device_net(layers::graph& g, layers::optimizer_settings opt, std::size_t max_batch = 64,
             bool count_completions = true, bool record = false)
      : rt({.loops = 1, .record = record}),
        dev(options(rt, count_completions)),
        be(std::make_shared<gpu::device_backend>(dev, g, backend_options(opt, max_batch))),
        net(rt, g, std::make_shared<layers::cross_entropy>(), {}, layers::network_options{.backend = be}) {}
  ~device_net() {
    try {
      rt.synchronize();
    } catch (...) {  // a test's planted failure
    }
  }
  static gpu::device_backend_options backend_options(const layers::optimizer_settings& o, std::size_t max_batch) {
    gpu::device_backend_options so;
    so.make_optimizer = [o] { return layers::make_optimizer<float>(o.name, o.lr, o.momentum, o.weight_decay, o.nesterov); };
    so.max_batch = max_batch;
    return so;
  }
  static gpu::device_options options(actors::runtime& rt, bool count) {
    auto o = gpu::test::layers_suite_options();
    if (count) o.counter = {[&rt] { rt.begin_work(); }, [&rt] { rt.end_work(); }};
    return o;
  }
};

/// The `--device` of this suite.
std::string suite_device() {
#if NERVE_GPU_LAYERS_STANDIN
  return "standin";
#else
  return std::getenv("NERVE_GPU_TEST_STANDIN") ? "standin" : "cuda";
#endif
}

gpu::shape_t full_shape(const layers::tensor& t) {
  gpu::shape_t s;
  for (auto d : t.full_shape()) s.push_back(std::size_t(d));
  return s;
}

std::vector<float> values(const layers::tensor& t) { return {t.data(), t.data() + t.size()}; }

/// Every parameter of `got` (a device network's graph, downloaded) within `rel` of the
/// largest entry of its tensor in `want` (the CPU's).
void check_parameters_within(layers::graph& got_graph, layers::graph& want_graph, double rel) {
  auto want = want_graph.parameters();
  auto got = got_graph.parameters();
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    double scale = 0;
    for (std::int64_t j = 0; j < want[i].value->size(); ++j)
      scale = std::max(scale, double(std::abs(want[i].value->data()[j])));
    check_within(want[i].name, values(*got[i].value), values(*want[i].value),
                 std::vector<double>(std::size_t(want[i].value->size()), rel * scale));
  }
}

layers::tensor abs_of(const layers::tensor& t) {
  layers::tensor a = t.clone();
  for (std::int64_t i = 0; i < a.size(); ++i) a.data()[i] = std::abs(a.data()[i]);
  return a;
}

std::vector<double> product_tolerance(const layers::tensor& magnitude, double k) {
  std::vector<double> tol(std::size_t(magnitude.size()));
  for (std::size_t i = 0; i < tol.size(); ++i) tol[i] = 2.0 * (k + 2.0) * unit_roundoff * double(magnitude.data()[i]) + 1e-30;
  return tol;
}

/// A normalisation's results: sums of a channel's values in double, then a few float
/// operations, cancellation included (x − mean, dxhat − its mean): `rel` of the largest
/// magnitude in `want`.
std::vector<double> spread_tolerance(const layers::tensor& want, double rel) {
  double top = 0;
  for (std::int64_t i = 0; i < want.size(); ++i) top = std::max(top, std::abs(double(want.data()[i])));
  return std::vector<double>(std::size_t(want.size()), rel * top + 1e-30);
}

std::vector<double> pointwise_tolerance(const layers::tensor& want, const layers::tensor* scale = nullptr) {
  std::vector<double> tol(std::size_t(want.size()));
  for (std::size_t i = 0; i < tol.size(); ++i) {
    double m = std::abs(double(want.data()[i]));
    if (scale && scale->size() == want.size()) m = std::max(m, std::abs(double(scale->data()[i])));
    tol[i] = 12.0 * unit_roundoff * m + 1e-30;
  }
  return tol;
}

/// A layer's forward, B and W on the device: its own `compute` on the device's op set. Downloads what the checks compare.
struct device_result {
  std::vector<float> y;
  std::vector<std::vector<float>> dx, dw, buffers;
};

/// `buffers`: the layer's buffers as they were before the CPU's forward changed them.
device_result run_on_device(layer_fixture& fx, layers::layer& cpu, std::vector<layers::tensor>& inputs,
                            const layers::tensor& dy, const std::vector<layers::tensor>& buffers) {
  device_result r;
  std::vector<std::shared_ptr<gpu::device_tensor>> din;
  for (auto& t : inputs) din.push_back(std::make_shared<gpu::device_tensor>(gpu::upload(fx.s, t.data(), full_shape(t))));
  auto gpu_dy = std::make_shared<gpu::device_tensor>(gpu::upload(fx.s, dy.data(), full_shape(dy)));
  if (auto* op = cpu.as_op_layer()) {  // every built-in layer here
    gpu::device_op_set set(fx.s, "suite");
    std::vector<layers::array> in, params, grads;
    for (auto& t : din) in.push_back(gpu::device_op_set::array_of(t));
    std::vector<std::shared_ptr<gpu::device_tensor>> keep;  // the parameters and gradients on the device
    for (auto& p : cpu.parameters()) {
      keep.push_back(std::make_shared<gpu::device_tensor>(gpu::upload(fx.s, p.value->data(), full_shape(*p.value))));
      params.push_back({p.torch_shape, keep.back()->data(), nullptr, -1});
      std::vector<float> zeros(std::size_t(p.grad->size()), 0.0f);
      keep.push_back(std::make_shared<gpu::device_tensor>(gpu::upload(fx.s, zeros.data(), full_shape(*p.grad))));
      grads.push_back({p.torch_shape, keep.back()->data(), nullptr, -1});
    }
    const std::size_t parameters = params.size();
    auto host_buffers = cpu.buffers();
    std::vector<gpu::device_tensor*> device_buffers;
    for (std::size_t i = 0; i < host_buffers.size(); ++i) {  // running statistics, after the parameters
      keep.push_back(std::make_shared<gpu::device_tensor>(gpu::upload(fx.s, buffers[i].data(), full_shape(buffers[i]))));
      params.push_back({host_buffers[i].torch_shape, keep.back()->data(), nullptr, -1});
      device_buffers.push_back(keep.back().get());
    }
    layers::basic_op_run<float> run(*op, set, std::move(in), std::move(params), parameters, true, {});
    r.y = gpu::download(fx.s, *set.tensor_of(run.output()));
    for (auto& g : run.backward_input(gpu::device_op_set::array_of(gpu_dy), layers::all_inputs))
      r.dx.push_back(gpu::download(fx.s, *set.tensor_of(g)));
    run.backward_weight(gpu::device_op_set::array_of(gpu_dy), grads);
    for (auto& g : grads) r.dw.push_back(gpu::download(fx.s, *set.tensor_of(g)));
    for (auto* b : device_buffers) r.buffers.push_back(gpu::download(fx.s, *b));
    return r;
  }
  FAIL(cpu.kind() << " is not written with ops: a device would run it on the host");
  return r;
}

/// One layer through forward, B and W on both sides. `make` builds a fresh CPU layer;
/// `k_fwd`, `k_dx`, `k_dw` are the reduction lengths (0: pointwise, exact-ish; negative:
/// a normalisation, within 64 float roundings of each result's largest magnitude).
void compare_layer(layer_fixture& fx, const std::function<std::unique_ptr<layers::layer>()>& make,
                   std::vector<layers::tensor> inputs, double k_fwd, double k_dx, double k_dw) {
  auto cpu = make();
  cpu->reset_parameters(fx.rng);
  std::vector<layers::tensor> start_buffers;  // as the device starts (the CPU's forward changes them)
  for (auto& b : cpu->buffers()) start_buffers.push_back(b.value->clone());
  const double norm_rel = 64.0 * unit_roundoff;

  // CPU side (the inputs are moved into the stash: keep copies).
  std::vector<layers::tensor> cin, ain;
  for (auto& t : inputs) {
    cin.push_back(t.clone());
    ain.push_back(abs_of(t));
  }
  auto r = cpu->forward(std::move(cin));
  auto dy = fx.random(r.output.batch(), r.output.sample_shape());
  const auto got = run_on_device(fx, *cpu, inputs, dy, start_buffers);
  cpu->zero_grad();
  auto cdx = cpu->backward(std::move(r.stash), dy);

  // Magnitudes: the same layer with |parameters| on |inputs| and |dy|.
  auto mag = make();
  {
    auto src = cpu->parameters();
    auto dst = mag->parameters();
    for (std::size_t i = 0; i < src.size(); ++i) *dst[i].value = abs_of(*src[i].value);
  }
  auto mr = mag->forward(std::move(ain));
  mag->zero_grad();
  auto mdx = mag->backward(std::move(mr.stash), abs_of(dy));

  const std::string kind(cpu->kind());
  auto buffers = cpu->buffers();
  REQUIRE(got.buffers.size() == buffers.size());
  for (std::size_t i = 0; i < buffers.size(); ++i)
    check_within(kind + " buffer " + buffers[i].name, got.buffers[i], values(*buffers[i].value),
                 spread_tolerance(*buffers[i].value, norm_rel));
  if (k_fwd < 0)
    check_within(kind + " forward", got.y, values(r.output), spread_tolerance(r.output, norm_rel));
  else if (k_fwd > 0)
    check_within(kind + " forward", got.y, values(r.output), product_tolerance(mr.output, k_fwd));
  else
    check_within(kind + " forward", got.y, values(r.output), pointwise_tolerance(r.output));
  REQUIRE(got.dx.size() == cdx.size());
  for (std::size_t i = 0; i < cdx.size(); ++i) {
    if (k_dx < 0)
      check_within(kind + " dx" + std::to_string(i), got.dx[i], values(cdx[i]), spread_tolerance(cdx[i], norm_rel));
    else if (k_dx > 0)
      check_within(kind + " dx" + std::to_string(i), got.dx[i], values(cdx[i]), product_tolerance(mdx[i], k_dx));
    else
      check_within(kind + " dx" + std::to_string(i), got.dx[i], values(cdx[i]), pointwise_tolerance(cdx[i], &dy));
  }
  auto want = cpu->parameters();
  auto m = mag->parameters();
  REQUIRE(got.dw.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    // Bias gradients are plain sums of dy over the batch (and pixels): magnitude Σ|dy|.
    if (k_dw < 0)
      check_within(kind + " grad " + want[i].name, got.dw[i], values(*want[i].grad),
                   spread_tolerance(*want[i].grad, norm_rel));
    else
      check_within(kind + " grad " + want[i].name, got.dw[i], values(*want[i].grad),
                   product_tolerance(*m[i].grad, k_dw));
  }
}

}  // namespace

TEST_SUITE("gpu.layers") {
  TEST_CASE("every built-in layer written with ops matches the CPU layer on random data on the device") {
    layer_fixture fx;
    SUBCASE("Linear") {
      compare_layer(fx, [] { return std::make_unique<layers::linear>(37, 19); }, [&] {
        std::vector<layers::tensor> v;
        v.push_back(fx.random(23, {37}));
        return v;
      }(), 37, 19, 23);
    }
    SUBCASE("Linear without bias, one row") {
      compare_layer(fx, [] { return std::make_unique<layers::linear>(300, 10, false); }, [&] {
        std::vector<layers::tensor> v;
        v.push_back(fx.random(1, {300}));
        return v;
      }(), 300, 10, 1);
    }
    auto one = [&](std::int64_t n, layers::shape s) {
      std::vector<layers::tensor> v;
      v.push_back(fx.random(n, std::move(s)));
      return v;
    };
    SUBCASE("ReLU") { compare_layer(fx, [] { return std::make_unique<layers::basic_relu<float>>(); }, one(9, {33}), 0, 0, 0); }
    SUBCASE("LeakyReLU") {
      compare_layer(fx, [] { return std::make_unique<layers::basic_leaky_relu<float>>(layers::activation_ops::leaky_relu{0.2}); },
                    one(9, {33}), 0, 0, 0);
    }
    SUBCASE("Sigmoid") { compare_layer(fx, [] { return std::make_unique<layers::basic_sigmoid<float>>(); }, one(9, {33}), 0, 0, 0); }
    SUBCASE("Tanh") { compare_layer(fx, [] { return std::make_unique<layers::basic_tanh<float>>(); }, one(9, {33}), 0, 0, 0); }
    SUBCASE("GELU") { compare_layer(fx, [] { return std::make_unique<layers::basic_gelu<float>>(); }, one(9, {33}), 0, 0, 0); }
    SUBCASE("Conv2d 3→4, 3×3, padding 1") {
      // forward: C·kh·kw = 27 terms (+ bias); dx: K·kh·kw = 36; dW: N·OH·OW = 5·64.
      compare_layer(fx, [] { return std::make_unique<layers::basic_conv2d<float>>(3, 4, 3, 1, 1); }, one(5, {3, 8, 8}),
                    27, 36, 5 * 64);
    }
    SUBCASE("Conv2d 2→3, 5×5, stride 2, no bias") {
      compare_layer(fx, [] { return std::make_unique<layers::basic_conv2d<float>>(2, 3, 5, 2, 0, false); },
                    one(3, {2, 11, 9}), 50, 75, 3 * 12);
    }
    SUBCASE("MaxPool2d 2") { compare_layer(fx, [] { return std::make_unique<layers::max_pool2d>(2); }, one(4, {3, 6, 6}), 0, 0, 0); }
    SUBCASE("AvgPool2d 3, stride 2, padding 1") {
      compare_layer(fx, [] { return std::make_unique<layers::basic_avg_pool2d<float>>(3, 2, 1); }, one(4, {3, 7, 7}), 9, 9, 0);
    }
    SUBCASE("Dropout 0.3 (the CPU's mask)") {
      compare_layer(fx, [] { return std::make_unique<layers::dropout>(0.3); }, one(5, {41}), 0, 0, 0);
    }
    SUBCASE("Concat of channels") {
      std::vector<layers::tensor> v;
      v.push_back(fx.random(6, {3, 4, 4}));
      v.push_back(fx.random(6, {2, 4, 4}));
      compare_layer(fx, [] { return std::make_unique<layers::concat>(); }, std::move(v), 0, 0, 0);
    }
    SUBCASE("BatchNorm2d over 3 channels (batch statistics, running statistics updated)") {
      compare_layer(fx, [] { return std::make_unique<layers::batch_norm>(3); }, one(5, {3, 4, 6}), -1, -1, -1);
    }
    SUBCASE("BatchNorm1d without the affine map") {
      compare_layer(fx, [] { return std::make_unique<layers::batch_norm>(7, 1e-5, 0.3, false); }, one(9, {7}), -1, -1,
                    -1);
    }
    SUBCASE("LayerNorm over [2, 3, 5]") {
      compare_layer(fx, [] { return std::make_unique<layers::layer_norm>(layers::shape{2, 3, 5}); }, one(4, {2, 3, 5}),
                    -1, -1, -1);
    }
    SUBCASE("Linear over a sequence's tokens, [T, in] samples") {
      compare_layer(fx, [] { return std::make_unique<layers::linear>(12, 7); }, one(5, {6, 12}), 12, 7, 30);
    }
    SUBCASE("LayerNorm of [F] over a sequence's tokens") {
      compare_layer(fx, [] { return std::make_unique<layers::layer_norm>(layers::shape{8}); }, one(3, {5, 8}),
                    -1, -1, -1);
    }
    // Attention: products, a softmax and products again; each result within 64 float
    // roundings of the tensor's largest magnitude, as a normalisation's.
    SUBCASE("MultiheadAttention over [T, C] samples") {
      compare_layer(fx, [] { return std::make_unique<layers::multihead_attention>(12, 3); }, one(3, {5, 12}), -1, -1,
                    -1);
    }
    SUBCASE("causal MultiheadAttention") {
      compare_layer(fx, [] { return std::make_unique<layers::multihead_attention>(8, 2, true); }, one(2, {6, 8}), -1,
                    -1, -1);
    }
    SUBCASE("LayerNorm without a bias") {
      compare_layer(fx, [] { return std::make_unique<layers::layer_norm>(layers::shape{17}, 1e-5, true, false); },
                    one(3, {17}), -1, -1, -1);
    }
    SUBCASE("Flatten") { compare_layer(fx, [] { return std::make_unique<layers::basic_flatten<float>>(); }, one(4, {3, 5, 5}), 0, 0, 0); }
    SUBCASE("Add") {
      std::vector<layers::tensor> v;
      v.push_back(fx.random(6, {17}));
      v.push_back(fx.random(6, {17}));
      compare_layer(fx, [] { return std::make_unique<layers::basic_add<float>>(); }, std::move(v), 2, 0, 0);
    }
  }

  TEST_CASE("training steps track the direct executor on the CPU") {
    struct preset_case {
      const char* model;
      std::int64_t batch;
      std::size_t micro;
      const char* optimizer;
    };
    const preset_case cases[] = {
        {"mlp", 32, 1, "sgd"}, {"mlp", 33, 3, "adam"}, {"resmlp", 16, 2, "sgd"}, {"lenet", 8, 2, "sgd"}, {"deep-mlp", 8, 1, "adamw"}};
    for (const auto& c : cases) {
      const std::string model = c.model, optimizer = c.optimizer;
      CAPTURE(model);
      CAPTURE(optimizer);
      layer_fixture fx;
      auto cpu_graph = layers::make_preset(c.model, 7);
      auto dev_graph = layers::make_preset(c.model, 7);  // same seed: the same initial weights
      const double lr = std::string(c.optimizer) == "sgd" ? 0.05 : 1e-3;
      auto opt = layers::make_optimizer<float>(c.optimizer, lr, std::string(c.optimizer) == "sgd" ? 0.9 : 0.0);
      device_net net(dev_graph, {c.optimizer, lr, std::string(c.optimizer) == "sgd" ? 0.9 : 0.0});
      layers::direct_executor exec(cpu_graph);
      layers::cross_entropy loss;
      const auto sample = cpu_graph.nodes()[cpu_graph.inputs()[0]].output_shape;
      for (int step = 0; step < 3; ++step) {
        auto x = fx.random(c.batch, sample);
        layers::targets y;
        std::uniform_int_distribution<int> label(0, 9);
        for (std::int64_t i = 0; i < c.batch; ++i) y.labels.push_back(label(fx.rng));
        auto got = net.net.train_step(x.clone(), y.clone(), c.micro, std::uint64_t(step)).get();
        auto want = exec.train_step(std::move(x), y, loss, *opt, c.micro, std::uint64_t(step));
        CHECK(got.samples == want.samples);
        CHECK(got.loss == doctest::Approx(want.loss).epsilon(1e-4));
        CHECK(std::abs(got.correct - want.correct) <= 1);  // a near-tie may flip
      }
      net.be->download();
      auto want = cpu_graph.parameters();
      auto got = dev_graph.parameters();
      for (std::size_t i = 0; i < want.size(); ++i) {
        double scale = 0;
        for (std::int64_t j = 0; j < want[i].value->size(); ++j) scale = std::max(scale, double(std::abs(want[i].value->data()[j])));
        const double tight = 1e-4 * scale;
        if (optimizer == "sgd") {
          check_within(want[i].name, values(*got[i].value), values(*want[i].value),
                       std::vector<double>(std::size_t(want[i].value->size()), tight));
          continue;
        }
        // Adam divides by √v: where a gradient is at the rounding-noise floor the step is
        // ±lr whatever its digits, so a few elements may differ by up to 2·lr per step.
        // Most must still agree tightly.
        std::size_t loose = 0;
        double worst = 0;
        for (std::int64_t j = 0; j < want[i].value->size(); ++j) {
          const double err = std::abs(double(got[i].value->data()[j]) - double(want[i].value->data()[j]));
          worst = std::max(worst, err);
          if (err > tight) ++loose;
        }
        INFO(want[i].name << ": " << loose << " of " << want[i].value->size() << " beyond " << tight << ", worst " << worst);
        CHECK(double(loose) <= 1e-3 * double(want[i].value->size()) + 1);
        CHECK(worst <= 2.0 * lr * 3 + tight);
      }
    }
  }

  TEST_CASE("one step of M micro-batches on the device delivers exactly E·M forwards and E·M gradients through bus signals") {
    for (std::string_view model : {"mlp", "resmlp", "lenet"}) {
      for (std::size_t m : {1u, 4u}) {
        CAPTURE(model);
        CAPTURE(m);
        auto g = layers::make_preset(model, 1);
        // Edges from the graph itself: every layer input fed by a layer, plus the loss.
        std::uint64_t e = 1, inputs = 0;
        for (auto& n : g.nodes())
          for (std::size_t p : n.inputs) (g.nodes()[p].is_input() ? inputs : e) += 1;
        device_net net(g, {"sgd", 0.1});
        layer_fixture fx;
        const auto in = g.nodes()[g.inputs()[0]].output_shape;
        auto step = [&](std::uint64_t k) {
          layers::targets y;
          for (int i = 0; i < 8; ++i) y.labels.push_back(i % 10);
          return net.net.train_step(fx.random(8, in), std::move(y), m, k).get();
        };
        CHECK(step(0).samples == 8);
        auto t = net.net.traffic();
        CHECK(t.forward == e * m);
        CHECK(t.backward == e * m);
        CHECK(t.feed == inputs * m);
        step(1);
        t = net.net.traffic();
        CHECK(t.forward == 2 * e * m);
        CHECK(t.backward == 2 * e * m);
        layers::targets y;
        for (int i = 0; i < 8; ++i) y.labels.push_back(i % 10);
        CHECK(net.net.evaluate(fx.random(8, in), std::move(y)).get().samples == 8);  // forward only
        CHECK(net.net.traffic().forward == 2 * e * m + e);
        CHECK(net.net.traffic().backward == 2 * e * m);
      }
    }
  }

  TEST_CASE("the layer actors enqueue a whole step at once; its end and the hooks wait for the device") {
    auto g = layers::make_preset("mlp", 1);
    const std::size_t m = 2;
    int forwards = 0, backwards = 0;  // loop 0 writes them; read after the step
    layers::tensor first_y;           // fc1's output of step 0, micro-batch 0, as its hook saw it
    g.register_forward_hook("fc1", [&](const layers::hook_context& c, layers::tensor& y) {
      CHECK(c.training);
      CHECK(y.batch() == 4);
      CHECK(y.features() == 256);
      if (c.step == 0 && c.micro_batch == 0) first_y = y.clone();
      ++forwards;
    });
    g.register_backward_hook("fc2", [&](const layers::hook_context&, std::vector<layers::tensor>& dx, const layers::tensor& dy) {
      REQUIRE(dx.size() == 1);
      CHECK(dx[0].features() == 256);
      CHECK(dy.features() == 10);
      ++backwards;
    });
    device_net net(g, {"sgd", 0.1}, 64, /*count_completions=*/false, /*record=*/true);
    auto node_dones = [&] {  // the coordinator's runs of node_done so far (the runtime idle)
      int n = 0;
      const auto trace = net.rt.trace().to_chrome_trace(nlohmann::json::array(), nlohmann::json::object());
      for (auto& e : trace["traceEvents"])
        if (e["ph"] == "X" && e.value("cat", "") == "handler" && e["name"] == "node_done") ++n;
      return n;
    };
    // The first step runs ungated: the kernels are loaded and cuBLAS has run (testing.hpp).
    layer_fixture fx;
    auto labels = [] {
      layers::targets y;
      for (int i = 0; i < 8; ++i) y.labels.push_back(i);
      return y;
    };
    auto x0 = fx.random(8, {784});
    auto want = layers::make_preset("mlp", 1).nodes()[g.index_of("fc1")].layer->forward(x0.slice(0, 4)).output;
    net.net.train_step(std::move(x0), labels(), m, 0).get();
    CHECK(forwards == int(m));
    CHECK(backwards == int(m));
    REQUIRE(first_y.size() == want.size());
    double scale = 0;
    for (std::int64_t i = 0; i < want.size(); ++i) scale = std::max(scale, double(std::abs(want.data()[i])));
    check_within("fc1 output in its hook", values(first_y), values(want),
                 std::vector<double>(std::size_t(want.size()), 1e-4 * scale));
    gpu::testing::gate gate(net.dev);
    gate.enqueue(net.be->stream());
    auto f = net.net.train_step(fx.random(8, {784}), labels(), m, 1);
    net.rt.synchronize();  // every actor handled every message: the whole step is enqueued
    const auto e = net.net.plan().gradient_edges;
    CHECK(net.net.traffic().forward == 2 * e * m);  // device-resident payloads, ready by stream order
    CHECK(net.net.traffic().backward == 2 * e * m);
    CHECK(forwards == int(m));  // the hooks' downloads are behind the gate
    CHECK(backwards == int(m));
    CHECK(node_dones() == 3);  // step 0's fc1, relu1, fc2: step 1's updates are behind the gate
    gate.open();
    CHECK(f.get().samples == 8);
    net.rt.synchronize();  // the coordinator's last run is recorded after it answered
    CHECK(node_dones() == 6);
    CHECK(forwards == int(2 * m));
    CHECK(backwards == int(2 * m));
  }

  TEST_CASE("two steps asked back to back are enqueued together and give the bits of one step at a time") {
    auto g_seq = layers::make_preset("mlp", 5), g_two = layers::make_preset("mlp", 5);
    layer_fixture fx;
    const std::size_t m = 2;
    std::vector<layers::tensor> xs;
    for (int k = 0; k < 3; ++k) xs.push_back(fx.random(8, {784}));
    auto labels = [](int k) {
      layers::targets y;
      for (int i = 0; i < 8; ++i) y.labels.push_back((i + k) % 10);
      return y;
    };
    std::vector<double> want_loss;
    {
      device_net seq(g_seq, {"sgd", 0.1, 0.9});
      for (int k = 0; k < 3; ++k)
        want_loss.push_back(seq.net.train_step(xs[std::size_t(k)].clone(), labels(k), m, std::uint64_t(k)).get().loss);
      seq.be->download();
    }
    device_net two(g_two, {"sgd", 0.1, 0.9}, 64, /*count_completions=*/false);
    REQUIRE(two.net.steps_in_flight() == 2);
    two.net.train_step(xs[0].clone(), labels(0), m, 0).get();  // kernels loaded before the gate
    gpu::testing::gate gate(two.dev);
    gate.enqueue(two.be->stream());
    auto f1 = two.net.train_step(xs[1].clone(), labels(1), m, 1);
    auto f2 = two.net.train_step(xs[2].clone(), labels(2), m, 2);
    two.rt.synchronize();  // every actor handled every message it had
    // Both steps are on the stream behind the gate: step 2 did not wait for step 1's end.
    const auto e = two.net.plan().gradient_edges;
    CHECK(two.net.traffic().forward == 3 * e * m);
    CHECK(two.net.traffic().backward == 3 * e * m);
    gate.open();
    CHECK(f1.get().loss == want_loss[1]);
    CHECK(f2.get().loss == want_loss[2]);
    two.rt.synchronize();
    two.be->download();
    auto pa = g_seq.parameters(), pb = g_two.parameters();
    REQUIRE(pa.size() == pb.size());
    for (std::size_t i = 0; i < pa.size(); ++i) {
      INFO(pa[i].name);
      CHECK(std::equal(pa[i].value->data(), pa[i].value->data() + pa[i].value->size(), pb[i].value->data()));
    }
  }

  TEST_CASE("predict on the device gives the direct executor's output (downloaded by the coordinator)") {
    auto cpu_graph = layers::make_preset("resmlp", 3);
    auto dev_graph = layers::make_preset("resmlp", 3);
    device_net net(dev_graph, {"sgd", 0.1});
    layer_fixture fx;
    auto x = fx.random(12, {784});
    auto want = layers::direct_executor(cpu_graph).predict(x.clone());
    auto got = net.net.predict(std::move(x)).get();
    REQUIRE(got.batch() == 12);
    REQUIRE(got.features() == want.features());
    double scale = 0;
    for (std::int64_t i = 0; i < want.size(); ++i) scale = std::max(scale, double(std::abs(want.data()[i])));
    check_within("resmlp output", values(got), values(want), std::vector<double>(std::size_t(want.size()), 1e-4 * scale));
  }

  TEST_CASE("a device network's actors share one loop, and its loss is one written with ops") {
    auto g = layers::make_preset("mlp", 1);
    actors::runtime rt({.loops = 2});
    gpu::device dev(gpu::test::layers_suite_options());
    auto be = std::make_shared<gpu::device_backend>(dev, g);
    auto ce = std::make_shared<layers::cross_entropy>();
    CHECK_THROWS_AS(layers::network(rt, g, ce, {}, {.spread = true, .backend = be}), std::invalid_argument);
    CHECK_THROWS_AS(layers::network(rt, g, ce, {}, {.loops = std::vector<unsigned>(g.nodes().size()), .backend = be}),
                    std::invalid_argument);
    // A loss with a host forward and backward only: refused on a device, by its kind.
    struct host_loss final : layers::loss {
      std::string_view kind() const noexcept override { return "HostLoss"; }
      result forward(const layers::tensor&, const layers::targets&) const override { return {}; }
      layers::tensor backward(const layers::stash&, float) const override { return {}; }
    };
    CHECK_THROWS_WITH_AS(layers::network(rt, g, std::make_shared<host_loss>(), {}, {.backend = be}),
                         "device backend: the loss HostLoss is not written with ops (layers::op_loss), so it runs on "
                         "the CPU only",
                         std::invalid_argument);
  }

  TEST_CASE("MSE, written with ops, trains on the device to the CPU's weights and losses") {
    // Before the losses were written with ops the device ran softmax cross-entropy only
    // and refused MSE.
    auto cpu_graph = layers::make_preset("mlp", 5);
    auto dev_graph = layers::make_preset("mlp", 5);
    actors::runtime rt({.loops = 1});
    gpu::device dev(gpu::test::layers_suite_options());
    auto be = std::make_shared<gpu::device_backend>(dev, dev_graph, device_net::backend_options({"sgd", 0.05, 0.9}, 64));
    auto criterion = std::make_shared<layers::mse>();
    layers::network net(rt, dev_graph, criterion, {}, {.backend = be});
    auto opt = layers::make_optimizer<float>("sgd", 0.05, 0.9);
    layers::direct_executor exec(cpu_graph);
    layer_fixture fx;
    for (int step = 0; step < 3; ++step) {
      auto x = fx.random(20, {784});
      layers::targets y;
      y.values = fx.random(20, {10});
      auto got = net.train_step(x.clone(), y.clone(), 2, std::uint64_t(step)).get();
      auto want = exec.train_step(std::move(x), y, *criterion, *opt, 2, std::uint64_t(step));
      CHECK(got.samples == 20);
      CHECK(got.correct == 0);
      CHECK(got.loss == doctest::Approx(want.loss).epsilon(1e-5));
    }
    rt.synchronize();
    be->download();
    check_parameters_within(dev_graph, cpu_graph, 1e-4);
  }

  TEST_CASE("causal attention and cross-entropy over every token train on the device to the CPU's weights") {
    // A GPT's shape in small: [T, C] tokens through causal attention and a per-token head,
    // a label per token ([B, T] labels), two micro-batches of sequences.
    auto build = [] {
      layers::graph_builder b;
      b.input("tokens", {6, 8});
      b.add("attn", std::make_unique<layers::multihead_attention>(8, 2, true), {"tokens"});
      b.add("head", std::make_unique<layers::linear>(8, 5), {"attn"});
      return b.build(4);
    };
    auto cpu_graph = build(), dev_graph = build();
    actors::runtime rt({.loops = 1});
    gpu::device dev(gpu::test::layers_suite_options());
    auto be = std::make_shared<gpu::device_backend>(dev, dev_graph, device_net::backend_options({"sgd", 0.05, 0.9}, 64));
    auto criterion = std::make_shared<layers::cross_entropy>();
    layers::network net(rt, dev_graph, criterion, {}, {.backend = be});
    auto opt = layers::make_optimizer<float>("sgd", 0.05, 0.9);
    layers::direct_executor exec(cpu_graph);
    layer_fixture fx;
    for (int step = 0; step < 3; ++step) {
      auto x = fx.random(10, {6, 8});
      layers::targets y;
      y.labels_per_sample = 6;
      std::uniform_int_distribution<int> label(0, 4);
      for (int i = 0; i < 60; ++i) y.labels.push_back(label(fx.rng));
      auto got = net.train_step(x.clone(), y.clone(), 2, std::uint64_t(step)).get();
      auto want = exec.train_step(std::move(x), y, *criterion, *opt, 2, std::uint64_t(step));
      CHECK(got.samples == 10);
      CHECK(got.loss == doctest::Approx(want.loss).epsilon(1e-5));
    }
    rt.synchronize();
    be->download();
    check_parameters_within(dev_graph, cpu_graph, 1e-4);
  }

  TEST_CASE("a head tied to its embedding sums both gradients on the device: the copies stay equal, the CPU's weights") {
    auto cpu_graph = nerve::test::tiny_lm(), dev_graph = nerve::test::tiny_lm();
    actors::runtime rt({.loops = 1});
    gpu::device dev(gpu::test::layers_suite_options());
    auto be = std::make_shared<gpu::device_backend>(dev, dev_graph, device_net::backend_options({"sgd", 0.05, 0.9}, 64));
    auto criterion = std::make_shared<layers::cross_entropy>();
    layers::network net(rt, dev_graph, criterion, {}, {.backend = be});
    auto opt = layers::make_optimizer<float>("sgd", 0.05, 0.9);
    layers::direct_executor exec(cpu_graph);
    for (std::uint64_t step = 0; step < 3; ++step) {
      auto b1 = nerve::test::tiny_lm_batch(7, 30 + step), b2 = nerve::test::tiny_lm_batch(7, 30 + step);
      auto got = net.train_step(std::move(b1.x), std::move(b1.t), 2, step).get();
      auto want = exec.train_step(std::move(b2.x), b2.t, *criterion, *opt, 2, step);
      CHECK(got.loss == doctest::Approx(want.loss).epsilon(1e-5));
    }
    rt.synchronize();
    be->download();
    check_parameters_within(dev_graph, cpu_graph, 1e-4);
    auto& w = dev_graph.layer<layers::embedding>("wte").weight();
    auto& h = dev_graph.layer<layers::linear>("head").weight();
    CHECK(std::equal(w.data(), w.data() + w.size(), h.data(), h.data() + h.size()));
  }

#if NERVE_GPU_LAYERS_STANDIN
  // On CUDA a planted fault ends the process's context: gpu_fault_test does that in its own process.
  TEST_CASE("a failed step reaches its caller as an error, and later steps fail the same way") {
    auto g = layers::make_preset("mlp", 1);
    device_net net(g, {"sgd", 0.1});
    layer_fixture fx;
    auto labels = [] { return layers::targets{{0, 1, 2, 3}, {}}; };
    CHECK(net.net.train_step(fx.random(4, {784}), labels()).get().samples == 4);
    gpu::testing::enqueue_fault(net.be->stream());
    // The actor whose completion saw the fault fails the run, quoting the device's error.
    CHECK_THROWS_WITH(net.net.train_step(fx.random(4, {784}), labels()).get(), doctest::Contains("stream failed"));
    CHECK_THROWS_WITH(net.net.train_step(fx.random(4, {784}), labels()).get(),
                      doctest::Contains("the network stopped because of the first failure"));
  }
#endif

  TEST_CASE("--trace of a device run: a track per layer with a forward and a backward run per micro-batch") {
    gpu::register_devices();
    nerve::testing::tiny_fashion_mnist data(32, 8);
    layers::train_options o;
    o.model = "mlp";
    o.device = suite_device();
    o.data = data.dir;
    o.batch = 16;
    o.micro_batches = 2;
    o.steps = 2;
    o.evaluate = false;
    o.trace = data.dir / "trace.json";
    auto g = layers::make_preset("mlp", 0);
    CHECK(layers::train(g, o).steps == 2);
    std::ifstream in(o.trace);
    auto j = nlohmann::json::parse(in);
    std::map<std::string, std::int64_t> tid_of;
    std::map<std::int64_t, std::pair<int, int>> runs;  // tid -> (forward, backward)
    for (auto& e : j["traceEvents"]) {
      if (e["ph"] == "M" && e["name"] == "thread_name") tid_of[e["args"]["name"]] = e["tid"].get<std::int64_t>();
      if (e["ph"] == "X" && e.value("cat", "") == "handler") {
        if (e["name"] == "forward") ++runs[e["tid"].get<std::int64_t>()].first;
        if (e["name"] == "backward") ++runs[e["tid"].get<std::int64_t>()].second;
      }
    }
    const auto plan = layers::make_plan(g);
    int layers_seen = 0;
    for (std::size_t i = 0; i < g.nodes().size(); ++i) {
      const auto& n = g.nodes()[i];
      if (n.is_input()) continue;
      CAPTURE(n.name);
      REQUIRE(tid_of.count(n.name) == 1);
      const auto r = runs[tid_of[n.name]];
      CHECK(r.first == int(o.steps * o.micro_batches * n.inputs.size()));
      CHECK(r.second == int(o.steps * o.micro_batches * plan.nodes[i].edge_count()));
      ++layers_seen;
    }
    CHECK(layers_seen == 3);  // fc1, relu1, fc2
  }

  TEST_CASE("the trainer runs a preset on the device engine as on the CPU one") {
    // NERVE_FASHION_MNIST: the files elsewhere (the GPU machine has no Debian package).
    const char* dir = std::getenv("NERVE_FASHION_MNIST");
    const std::filesystem::path data = dir ? dir : "/usr/share/datasets/fashion-mnist";
    if (!std::filesystem::exists(data / "train-images-idx3-ubyte.gz") && !std::filesystem::exists(data / "train-images-idx3-ubyte")) {
      MESSAGE("no Fashion-MNIST in " << data << ": not run");
      return;
    }
    layers::train_options o = layers::preset_defaults("mlp");
    o.steps = 4;
    o.batch = 64;
    o.evaluate = false;
    o.data = data;
    const std::string spec = suite_device();
    gpu::register_devices();
    auto cpu = layers::train(o);
    o.device = spec;
    auto dev = layers::train(o);
    REQUIRE(cpu.epochs.size() == 1);
    REQUIRE(dev.epochs.size() == 1);
    CHECK(dev.steps == 4);
    CHECK(dev.epochs[0].train_loss == doctest::Approx(cpu.epochs[0].train_loss).epsilon(1e-4));
  }

  TEST_CASE("a device run stopped mid-epoch and resumed from its checkpoint ends with the uninterrupted run's bits") {
    const std::string spec = suite_device();
    gpu::register_devices();
    nerve::testing::tiny_fashion_mnist data(160, 20);
    for (std::string opt : {"sgd", "adam"}) {
      CAPTURE(opt);
      layers::train_options o;
      o.model = "mlp";
      o.device = spec;
      o.data = data.dir;
      o.epochs = 2;
      o.batch = 48;  // 4 steps an epoch, the last of 16 rows
      o.optimizer = opt;
      o.lr = opt == "sgd" ? 0.05 : 0.002;
      o.momentum = opt == "sgd" ? 0.9 : 0;
      auto whole = layers::make_preset("mlp", 0);
      auto want = layers::train(whole, o);
      REQUIRE(want.steps == 8);
      // The engine fails step 6 as a killed process would stop there; checkpoints every 2.
      struct crashing : layers::train_engine {
        std::unique_ptr<layers::train_engine> inner;
        std::future<layers::step_result> train_step(layers::tensor x, layers::targets y, std::size_t m,
                                                    std::uint64_t step, double lr) override {
          if (step == 6) throw std::runtime_error("killed");
          return inner->train_step(std::move(x), std::move(y), m, step, lr);
        }
        std::future<layers::step_result> evaluate(layers::tensor x, layers::targets y) override {
          return inner->evaluate(std::move(x), std::move(y));
        }
        void finish() override { inner->finish(); }
        void sync_weights() override { inner->sync_weights(); }
        layers::optimizer_state optimizer_state_of() override { return inner->optimizer_state_of(); }
        void load_optimizer_state(const layers::optimizer_state& s) override { inner->load_optimizer_state(s); }
      };
      auto ck = o;
      ck.checkpoint = data.dir / ("ck-" + opt);
      ck.checkpoint_every = 2;
      auto g = layers::make_preset("mlp", 0);
      CHECK_THROWS_WITH(layers::train(g, ck, {}, {},
                                      [](actors::runtime& rt, layers::graph& gg, const layers::train_options& oo) {
                                        auto e = std::make_unique<crashing>();
                                        e->inner = layers::engine_for(oo.device)(rt, gg, oo);
                                        return e;
                                      }),
                        "killed");
      auto ro = layers::resume_options(ck.checkpoint);
      CHECK(ro.device == spec);
      auto resumed = layers::make_preset("mlp", 1);  // other weights: the checkpoint's replace them
      auto got = layers::train(resumed, ro);
      CHECK(got.steps == 8);
      auto pa = resumed.parameters(), pb = whole.parameters();
      for (std::size_t i = 0; i < pa.size(); ++i) {
        CAPTURE(pa[i].name);
        CHECK(std::memcmp(pa[i].value->data(), pb[i].value->data(), sizeof(float) * std::size_t(pa[i].value->size())) == 0);
      }
    }
  }

  TEST_CASE("--device values: one parser over the one registry, which this build's devices join") {
    gpu::register_devices();
    const auto kinds = layers::device_kinds();
    CHECK(kinds == std::vector<std::string>{"cpu", "cuda", "standin"});
    auto d = layers::parse_device("cpu");
    CHECK(d.cpu());
    d = layers::parse_device("cuda");
    CHECK(d.kind == "cuda");
    CHECK(d.ordinal == -1);  // the process's own: its local rank's under mpirun, else 0
    d = layers::parse_device("cuda:3");
    CHECK(d.ordinal == 3);
    CHECK(layers::parse_device("standin").kind == "standin");
    CHECK_THROWS_WITH_AS(layers::parse_device("cuda:x"), "--device 'cuda:x': expected cuda:N with N a device number",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(layers::parse_device("cpu:1", "--devices"), "--devices 'cpu:1': expected cpu, with no number",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(layers::parse_device("tpu"), doctest::Contains("unknown --device 'tpu' (this build has: cpu, cuda, standin"),
                         std::invalid_argument);
    // The stand-in opens from its name and makes backends for a graph's layers.
    actors::runtime rt(actors::runtime_options{.loops = 1});
    auto dev = layers::open_device(layers::parse_device("standin"), layers::device_request{.rt = &rt});
    CHECK(dev->name().find("stand") != std::string::npos);
    auto g = layers::make_preset("mlp", 0);
    CHECK(dev->make_backend(g, {}, layers::optimizer_settings{}, 64)->on_device());
  }

  TEST_CASE("the embedding layers match their CPU twins on the device") {
    layer_fixture fx;
    auto one = [&](std::int64_t n, layers::shape s) {
      std::vector<layers::tensor> v;
      v.push_back(fx.random(n, std::move(s)));
      return v;
    };
    SUBCASE("Embedding, ids repeating across the batch") {
      std::vector<layers::tensor> v;
      v.emplace_back(6, layers::shape{9});
      std::uniform_int_distribution<int> id(0, 10);
      for (std::int64_t i = 0; i < v[0].size(); ++i) v[0].data()[i] = float(id(fx.rng));
      // dW: a row sums at most the batch's 54 tokens.
      compare_layer(fx, [] { return std::make_unique<layers::embedding>(11, 37); }, std::move(v), 0, 0, 54);
    }
    SUBCASE("PositionalEmbedding") {
      compare_layer(fx, [] { return std::make_unique<layers::positional_embedding>(5, 8); }, one(4, {5, 8}), 0, 0, 4);
    }
    SUBCASE("ClassToken") {
      compare_layer(fx, [] { return std::make_unique<layers::class_token>(8); }, one(4, {5, 8}), 0, 0, 4);
    }
    SUBCASE("SelectToken") {
      compare_layer(fx, [] { return std::make_unique<layers::select_token>(2); }, one(3, {5, 8}), 0, 0, 0);
    }
    SUBCASE("PatchEmbedding 7×7 of Fashion-MNIST-sized images") {
      // forward: 49 terms (+ bias); dx: 16 (dim); dW: 3 images × 16 patches.
      compare_layer(fx, [] { return std::make_unique<layers::patch_embedding>(7, 16); }, one(3, {1, 28, 28}), 49, 16,
                    48);
    }
    SUBCASE("PatchEmbedding 3×3 of two channels") {
      compare_layer(fx, [] { return std::make_unique<layers::patch_embedding>(3, 5, 2); }, one(2, {2, 6, 9}), 18, 5,
                    12);
    }
  }

  TEST_CASE("an id that names no row: the stand-in refuses it naming the layer, CUDA gathers a zero row") {
    layer_fixture fx;
    layers::embedding e(5, 3);
    e.set_name("wte");
    e.reset_parameters(fx.rng);
    const std::vector<float> ids{1, 4, 7, 0};
    auto dids = std::make_shared<gpu::device_tensor>(gpu::upload(fx.s, ids.data(), {2, 2}));
    auto w = e.parameters()[0];
    auto dw = std::make_shared<gpu::device_tensor>(gpu::upload(fx.s, w.value->data(), {5, 3}));
    gpu::device_op_set set(fx.s, "suite");
    auto run = [&] {
      return layers::basic_op_run<float>(e, set, {gpu::device_op_set::array_of(dids)},
                                         {layers::array{{5, 3}, dw->data(), nullptr, -1}}, 1, false, {});
    };
    if (suite_device() == "standin") {
      CHECK_THROWS_WITH_AS(run(), "wte (Embedding): id 7 at sample 1, position 0 is not an integer in [0, 5)",
                           std::invalid_argument);
      // The same in a network on the device engine: the step fails with it.
      layers::graph_builder b;
      b.input("ids", {2});
      b.add("wte", layers::embedding(5, 3), {"ids"});
      b.add("first", layers::select_token(0), {"wte"});
      b.add("head", layers::linear(3, 2), {"first"});
      auto g = b.build(1);
      device_net net(g, {"sgd", 0.1, 0.0});
      layers::tensor x(2, layers::shape{2});
      std::copy(ids.begin(), ids.end(), x.data());
      layers::targets y;
      y.labels = {0, 1};
      auto f = net.net.train_step(std::move(x), std::move(y));
      CHECK_THROWS_WITH(f.get(), doctest::Contains("wte (Embedding): id 7 at sample 1, position 0 is not an integer"));
      return;
    }
    auto r = run();
    const auto y = gpu::download(fx.s, *set.tensor_of(r.output()));
    REQUIRE(y.size() == 12);
    for (std::size_t t = 0; t < 4; ++t)
      for (std::size_t c = 0; c < 3; ++c) {
        CAPTURE(t);
        CAPTURE(c);
        CHECK(y[t * 3 + c] == (t == 2 ? 0.0f : w.value->data()[std::size_t(ids[t]) * 3 + c]));
      }
  }

  TEST_CASE("a ViT's embedding and head train on the device as on the CPU: patches, class token, positions") {
    // [1, 28, 28] → patch 7×7 → 16 tokens of 64 → class token → 17 + positions → LayerNorm
    // → the class token → 10 classes.
    auto build = [] {
      layers::graph_builder b;
      b.input("input", {1, 28, 28});
      b.add("patch", layers::patch_embedding(7, 64), {"input"});
      b.add("cls", layers::class_token(64), {"patch"});
      b.add("pos", layers::positional_embedding(17, 64), {"cls"});
      b.add("ln", layers::layer_norm(layers::shape{64}), {"pos"});
      b.add("token", layers::select_token(0), {"ln"});
      b.add("head", layers::linear(64, 10), {"token"});
      return b.build(5);
    };
    for (const std::string optimizer : {"sgd", "adamw"}) {
      CAPTURE(optimizer);
      layer_fixture fx;
      auto cpu_graph = build(), dev_graph = build();
      const double lr = optimizer == "sgd" ? 0.05 : 1e-3, momentum = optimizer == "sgd" ? 0.9 : 0.0;
      auto opt = layers::make_optimizer<float>(optimizer, lr, momentum);
      device_net net(dev_graph, {optimizer, lr, momentum});
      layers::direct_executor exec(cpu_graph);
      layers::cross_entropy loss;
      for (int step = 0; step < 3; ++step) {
        auto x = fx.random(12, {1, 28, 28});
        layers::targets y;
        std::uniform_int_distribution<int> label(0, 9);
        for (int i = 0; i < 12; ++i) y.labels.push_back(label(fx.rng));
        auto got = net.net.train_step(x.clone(), y.clone(), 2, std::uint64_t(step)).get();
        auto want = exec.train_step(std::move(x), y, loss, *opt, 2, std::uint64_t(step));
        CHECK(got.samples == want.samples);
        CHECK(got.loss == doctest::Approx(want.loss).epsilon(1e-4));
      }
      net.be->download();
      auto want = cpu_graph.parameters(), got = dev_graph.parameters();
      REQUIRE(want.size() == 8);
      for (std::size_t i = 0; i < want.size(); ++i) {
        double scale = 0;
        for (std::int64_t j = 0; j < want[i].value->size(); ++j)
          scale = std::max(scale, double(std::abs(want[i].value->data()[j])));
        // Adam's steps at the noise floor move by ±lr whatever the digits (see the presets' test).
        const double tol = optimizer == "sgd" ? 1e-4 * scale : 1e-4 * scale + 2.0 * lr * 3;
        check_within(want[i].name, values(*got[i].value), values(*want[i].value),
                     std::vector<double>(std::size_t(want[i].value->size()), tol));
      }
    }
  }
}

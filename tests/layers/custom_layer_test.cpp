// docs/layers.md "Adding a layer", compiled and run: a layer written in a user's own
// project (no file of nerve's changes), checked with the public gradient checker, wired
// into a residual graph and trained through `network`. Keep the quoted blocks in step
// with the page.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>
#include <random>

// [custom-activation]
#include <cmath>

#include "layers/activation.hpp"

/// SiLU, x·σ(x) (PyTorch's nn.SiLU): an elementwise op is a `kind`, `f` and its derivative `df`.
struct silu_op {
  static constexpr std::string_view kind = "SiLU";
  template <class S> S f(S x) const { return x / (S(1) + std::exp(-x)); }
  template <class S> S df(S x) const {
    const S s = S(1) / (S(1) + std::exp(-x));
    return s * (S(1) + x * (S(1) - s));
  }
};
template <class S> using basic_silu = nerve::layers::basic_activation<S, silu_op>;
using silu = basic_silu<float>;
// [custom-activation]

// [custom-layer]
#include "layers/layer.hpp"

/// A learnable gain per channel: y[c, …] = γ[c] · x[c, …] on `[C, …]` samples.
template <class Scalar>
class basic_channel_scale final : public nerve::layers::basic_layer<Scalar> {
  using base = nerve::layers::basic_layer<Scalar>;

 public:
  // The base's member types are dependent names: bring in the ones the overrides use.
  using typename base::tensor_type;     // basic_tensor<Scalar>: a batch of samples
  using typename base::stash_type;      // what forward keeps for backward
  using typename base::forward_result;  // {output, stash}
  using typename base::parameter_ref;   // {name, value, grad, PyTorch shape}

  explicit basic_channel_scale(std::int64_t channels)
      : gain_(tensor_type::constant(1, {channels}, Scalar(1))), grad_(tensor_type::zeros(1, {channels})) {}

  std::string_view kind() const noexcept override { return "ChannelScale"; }
  std::vector<parameter_ref> parameters() override { return {{"weight", &gain_, &grad_, {channels()}}}; }
  void reset_parameters(std::mt19937_64&) override { gain_.matrix().setOnes(); }

 protected:
  nerve::layers::shape infer_shape(std::span<const nerve::layers::shape> inputs) const override {
    const auto& d = inputs[0].dims();
    if (d.empty() || d[0] != channels())  // `this->`: members of a dependent base need it
      throw this->mismatch(0, inputs[0], "[" + std::to_string(channels()) + ", …]");
    return inputs[0];
  }
  forward_result do_forward(std::vector<tensor_type>& inputs, const nerve::layers::forward_context&) override {
    tensor_type& x = inputs[0];
    tensor_type y(x.batch(), x.sample_shape());
    const std::int64_t per = x.features() / channels();
    for (std::int64_t c = 0; c < channels(); ++c)
      y.matrix().middleCols(c * per, per) = gain_.data()[c] * x.matrix().middleCols(c * per, per);
    forward_result r{std::move(y), {}};
    r.stash.tensors.push_back(std::move(x));  // W needs the input: keep it (moved, not copied)
    return r;
  }
  std::vector<tensor_type> do_backward_input(const stash_type& saved, const tensor_type& dy,
                                             nerve::layers::input_mask wanted) override {
    std::vector<tensor_type> g(1);
    if (!(wanted & 1)) return g;  // nobody needs this input's gradient
    g[0] = tensor_type(dy.batch(), saved.input_shapes[0]);
    const std::int64_t per = dy.features() / channels();
    for (std::int64_t c = 0; c < channels(); ++c)
      g[0].matrix().middleCols(c * per, per) = gain_.data()[c] * dy.matrix().middleCols(c * per, per);
    return g;
  }
  void do_backward_weight(const stash_type& saved, const tensor_type& dy) override {
    const tensor_type& x = saved.tensors[0];
    const std::int64_t per = dy.features() / channels();
    for (std::int64_t c = 0; c < channels(); ++c)  // += : gradients accumulate over micro-batches
      grad_.data()[c] += (dy.matrix().middleCols(c * per, per).array() * x.matrix().middleCols(c * per, per).array()).sum();
  }

 private:
  std::int64_t channels() const noexcept { return gain_.features(); }
  tensor_type gain_, grad_;
};
using channel_scale = basic_channel_scale<float>;
// [custom-layer]

// [ops-layer]
#include "layers/ops.hpp"

template <class S>
class basic_swish final : public nerve::layers::basic_op_layer<S> {
  using base = nerve::layers::basic_op_layer<S>;

 public:
  using typename base::array;        // a tensor in the backend's memory
  using typename base::tensor_type;  // the host tensors the parameters live in
  using typename base::parameter_ref;

  explicit basic_swish(double beta)
      : beta_(tensor_type::constant(1, {1}, S(beta))), grad_(tensor_type::zeros(1, {1})) {}
  std::string_view kind() const noexcept override { return "Swish"; }
  std::vector<parameter_ref> parameters() override { return {{"beta", &beta_, &grad_, {1}}}; }

  // x·σ(β·x): `params` come in parameters() order, on whichever backend runs the layer.
  array compute(nerve::layers::basic_ops<S>& o, std::span<const array> in, std::span<const array> params,
                std::vector<array>& /*keep*/, const nerve::layers::forward_context&) override {
    return o.mul(in[0], o.sigmoid(o.mul_row(in[0], params[0])));
  }

 protected:
  nerve::layers::shape infer_shape(std::span<const nerve::layers::shape> inputs) const override { return inputs[0]; }

 private:
  tensor_type beta_, grad_;
};
// [ops-layer]

// [custom-check]
#include "layers/gradcheck.hpp"

bool gradients_are_right() {
  namespace nl = nerve::layers;
  basic_silu<double> act;  // check in double: float differences drown in rounding
  basic_channel_scale<double> scale(3);
  nl::basic_parameter_ref<double> gain = scale.parameters()[0];
  for (std::int64_t c = 0; c < 3; ++c) gain.value->data()[c] = 0.5 + c;  // not the identity
  auto silu_report = nl::check_gradients(act, nl::random_tensor(2, {3, 4, 4}, /*seed=*/1, -4, 4));
  auto scale_report = nl::check_gradients(scale, nl::random_tensor(2, {3, 4, 4}, /*seed=*/2));
  if (!silu_report.passed()) std::fputs(silu_report.to_string().c_str(), stderr);
  if (!scale_report.passed()) std::fputs(scale_report.to_string().c_str(), stderr);
  return silu_report.passed() && scale_report.passed();
}
// [custom-check]

// [custom-network]
#include "layers/conv2d.hpp"
#include "layers/flatten.hpp"
#include "layers/join.hpp"
#include "layers/linear.hpp"
#include "layers/network.hpp"
#include "tests/layers/common.hpp"

namespace nl = nerve::layers;

//   input ─► conv1 ─► act1 ─┬─► conv2 ─► scale2 ─► add1 ─► act2 ─► flatten ─► fc
//                           └──────────────────────────┘   (skip connection)
nl::graph make_residual_net(std::uint64_t seed) {
  nl::graph_builder b;
  b.input("input", {1, 8, 8});
  b.add("conv1", nl::conv2d(1, 4, /*kernel=*/3, /*stride=*/1, /*padding=*/1), {"input"});
  b.add("act1", silu(), {"conv1"});
  b.add("conv2", nl::conv2d(4, 4, 3, 1, 1), {"act1"});
  b.add("scale2", channel_scale(4), {"conv2"});
  b.add("add1", nl::add(), {"scale2", "act1"});
  b.add("act2", silu(), {"add1"});
  b.add("flatten", nl::flatten(), {"act2"});
  b.add("fc", nl::linear(4 * 8 * 8, 10), {"flatten"});
  return b.build(seed);
}

std::vector<double> train_a_few_steps(nl::graph& g, const nl::tensor& images, const nl::targets& labels) {
  nerve::actors::runtime rt({.loops = 2});
  nl::network net(rt, g, std::make_shared<nl::cross_entropy>(),
                  [] { return std::make_unique<nl::sgd>(nl::sgd_options{.lr = 0.1}); }, {.spread = true});
  std::vector<double> losses;
  for (std::uint64_t step = 0; step < 3; ++step)
    losses.push_back(net.train_step(images.clone(), labels.clone(), /*micro_batches=*/2, step).get().loss);
  return losses;
}
// [custom-network]

namespace {

nl::tensor random_small_images(std::int64_t n, std::uint64_t seed) {
  nl::tensor t(n, {1, 8, 8});
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  for (std::int64_t i = 0; i < t.size(); ++i) t.data()[i] = u(rng);
  return t;
}

using nerve::layers::testing::random_labels;

}  // namespace

TEST_SUITE("layers.custom") {
  TEST_CASE("a user's SiLU and channel scale have the gradients the checker expects") {
    CHECK(gradients_are_right());
    basic_channel_scale<double> scale(2);
    auto p = scale.parameters();
    REQUIRE(p.size() == 1);
    CHECK(p[0].name == "weight");
    CHECK(p[0].torch_shape == std::vector<std::int64_t>{2});
  }

  TEST_CASE("a user's layers wire into a residual graph with their own shape errors") {
    auto g = make_residual_net(1);
    CHECK(g.node("act1").layer->kind() == "SiLU");
    CHECK(g.node("scale2").layer->kind() == "ChannelScale");
    CHECK(g.node("add1").output_shape == nl::shape{4, 8, 8});
    CHECK(g.parameters()[4].name == "scale2.weight");

    nl::graph_builder b;
    b.input("input", {3, 8, 8});
    b.add("scale", channel_scale(4), {"input"});
    try {
      b.build();
      FAIL("a channel scale of 4 took 3 channels");
    } catch (const nl::wiring_error& e) {
      CHECK(std::string(e.what()) ==
            "graph: shape mismatch between 'input' and 'scale': 'input' outputs [3, 8, 8] but 'scale (ChannelScale)' "
            "expects [4, …] at input 0 (scale (ChannelScale): input 0 has shape [3, 8, 8], expected [4, …])");
    }
  }

  TEST_CASE("a residual graph of user layers trains through network as the direct executor does") {
    auto g = make_residual_net(1);
    auto reference = make_residual_net(1);
    const auto images = random_small_images(6, 3);
    const auto labels = random_labels(6, 4);

    const auto losses = train_a_few_steps(g, images, labels);

    nl::direct_executor direct(reference);
    nl::cross_entropy loss;
    nl::sgd opt({.lr = 0.1});
    std::vector<double> want;
    for (std::uint64_t step = 0; step < 3; ++step)
      want.push_back(direct.train_step(images.clone(), labels, loss, opt, 2, step).loss);
    CHECK(losses == want);
    CHECK(losses.back() < losses.front());  // the same batch three times: it learns it

    // Bitwise the same weights, and the custom layer's gain moved away from its initial 1.
    auto got = g.parameters();
    auto ref = reference.parameters();
    REQUIRE(got.size() == ref.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      CAPTURE(got[i].name);
      CHECK(std::memcmp(got[i].value->data(), ref[i].value->data(), got[i].value->size() * sizeof(float)) == 0);
    }
    const auto gain = g.layer<channel_scale>("scale2").parameters()[0];
    CHECK(gain.value->data()[0] != 1.0f);
  }

  TEST_CASE("the docs' Swish-β written with ops has the gradients the checker expects and trains in a network") {
    basic_swish<double> swish(0.6);
    const auto report = nl::check_gradients(swish, nl::random_tensor(3, {2, 5}, /*seed=*/4, -3, 3));
    INFO(report.to_string());
    CHECK(report.passed());
    CHECK(report.checked() == 30 + 1);

    nl::graph_builder b;
    b.input("input", {1, 8, 8});
    b.add("flatten", nl::flatten(), {"input"});
    b.add("fc1", nl::linear(64, 16), {"flatten"});
    b.add("act", std::make_unique<basic_swish<float>>(1.0), {"fc1"});
    b.add("fc2", nl::linear(16, 10), {"act"});
    auto g = b.build(3);
    const auto losses = train_a_few_steps(g, random_small_images(6, 5), random_labels(6, 6));
    CHECK(losses.back() < losses.front());
    CHECK(g.parameters()[2].name == "act.beta");
    CHECK(g.parameters()[2].value->data()[0] != 1.0f);  // β learned
  }
}

// Finite-difference checks of every layer's backward, in double precision.
#include <doctest/doctest.h>

#include "layers/activation.hpp"
#include "layers/conv2d.hpp"
#include "layers/dropout.hpp"
#include "layers/flatten.hpp"
#include "layers/init.hpp"
#include "layers/join.hpp"
#include "layers/linear.hpp"
#include "layers/loss.hpp"
#include "layers/norm.hpp"
#include "layers/pool.hpp"
#include "tests/layers/gradcheck.hpp"

using namespace nerve::layers;
using nerve::layers::testing::gradcheck;
using nerve::layers::testing::random_tensor;

namespace {

std::vector<tensor_d> one(tensor_d t) {
  std::vector<tensor_d> v;
  v.push_back(std::move(t));
  return v;
}

template <class L>
void randomise(L& l, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (auto& p : l.parameters()) uniform_fill(*p.value, 1.0, rng);
}

}  // namespace

TEST_SUITE("layers.linear") {
  TEST_CASE("backward matches finite differences") {
    struct c { std::int64_t n, in, out; bool bias; };
    for (auto [n, in, out, bias] : {c{5, 3, 4, true}, c{5, 3, 4, false}, c{2, 7, 1, true}, c{1, 1, 6, false},
                                    c{3, 16, 9, true}}) {
      CAPTURE(n); CAPTURE(in); CAPTURE(out); CAPTURE(bias);
      basic_linear<double> l(in, out, bias);
      std::mt19937_64 rng(n * 100 + in);
      l.reset_parameters(rng);
      CHECK(l.parameters().size() == (bias ? 2u : 1u));
      CHECK(gradcheck(l, one(random_tensor(n, {in}, 7))) > 0);
    }
  }
}

TEST_SUITE("layers.activation") {
  TEST_CASE("backward matches finite differences") {
    for (auto s : {shape{6}, shape{2, 3, 3}}) {
      CAPTURE(s.to_string());
      basic_relu<double> relu;
      basic_leaky_relu<double> leaky(activation_ops::leaky_relu{0.2});
      basic_sigmoid<double> sig;
      basic_tanh<double> th;
      basic_gelu<double> gelu;
      for (basic_layer<double>* l : std::initializer_list<basic_layer<double>*>{&relu, &leaky, &sig, &th, &gelu}) {
        CAPTURE(l->kind());
        gradcheck(*l, one(random_tensor(4, s, 11, -3, 3)));
      }
    }
  }
  TEST_CASE("GELU is the exact erf form") {
    basic_gelu<double> g;
    auto t = tensor_d::constant(1, {1}, 1.0);
    // PyTorch: torch.nn.functional.gelu(torch.tensor(1.0, dtype=torch.float64)) = 0.8413447460685429
    CHECK(g.forward(std::move(t)).output.data()[0] == doctest::Approx(0.8413447460685429).epsilon(1e-15));
  }
}

TEST_SUITE("layers.conv2d") {
  TEST_CASE("backward matches finite differences") {
    struct c { std::int64_t n, cin, h, w, cout, kh, kw, s, p; bool bias; };
    for (auto k : {c{2, 1, 5, 5, 2, 3, 3, 1, 0, true}, c{2, 2, 5, 4, 3, 3, 3, 2, 1, false},
                   c{1, 3, 4, 6, 2, 2, 3, 1, 1, true}, c{3, 2, 3, 3, 1, 1, 1, 1, 0, true}}) {
      CAPTURE(k.cin); CAPTURE(k.kh); CAPTURE(k.s); CAPTURE(k.p); CAPTURE(k.bias);
      basic_conv2d<double> conv(conv2d_options{k.cin, k.cout, {k.kh, k.kw}, {k.s, k.s}, {k.p, k.p}, k.bias});
      std::mt19937_64 rng(k.h * 10 + k.w);
      conv.reset_parameters(rng);
      gradcheck(conv, one(random_tensor(k.n, {k.cin, k.h, k.w}, 13)));
    }
  }
}

TEST_SUITE("layers.pool") {
  TEST_CASE("max pooling backward matches finite differences") {
    basic_max_pool2d<double> a(2), b(3, 2, 1);
    gradcheck(a, one(random_tensor(2, {2, 4, 6}, 17)));
    gradcheck(b, one(random_tensor(2, {1, 5, 5}, 19)));
  }
  TEST_CASE("average pooling backward matches finite differences") {
    basic_avg_pool2d<double> a(2), b(3, 2, 1);
    gradcheck(a, one(random_tensor(2, {2, 4, 6}, 23)));
    gradcheck(b, one(random_tensor(2, {1, 5, 5}, 29)));
  }
  TEST_CASE("average pooling divides by the window clipped to the padded image") {
    // PyTorch: F.avg_pool2d(torch.ones(1,1,3,3), 3, 2, 1) == [[4/9, 4/9], [4/9, 4/9]] (count_include_pad)
    basic_avg_pool2d<double> p(3, 2, 1);
    auto y = p.forward(tensor_d::constant(1, {1, 3, 3}, 1.0)).output;
    CHECK(y.sample_shape() == shape{1, 2, 2});
    for (int i = 0; i < 4; ++i) CHECK(y.data()[i] == doctest::Approx(4.0 / 9.0));
  }
}

TEST_SUITE("layers.flatten") {
  TEST_CASE("backward matches finite differences and reshapes back") {
    basic_flatten<double> f;
    gradcheck(f, one(random_tensor(3, {2, 3, 2}, 31)));
  }
}

TEST_SUITE("layers.dropout") {
  TEST_CASE("backward matches finite differences with a fixed mask") {
    basic_dropout<double> d(0.3, 42);
    gradcheck(d, one(random_tensor(4, {10}, 37)));
  }
  TEST_CASE("the mask is a function of seed, step and micro-batch") {
    basic_dropout<float> d(0.5, 7);
    auto ones = [] { return tensor::constant(8, {64}, 1.0f); };
    auto a = d.forward(ones(), {1, 2}).output;
    auto b = d.forward(ones(), {1, 2}).output;
    auto c = d.forward(ones(), {2, 2}).output;
    CHECK(a.matrix() == b.matrix());
    CHECK(a.matrix() != c.matrix());
    const auto kept = (a.matrix().array() != 0.0f).count();
    CHECK(kept > 200);
    CHECK(kept < 312);
    CHECK(a.matrix().maxCoeff() == 2.0f);
    d.set_training(false);
    auto e = d.forward(ones(), {1, 2}).output;
    CHECK(e.matrix() == ones().matrix());
  }
}

TEST_SUITE("layers.layer_norm") {
  TEST_CASE("backward matches finite differences") {
    for (bool affine : {true, false})
      for (auto s : {shape{6}, shape{2, 3}}) {
        CAPTURE(affine); CAPTURE(s.to_string());
        basic_layer_norm<double> ln(s, 1e-5, affine);
        randomise(ln, 41);
        gradcheck(ln, one(random_tensor(3, s, 43)));
      }
  }
}

TEST_SUITE("layers.batch_norm") {
  TEST_CASE("backward matches finite differences in training") {
    for (bool affine : {true, false})
      for (auto s : {shape{4}, shape{3, 2, 2}}) {
        CAPTURE(affine); CAPTURE(s.to_string());
        basic_batch_norm<double> bn(s[0], 1e-5, 0.1, affine);
        randomise(bn, 47);
        bn.running_mean().matrix().setConstant(0.1);
        bn.running_var().matrix().setConstant(0.7);
        gradcheck(bn, one(random_tensor(5, s, 53)));
      }
  }
  TEST_CASE("evaluation normalises with the running statistics and, like every op layer, keeps nothing") {
    basic_batch_norm<double> bn(2, 1e-5, 0.1, true);
    bn.weight().data()[0] = 2, bn.weight().data()[1] = -1;
    bn.bias().data()[0] = 0.5, bn.bias().data()[1] = 0;
    bn.running_mean().data()[0] = 1, bn.running_mean().data()[1] = -2;
    bn.running_var().data()[0] = 4, bn.running_var().data()[1] = 0.25;
    bn.set_training(false);
    auto x = random_tensor(3, {2, 2}, 59);
    auto r = bn.forward(x.clone());
    for (std::int64_t n = 0; n < 3; ++n)
      for (std::int64_t i = 0; i < 2; ++i) {
        CHECK(r.output.row(n)[i] == doctest::Approx((x.row(n)[i] - 1) / std::sqrt(4 + 1e-5) * 2 + 0.5).epsilon(1e-14));
        CHECK(r.output.row(n)[2 + i] == doctest::Approx(-(x.row(n)[2 + i] + 2) / std::sqrt(0.25 + 1e-5)).epsilon(1e-14));
      }
    CHECK(bn.running_mean().data()[0] == 1);  // not updated
    CHECK(bn.batches_tracked() == 0);
    CHECK_THROWS_WITH_AS(bn.backward(std::move(r.stash), tensor_d::zeros(3, {2, 2})),
                         "BatchNorm: backward without its forward's stash", std::logic_error);
  }
  TEST_CASE("running statistics follow PyTorch (momentum 0.1, unbiased variance)") {
    basic_batch_norm<double> bn(1);
    tensor_d x(4, {1});
    double v[] = {1, 2, 3, 6};
    for (int i = 0; i < 4; ++i) x.data()[i] = v[i];
    bn.forward(std::move(x));
    // mean 3, biased var 3.5, unbiased 14/3
    CHECK(bn.running_mean().data()[0] == doctest::Approx(0.3));
    CHECK(bn.running_var().data()[0] == doctest::Approx(0.9 + 0.1 * 14.0 / 3.0));
    CHECK(bn.batches_tracked() == 1);
    CHECK_THROWS_AS(bn.forward(tensor_d::zeros(1, {1})), std::invalid_argument);
  }
}

TEST_SUITE("layers.join") {
  TEST_CASE("add backward matches finite differences for two and three inputs") {
    basic_add<double> a;
    std::vector<tensor_d> two;
    two.push_back(random_tensor(3, {4}, 59));
    two.push_back(random_tensor(3, {4}, 61));
    gradcheck(a, two);
    std::vector<tensor_d> three;
    for (int i = 0; i < 3; ++i) three.push_back(random_tensor(2, {2, 2, 2}, 67 + i));
    gradcheck(a, three);
  }
  TEST_CASE("concat backward matches finite differences") {
    basic_concat<double> c;
    std::vector<tensor_d> v;
    v.push_back(random_tensor(3, {3}, 71));
    v.push_back(random_tensor(3, {5}, 73));
    gradcheck(c, v);
    std::vector<tensor_d> img;
    img.push_back(random_tensor(2, {2, 2, 3}, 79));
    img.push_back(random_tensor(2, {1, 2, 3}, 83));
    basic_concat<double> c2;
    CHECK(c2.output_shape(std::vector<shape>{{2, 2, 3}, {1, 2, 3}}) == shape{3, 2, 3});
    gradcheck(c2, img);
  }
}

TEST_SUITE("layers.loss") {
  TEST_CASE("cross-entropy gradient matches finite differences") {
    basic_cross_entropy<double> ce;
    auto logits = random_tensor(4, {5}, 89, -4, 4);
    basic_targets<double> t;
    t.labels = {0, 3, 4, 1};
    auto r = ce.forward(logits, t);
    const double scale = 0.25;
    auto g = ce.backward(r.stash, scale);
    for (std::int64_t i = 0; i < logits.size(); ++i) {
      const double v = logits.data()[i], h = 1e-6;
      logits.data()[i] = v + h;
      const double lp = ce.forward(logits, t).loss;
      logits.data()[i] = v - h;
      const double lm = ce.forward(logits, t).loss;
      logits.data()[i] = v;
      CHECK(g.data()[i] == doctest::Approx(scale * (lp - lm) / (2 * h)).epsilon(1e-7));
    }
  }
  TEST_CASE("cross-entropy is stable for huge logits and counts correct predictions") {
    basic_cross_entropy<float> ce;
    tensor logits(2, {3});
    float v[] = {1000.f, 0.f, -1000.f, 0.f, 0.f, 2000.f};
    std::copy(v, v + 6, logits.data());
    targets t;
    t.labels = {0, 0};
    auto r = ce.forward(logits, t);
    CHECK(std::isfinite(r.loss));
    CHECK(r.loss == doctest::Approx(1000.0));  // (0 + 2000) / 2
    CHECK(r.correct == 1);
    t.labels = {0, 3};
    CHECK_THROWS_AS(ce.forward(logits, t), std::invalid_argument);
  }
  TEST_CASE("MSE gradient matches finite differences") {
    basic_mse<double> mse;
    auto y = random_tensor(3, {4}, 97);
    basic_targets<double> t;
    t.values = random_tensor(3, {4}, 101);
    auto g = mse.backward(mse.forward(y, t).stash);
    for (std::int64_t i = 0; i < y.size(); ++i) {
      const double v = y.data()[i], h = 1e-6;
      y.data()[i] = v + h;
      const double lp = mse.forward(y, t).loss;
      y.data()[i] = v - h;
      const double lm = mse.forward(y, t).loss;
      y.data()[i] = v;
      CHECK(g.data()[i] == doctest::Approx((lp - lm) / (2 * h)).epsilon(1e-7));
    }
  }
}

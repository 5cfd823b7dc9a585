// Layers written with ops (layers/ops.hpp): each op's derivative against central
// differences in double, an op layer's backward left to the tape against the same
// layer with a hand-written backward (bitwise, in float), and through the gradient
// checker and a training network.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <random>

#include "layers/ops.hpp"
#include "layers/linear.hpp"
#include "layers/norm.hpp"
#include "tests/layers/gradcheck.hpp"
#include "tests/layers/op_layers.hpp"

namespace nerve::layers {
namespace {

using arr = basic_array<double>;
using fn = std::function<arr(basic_ops<double>&, std::vector<arr>&)>;

arr random_array(basic_op_set<double>& set, std::vector<std::int64_t> dims, std::mt19937_64& rng) {
  auto a = set.alloc(std::move(dims));
  std::normal_distribution<double> d;
  for (std::int64_t i = 0; i < a.size(); ++i) a.data[i] = d(rng);
  return a;
}

/// Σ r ⊙ f(leaves): the tape's gradient of every leaf against central differences.
/// Returns the number of scalars checked.
std::size_t check_tape(const std::vector<std::vector<std::int64_t>>& shapes, const fn& f, double tol = 1e-7) {
  auto& set = cpu_op_set<double>();
  std::mt19937_64 rng(7);
  std::vector<arr> leaves;
  for (const auto& s : shapes) leaves.push_back(random_array(set, s, rng));
  basic_tape<double> tape(set);
  for (auto& l : leaves) l.id = tape.leaf();
  basic_ops<double> o(set, &tape);
  const arr y = f(o, leaves);
  const arr r = random_array(set, y.dims, rng);
  tape.backward(y.id, r);
  auto value = [&] {
    basic_ops<double> plain(set);
    std::vector<arr> ls = leaves;
    for (auto& l : ls) l.id = -1;
    const arr v = f(plain, ls);
    double s = 0;
    for (std::int64_t i = 0; i < v.size(); ++i) s += r.data[i] * v.data[i];
    return s;
  };
  std::size_t checked = 0;
  for (auto& l : leaves) {
    const arr& g = tape.grad(l.id);
    REQUIRE_FALSE(g.empty());
    REQUIRE(g.size() == l.size());
    for (std::int64_t i = 0; i < l.size(); ++i) {
      const double keep = l.data[i], h = 1e-6;
      l.data[i] = keep + h;
      const double up = value();
      l.data[i] = keep - h;
      const double down = value();
      l.data[i] = keep;
      const double numeric = (up - down) / (2 * h);
      INFO("leaf element " << i << ": tape " << g.data[i] << ", numeric " << numeric);
      CHECK(testing::close(g.data[i], numeric, tol));
      ++checked;
    }
  }
  return checked;
}

TEST_CASE("each op's derivative on the tape matches central differences") {
  SUBCASE("matmul with every transposition") {
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb) {
        CAPTURE(ta);
        CAPTURE(tb);
        const std::vector<std::int64_t> a = ta ? std::vector<std::int64_t>{4, 3} : std::vector<std::int64_t>{3, 4};
        const std::vector<std::int64_t> b = tb ? std::vector<std::int64_t>{5, 4} : std::vector<std::int64_t>{4, 5};
        CHECK(check_tape({a, b}, [&](auto& o, auto& l) {
                return o.matmul(l[0], l[1], ta ? trans::yes : trans::no, tb ? trans::yes : trans::no);
              }) == 12 + 20);
      }
  }
  SUBCASE("pointwise functions of one and two inputs") {
    for (auto f : {unary_fn::relu, unary_fn::leaky_relu, unary_fn::sigmoid, unary_fn::tanh, unary_fn::gelu}) {
      CAPTURE(to_string(f));
      CHECK(check_tape({{3, 4}}, [&](auto& o, auto& l) { return o.unary(f, l[0], 0.1); }) == 12);
    }
    CHECK(check_tape({{2, 3}, {2, 3}}, [](auto& o, auto& l) { return o.mul(l[0], l[1]); }) == 12);
    CHECK(check_tape({{2, 3}, {2, 3}}, [](auto& o, auto& l) { return o.sub(l[0], l[1]); }) == 12);
    CHECK(check_tape({{2, 3}}, [](auto& o, auto& l) { return o.scale(l[0], -2.5); }) == 6);
  }
  SUBCASE("row vectors and scalars broadcast over the rows, and column sums") {
    CHECK(check_tape({{4, 3}, {3}}, [](auto& o, auto& l) { return o.add_row(l[0], l[1]); }) == 15);
    CHECK(check_tape({{4, 3}, {3}}, [](auto& o, auto& l) { return o.mul_row(l[0], l[1]); }) == 15);
    CHECK(check_tape({{4, 3}, {1}}, [](auto& o, auto& l) { return o.mul_row(l[0], l[1]); }) == 13);
    CHECK(check_tape({{4, 3}}, [](auto& o, auto& l) { return o.sum_rows(l[0]); }) == 12);
  }
  SUBCASE("the fused linear, convolution and pooling") {
    CHECK(check_tape({{4, 3}, {2, 3}, {2}}, [](auto& o, auto& l) { return o.linear(l[0], l[1], l[2]); }) == 20);
    for (std::int64_t stride : {1, 2}) {
      CAPTURE(stride);
      CHECK(check_tape({{2, 2, 5, 5}, {3, 2, 3, 3}, {3}}, [&](auto& o, auto& l) {
              return o.conv2d(l[0], l[1], l[2], {stride, stride}, {stride - 1, stride - 1});
            }) == 100 + 54 + 3);
    }
    CHECK(check_tape({{2, 2, 4, 5}, {3, 2, 2, 3}}, [](auto& o, auto& l) {
            return o.conv2d(l[0], l[1], arr{}, {1, 2}, {1, 0});
          }) == 80 + 36);
    CHECK(check_tape({{2, 2, 4, 4}}, [](auto& o, auto& l) { return o.pool2d(pool_fn::max, l[0], 2, 2, 0); }) == 64);
    CHECK(check_tape({{2, 2, 5, 5}}, [](auto& o, auto& l) { return o.pool2d(pool_fn::max, l[0], 3, 1, 1); }) == 100);
    CHECK(check_tape({{2, 2, 5, 5}}, [](auto& o, auto& l) { return o.pool2d(pool_fn::average, l[0], 3, 2, 1); }) ==
          100);
  }
  SUBCASE("concatenation of columns") {
    CHECK(check_tape({{3, 2}, {3, 4}, {3, 1}}, [](auto& o, auto& l) {
            return o.concat_cols(std::span<const arr>(l.data(), 3), {3, 7});
          }) == 21);
  }
  SUBCASE("an input used twice gets the sum of both gradients") {
    // x + x·x: add passes dy through to x, mul adds 2 more terms; the borrowed dy is
    // copied before anything is added to it (the caller's gradient stays as it was).
    CHECK(check_tape({{3, 2}}, [](auto& o, auto& l) { return o.add(l[0], o.mul(l[0], l[0])); }) == 6);
    CHECK(check_tape({{3, 2}, {2}}, [](auto& o, auto& l) {
            auto y = o.add_row(l[0], l[1]);
            return o.add(o.reshape(y, {6}), o.reshape(l[0], {6}));
          }) == 8);
  }
}

TEST_CASE("the caller's output gradient is never written by the tape") {
  auto& set = cpu_op_set<double>();
  std::mt19937_64 rng(3);
  auto x = random_array(set, {2, 2}, rng);
  basic_tape<double> tape(set);
  x.id = tape.leaf();
  basic_ops<double> o(set, &tape);
  const auto y = o.add(x, x);  // both gradients are dy itself
  auto dy = random_array(set, {2, 2}, rng);
  const std::vector<double> before(dy.data, dy.data + 4);
  tape.backward(y.id, dy);
  for (int i = 0; i < 4; ++i) {
    CHECK(dy.data[i] == before[std::size_t(i)]);
    CHECK(tape.grad(x.id).data[i] == 2 * before[std::size_t(i)]);
  }
  CHECK_THROWS_WITH_AS(tape.backward(y.id, dy), "tape: backward ran twice", std::logic_error);
}

TEST_CASE("ops refuse shapes that do not fit, naming both") {
  auto& set = cpu_op_set<float>();
  basic_ops<float> o(set);
  auto a = o.zeros({2, 3}), b = o.zeros({4, 5}), v = o.zeros({2});
  CHECK_THROWS_WITH_AS(o.matmul(a, b), "ops: matmul of [2, 3] and [4, 5]: inner dimensions 3 and 4",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(o.add(a, b), "ops: add of [2, 3] and [4, 5]", std::invalid_argument);
  CHECK_THROWS_WITH_AS(o.add_row(a, v), "ops: a row vector of [2] over [2, 3] (it needs 3 elements or 1)",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(o.reshape(a, {5}), "ops: reshape of [2, 3] to [5]", std::invalid_argument);
  auto x = o.zeros({2, 3, 8, 8}), w = o.zeros({4, 2, 3, 3}), bias = o.zeros({4});
  CHECK_THROWS_WITH_AS(o.conv2d(x, w, bias, {1, 1}, {0, 0}),
                       "ops: conv2d of [2, 3, 8, 8] with a filter of [4, 2, 3, 3] and a bias of [4] (it needs "
                       "[N, C, H, W], [K, C, kh, kw] and [K] or none)",
                       std::invalid_argument);
  auto small = o.zeros({1, 1, 3, 3});
  CHECK_THROWS_WITH_AS(o.pool2d(pool_fn::max, small, 5, 1, 0),
                       "ops: a 5×5 window over images of [1, 1, 3, 3] with padding 0×0", std::invalid_argument);
}

TEST_CASE("an op layer passes the gradient check, with its backward from the tape or by hand") {
  testing::basic_swish<double> tape_swish(0.7, false), hand_swish(0.7, true);
  testing::basic_op_linear<double> lin(5, 3);
  std::mt19937_64 rng(11);
  lin.reset_parameters(rng);
  auto one = [] {
    std::vector<tensor_d> v;
    v.push_back(random_tensor(4, {5}, 12, -3, 3));
    return v;
  };
  CHECK(testing::gradcheck(tape_swish, one()) == 20 + 1);
  CHECK(testing::gradcheck(hand_swish, one()) == 20 + 1);
  CHECK(testing::gradcheck(lin, one()) == 20 + 15 + 3);
}

TEST_CASE("the tape's backward equals a hand-written one doing the same arithmetic, bit for bit") {
  testing::swish tape_swish(0.7f, false), hand_swish(0.7f, true);
  for (int mb = 0; mb < 3; ++mb) {
    CAPTURE(mb);
    const auto x = random_tensor(8, {6}, 20 + mb, -3, 3).cast<float>();
    const auto dy = random_tensor(8, {6}, 30 + mb).cast<float>();
    auto a = tape_swish.forward(x.clone());
    auto b = hand_swish.forward(x.clone());
    REQUIRE(a.output.size() == b.output.size());
    CHECK(std::equal(a.output.data(), a.output.data() + a.output.size(), b.output.data()));
    const auto ga = tape_swish.backward(std::move(a.stash), dy);
    const auto gb = hand_swish.backward(std::move(b.stash), dy);
    CHECK(std::equal(ga[0].data(), ga[0].data() + ga[0].size(), gb[0].data()));
    CHECK(tape_swish.beta_grad() == hand_swish.beta_grad());
  }
  CHECK(tape_swish.beta_grad() != 0.0f);
}

TEST_CASE("an op layer in evaluation keeps nothing and refuses backward") {
  testing::swish s(1.0f, false);
  s.set_training(false);
  auto r = s.forward(random_tensor(2, {3}, 1).cast<float>());
  CHECK(r.stash.extra == nullptr);
  CHECK(r.stash.payload_bytes() == 0);
  CHECK_THROWS_WITH_AS(s.backward(std::move(r.stash), tensor::zeros(2, {3})),
                       "Swish: backward without its forward's stash", std::logic_error);
}

TEST_CASE("an op linear equals the built-in Linear within rounding") {
  testing::op_linear mine(7, 4);
  linear theirs(7, 4);
  std::mt19937_64 rng(2);
  theirs.reset_parameters(rng);
  mine.weight() = theirs.parameters()[0].value->clone();
  mine.bias() = theirs.parameters()[1].value->clone();
  const auto x = random_tensor(5, {7}, 3).cast<float>();
  const auto dy = random_tensor(5, {4}, 4).cast<float>();
  auto a = mine.forward(x.clone());
  auto b = theirs.forward(x.clone());
  for (std::int64_t i = 0; i < a.output.size(); ++i) CHECK(a.output.data()[i] == doctest::Approx(b.output.data()[i]));
  const auto ga = mine.backward(std::move(a.stash), dy);
  const auto gb = theirs.backward(std::move(b.stash), dy);
  for (std::int64_t i = 0; i < ga[0].size(); ++i) CHECK(ga[0].data()[i] == doctest::Approx(gb[0].data()[i]));
  auto pm = mine.parameters(), pt = theirs.parameters();
  for (std::size_t p = 0; p < 2; ++p)
    for (std::int64_t i = 0; i < pm[p].grad->size(); ++i)
      CHECK(pm[p].grad->data()[i] == doctest::Approx(pt[p].grad->data()[i]));
}

TEST_CASE("the per-channel ops of the norms work over [outer, channels, inner], backward against differences") {
  auto& set = cpu_op_set<double>();
  std::mt19937_64 rng(11);
  const norm_geometry g{3, 2, 4};  // channel c of row o: elements (o·2 + c)·4 … +3
  auto x = random_array(set, {3, 8}, rng);
  auto at = [&](const arr& a, std::int64_t o, std::int64_t c, std::int64_t i) { return a.data[(o * 2 + c) * 4 + i]; };

  // Batch statistics: a channel's 12 values, mean and biased variance, then x̂.
  auto mean = set.alloc({2}), var = set.alloc({2}), rstd = set.alloc({2}), xhat = set.alloc({3, 8});
  set.normalize(g, x.data, true, mean.data, var.data, 1e-5, xhat.data, rstd.data);
  for (std::int64_t c = 0; c < 2; ++c) {
    double m = 0, v = 0;
    for (std::int64_t o = 0; o < 3; ++o)
      for (std::int64_t i = 0; i < 4; ++i) m += at(x, o, c, i) / 12;
    for (std::int64_t o = 0; o < 3; ++o)
      for (std::int64_t i = 0; i < 4; ++i) v += (at(x, o, c, i) - m) * (at(x, o, c, i) - m) / 12;
    CHECK(mean.data[c] == doctest::Approx(m).epsilon(1e-14));
    CHECK(var.data[c] == doctest::Approx(v).epsilon(1e-14));
    CHECK(rstd.data[c] == doctest::Approx(1 / std::sqrt(v + 1e-5)).epsilon(1e-14));
    for (std::int64_t o = 0; o < 3; ++o)
      for (std::int64_t i = 0; i < 4; ++i)
        CHECK(at(xhat, o, c, i) == doctest::Approx((at(x, o, c, i) - m) / std::sqrt(v + 1e-5)).epsilon(1e-13));
  }

  // Given statistics (evaluation): read, not written.
  double given_mean[2] = {0.5, -1}, given_var[2] = {4, 0.25};
  set.normalize(g, x.data, false, given_mean, given_var, 0.0, xhat.data, rstd.data);
  CHECK(given_mean[0] == 0.5);
  CHECK(given_var[1] == 0.25);
  CHECK(rstd.data[0] == 0.5);
  CHECK(rstd.data[1] == 2);
  CHECK(at(xhat, 2, 1, 3) == doctest::Approx((at(x, 2, 1, 3) + 1) * 2).epsilon(1e-15));

  // normalize_grad: the gradient of Σ r·x̂(x) with batch statistics, against central differences.
  auto r = random_array(set, {3, 8}, rng), dx = set.alloc({3, 8});
  set.normalize(g, x.data, true, mean.data, var.data, 1e-5, xhat.data, rstd.data);
  set.normalize_grad(g, xhat.data, rstd.data, r.data, dx.data);
  auto value = [&] {
    auto m2 = set.alloc({2}), v2 = set.alloc({2}), s2 = set.alloc({2}), h = set.alloc({3, 8});
    set.normalize(g, x.data, true, m2.data, v2.data, 1e-5, h.data, s2.data);
    double sum = 0;
    for (std::int64_t i = 0; i < 24; ++i) sum += r.data[i] * h.data[i];
    return sum;
  };
  for (std::int64_t i = 0; i < 24; ++i) {
    const double keep = x.data[i], h = 1e-6;
    x.data[i] = keep + h;
    const double up = value();
    x.data[i] = keep - h;
    const double down = value();
    x.data[i] = keep;
    CHECK(testing::close(dx.data[i], (up - down) / (2 * h), 1e-7));
  }

  // channel_affine and channel_sums: y = x·scale[c] + shift[c]; out[c] += Σ x·z.
  double scale[2] = {2, -3}, shift[2] = {1, 0.5};
  auto y = set.alloc({3, 8});
  set.channel_affine(g, x.data, scale, shift, y.data);
  CHECK(at(y, 1, 0, 2) == at(x, 1, 0, 2) * 2 + 1);
  CHECK(at(y, 2, 1, 0) == at(x, 2, 1, 0) * -3 + 0.5);
  set.channel_affine(g, x.data, scale, nullptr, y.data);
  CHECK(at(y, 0, 1, 1) == at(x, 0, 1, 1) * -3);
  double sums[2] = {10, 20}, dots[2] = {0, 0};
  set.channel_sums(g, x.data, nullptr, sums);
  set.channel_sums(g, x.data, r.data, dots);
  for (std::int64_t c = 0; c < 2; ++c) {
    double s = 0, d = 0;
    for (std::int64_t o = 0; o < 3; ++o)
      for (std::int64_t i = 0; i < 4; ++i) {
        s += at(x, o, c, i);
        d += at(x, o, c, i) * at(r, o, c, i);
      }
    CHECK(sums[c] == doctest::Approx(s + (c ? 20 : 10)).epsilon(1e-14));
    CHECK(dots[c] == doctest::Approx(d).epsilon(1e-14));
  }
}

TEST_CASE("BatchNorm refuses a training batch with one value per channel, naming the layer and the input") {
  basic_batch_norm<float> bn(3);
  bn.set_name("bn");
  CHECK_THROWS_WITH_AS(bn.forward(tensor::zeros(1, {3})),
                       "bn (BatchNorm): expected more than 1 value per channel when training, got input [1, 3]",
                       std::invalid_argument);
}

}  // namespace
}  // namespace nerve::layers

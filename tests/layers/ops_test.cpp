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

// ---- attention's ops against plain loops ----------------------------------------------

/// The row softmax as written in the docs, in long double: the reference.
std::vector<double> plain_softmax(const arr& x, std::int64_t rows, std::int64_t cols, const causal_mask& mask) {
  std::vector<double> y(std::size_t(rows * cols), 0.0);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t last = mask.on ? std::min(cols - 1, r % mask.block_rows + mask.offset) : cols - 1;
    if (last < 0) continue;
    long double top = x.data[r * cols], sum = 0;
    for (std::int64_t c = 0; c <= last; ++c) top = std::max<long double>(top, x.data[r * cols + c]);
    for (std::int64_t c = 0; c <= last; ++c) sum += std::exp(x.data[r * cols + c] - top);
    for (std::int64_t c = 0; c <= last; ++c)
      y[std::size_t(r * cols + c)] = double(std::exp(x.data[r * cols + c] - top) / sum);
  }
  return y;
}

TEST_CASE("the strided batched product is each entry's product, with every transposition and a shared operand") {
  auto& set = cpu_op_set<double>();
  std::mt19937_64 rng(41);
  const std::int64_t batch = 3, m = 4, n = 5, k = 3;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (std::int64_t share_b : {0, 1}) {
        CAPTURE(ta);
        CAPTURE(tb);
        CAPTURE(share_b);
        // Leading dimensions one wider than the matrices, so a stride is not a shape.
        const std::int64_t lda = (ta ? m : k) + 1, ldb = (tb ? k : n) + 1, ldc = n + 1;
        const std::int64_t sa = (ta ? k : m) * lda, sb = share_b ? 0 : (tb ? n : k) * ldb, sc = m * ldc;
        auto a = random_array(set, {batch * sa}, rng), b = random_array(set, {batch * (tb ? n : k) * ldb}, rng);
        auto c = random_array(set, {batch * sc}, rng);
        std::vector<double> want(c.data, c.data + c.size());
        for (std::int64_t i = 0; i < batch; ++i)
          for (std::int64_t r = 0; r < m; ++r)
            for (std::int64_t col = 0; col < n; ++col) {
              double acc = 0;
              for (std::int64_t p = 0; p < k; ++p)
                acc += (ta ? a.data[i * sa + p * lda + r] : a.data[i * sa + r * lda + p]) *
                       (tb ? b.data[i * sb + col * ldb + p] : b.data[i * sb + p * ldb + col]);
              auto& w = want[std::size_t(i * sc + r * ldc + col)];
              w = 0.5 * acc - 2 * w;
            }
        set.gemm_batched(ta ? trans::yes : trans::no, tb ? trans::yes : trans::no, m, n, k, 0.5, a.data, lda,
                         sa, b.data, ldb, sb, -2, c.data, ldc, sc, batch);
        for (std::int64_t i = 0; i < c.size(); ++i)
          CHECK(c.data[i] == doctest::Approx(want[std::size_t(i)]).epsilon(1e-13));
      }
}

TEST_CASE("the row softmax is the plain formula's, with and without a causal mask, and its rows add to one") {
  auto& set = cpu_op_set<double>();
  std::mt19937_64 rng(43);
  const std::int64_t blocks = 2, t = 5, cols = 7;  // [2, 5, 7]: offset 2 makes T' = T + 2 meaningful
  auto x = random_array(set, {blocks, t, cols}, rng);
  for (std::int64_t i = 0; i < x.size(); ++i) x.data[i] *= 30;  // exp would overflow without the shift
  for (const causal_mask mask : {causal_mask{}, causal_mask{true, t, 0}, causal_mask{true, t, 2}}) {
    CAPTURE(mask.on);
    CAPTURE(mask.offset);
    auto y = set.alloc(x.dims);
    set.softmax_rows(x.data, y.data, blocks * t, cols, mask);
    const auto want = plain_softmax(x, blocks * t, cols, mask);
    for (std::int64_t r = 0; r < blocks * t; ++r) {
      double sum = 0;
      for (std::int64_t c = 0; c < cols; ++c) {
        const double v = y.data[r * cols + c];
        CHECK(v == doctest::Approx(want[std::size_t(r * cols + c)]).epsilon(1e-13));
        if (mask.on && c > r % t + mask.offset) CHECK(v == 0.0);
        sum += v;
      }
      CHECK(sum == doctest::Approx(1.0).epsilon(1e-13));
    }
  }
}

TEST_CASE("a softmax row with every column masked is zeros and its gradient zeros, never NaN, at any length") {
  for (std::int64_t cols = 1; cols <= 40; ++cols) {
    CAPTURE(cols);
    // Offset −1: row 0 of each block sees nothing, row i sees columns < i.
    const std::int64_t rows = cols;
    const causal_mask mask{true, rows, -1};
    std::vector<float> x(std::size_t(rows * cols)), y(x.size()), dy(x.size()), dx(x.size());
    std::mt19937_64 rng{std::uint64_t(cols)};
    std::normal_distribution<float> d(0.0f, 50.0f);
    for (auto& v : x) v = d(rng);
    for (auto& v : dy) v = d(rng);
    auto& set = cpu_op_set<float>();
    set.softmax_rows(x.data(), y.data(), rows, cols, mask);
    set.softmax_rows_grad(y.data(), dy.data(), dx.data(), rows, cols);
    for (std::int64_t c = 0; c < cols; ++c) {
      CHECK(y[std::size_t(c)] == 0.0f);
      CHECK(dx[std::size_t(c)] == 0.0f);
    }
    for (std::size_t i = 0; i < x.size(); ++i) {
      CHECK(std::isfinite(y[i]));
      CHECK(std::isfinite(dx[i]));
    }
  }
}

TEST_CASE("split_heads and merge_heads move every element where the layout says, and undo each other") {
  auto& set = cpu_op_set<double>();
  const head_geometry g{2, 3, 3, 2, 4};  // [B, T, parts, H, D]
  auto x = set.alloc({g.batch, g.tokens, g.parts * g.heads * g.head_dim});
  for (std::int64_t i = 0; i < x.size(); ++i) x.data[i] = double(i);
  auto y = set.alloc({g.parts, g.batch, g.heads, g.tokens, g.head_dim}), back = set.alloc(x.dims);
  set.split_heads(g, x.data, y.data);
  for (std::int64_t p = 0; p < g.parts; ++p)
    for (std::int64_t b = 0; b < g.batch; ++b)
      for (std::int64_t h = 0; h < g.heads; ++h)
        for (std::int64_t t = 0; t < g.tokens; ++t)
          for (std::int64_t d = 0; d < g.head_dim; ++d) {
            const auto to = (((p * g.batch + b) * g.heads + h) * g.tokens + t) * g.head_dim + d;
            const auto from = (((b * g.tokens + t) * g.parts + p) * g.heads + h) * g.head_dim + d;
            CHECK(y.data[to] == x.data[from]);
          }
  set.merge_heads(g, y.data, back.data);
  for (std::int64_t i = 0; i < x.size(); ++i) CHECK(back.data[i] == x.data[i]);
}

TEST_CASE("attention's ops on the tape match central differences") {
  SUBCASE("batched products with every transposition and a scale") {
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb) {
        CAPTURE(ta);
        CAPTURE(tb);
        const std::vector<std::int64_t> a = ta ? std::vector<std::int64_t>{2, 3, 4, 3}
                                               : std::vector<std::int64_t>{2, 3, 3, 4};
        const std::vector<std::int64_t> b = tb ? std::vector<std::int64_t>{2, 3, 5, 4}
                                               : std::vector<std::int64_t>{2, 3, 4, 5};
        CHECK(check_tape({a, b}, [&](auto& o, auto& l) {
                return o.batched_matmul(l[0], l[1], ta ? trans::yes : trans::no, tb ? trans::yes : trans::no, 0.7);
              }) == 72 + 120);
      }
  }
  SUBCASE("the softmax, causal or not") {
    CHECK(check_tape({{2, 4, 4}}, [](auto& o, auto& l) { return o.softmax(l[0]); }) == 32);
    CHECK(check_tape({{2, 4, 4}}, [](auto& o, auto& l) { return o.softmax(l[0], true); }) == 32);
    CHECK(check_tape({{3, 6}}, [](auto& o, auto& l) { return o.softmax(l[0], true, 2); }) == 18);
  }
  SUBCASE("the head permutations and the parts of an array") {
    CHECK(check_tape({{2, 3, 12}}, [](auto& o, auto& l) { return o.split_heads(l[0], 2, 3); }) == 72);
    CHECK(check_tape({{3, 2, 2, 3, 2}}, [](auto& o, auto& l) { return o.merge_heads(l[0]); }) == 72);
    CHECK(check_tape({{2, 2, 3, 2}}, [](auto& o, auto& l) { return o.merge_heads(l[0]); }) == 24);
    // q·kᵀ of two parts of one array: both parts' gradients land in it.
    CHECK(check_tape({{3, 2, 4, 3}}, [](auto& o, auto& l) {
            return o.batched_matmul(o.part(l[0], 0), o.part(l[0], 2), trans::no, trans::yes);
          }) == 72);
  }
}

TEST_CASE("attention's ops refuse shapes that do not fit, naming them") {
  auto& set = cpu_op_set<float>();
  basic_ops<float> o(set);
  auto a = o.zeros({2, 3, 4}), b = o.zeros({3, 4, 5}), c = o.zeros({2, 5, 6});
  CHECK_THROWS_WITH_AS(o.batched_matmul(a, b),
                       "ops: batched matmul of [2, 3, 4] and [3, 4, 5]: they need the same leading dimensions and "
                       "two more",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(o.batched_matmul(a, c), "ops: batched matmul of [2, 3, 4] and [2, 5, 6]: inner dimensions 4 and 5",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(o.split_heads(o.zeros({2, 3, 10}), 4, 3),
                       "ops: split of [2, 3, 10] into 3 parts of 4 heads (it needs [B, T, parts·heads·D])",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(o.merge_heads(a), "ops: merge of heads [2, 3, 4] (it needs [parts, B, H, T, D] or [B, H, T, D])",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(o.part(a, 2), "ops: part 2 of [2, 3, 4]", std::invalid_argument);
}

}  // namespace
}  // namespace nerve::layers

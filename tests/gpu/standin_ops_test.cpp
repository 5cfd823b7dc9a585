// The stand-in's ops (the CPU twins the GPU is checked against) on small
// hand-computed cases, through the same launchers a layer backend calls.
#include "gpu/blas.hpp"
#include "gpu/device.hpp"
#include "gpu/kernels.hpp"
#include "gpu/layers/device_op_set.hpp"
#include "gpu/memory.hpp"
#include "layers/ops.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

using namespace nerve;

namespace {

struct fixture {
  gpu::device dev{[] {
    gpu::device_options o;
    o.backend = gpu::backend_kind::standin;
    return o;
  }()};
  gpu::stream s = dev.create_stream();

  gpu::device_tensor upload(const std::vector<float>& v, gpu::shape_t shape) {
    gpu::device_tensor t(s, std::move(shape));
    gpu::copy_async(s, t.data(), v.data(), v.size() * sizeof(float));
    s.synchronize();
    return t;
  }
  template <class T>
  std::vector<T> download(const T* p, std::size_t n) {
    std::vector<T> v(n);
    gpu::copy_async(s, v.data(), p, n * sizeof(T));
    s.synchronize();
    return v;
  }
};

}  // namespace

TEST_SUITE("gpu.standin") {
  TEST_CASE("tensors round-trip through pinned memory") {
    fixture f;
    gpu::device_tensor t(f.s, {3, 4});
    CHECK(t.rows() == 3);
    CHECK(t.cols() == 4);
    CHECK(t.bytes() == 48);
    gpu::pinned_buffer in(f.dev, t.bytes()), out(f.dev, t.bytes());
    auto src = in.as<float>();
    std::iota(src.begin(), src.end(), 1.0f);
    gpu::copy_async(f.s, t.data(), in.data(), t.bytes());
    gpu::scale(f.s, t.size(), 2.0f, t.data());
    gpu::copy_async(f.s, out.data(), t.data(), t.bytes());
    f.s.synchronize();
    for (std::size_t i = 0; i < 12; ++i) CHECK(out.as<float>()[i] == 2.0f * float(i + 1));
  }

  TEST_CASE("gemm is row-major with every transpose") {
    fixture f;
    // A = [1 2 3; 4 5 6] (2×3), B = [7 8; 9 10; 11 12] (3×2): A·B = [58 64; 139 154].
    const std::vector<float> a{1, 2, 3, 4, 5, 6}, at{1, 4, 2, 5, 3, 6};
    const std::vector<float> b{7, 8, 9, 10, 11, 12}, bt{7, 9, 11, 8, 10, 12};
    const std::vector<float> want{58, 64, 139, 154};
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        CAPTURE(ta);
        CAPTURE(tb);
        auto da = f.upload(ta ? at : a, {6});
        auto db = f.upload(tb ? bt : b, {6});
        auto dc = f.upload({1, 1, 1, 1}, {2, 2});
        gpu::gemm(f.s, gpu::transpose(ta), gpu::transpose(tb), 2, 2, 3, 1.0f, da.data(), db.data(), 1.0f, dc.data());
        auto c = f.download(dc.data(), 4);
        for (int i = 0; i < 4; ++i) CHECK(c[i] == want[i] + 1.0f);  // beta = 1 accumulates
      }
  }

  TEST_CASE("bias add with relu, column sums with accumulation") {
    fixture f;
    auto x = f.upload({1, -2, 3, -4, 5, -6}, {2, 3});
    auto bias = f.upload({1, 1, -10}, {3});
    gpu::device_tensor y(f.s, {2, 3});
    gpu::bias_add(f.s, x.data(), bias.data(), y.data(), 2, 3, true);
    CHECK(f.download(y.data(), 6) == std::vector<float>{2, 0, 0, 0, 6, 0});
    auto sums = f.upload({100, 100, 100}, {3});
    gpu::column_sums(f.s, x.data(), 2, 3, sums.data(), 1.0f);
    CHECK(f.download(sums.data(), 3) == std::vector<float>{97, 103, 97});
  }

  TEST_CASE("softmax cross-entropy: loss, correct count and gradient") {
    fixture f;
    auto logits = f.upload({0, 0, std::log(2.0f), 5, 1, 1}, {2, 3});
    std::vector<std::int32_t> labels_h{2, 1};
    gpu::device_buffer labels(f.s, 2 * sizeof(std::int32_t));
    gpu::copy_async(f.s, labels.data(), labels_h.data(), 8);
    gpu::device_tensor probs(f.s, {2, 3}), loss(f.s, {2}), grad(f.s, {2, 3});
    gpu::device_buffer correct(f.s, sizeof(float));
    auto* lab = static_cast<const std::int32_t*>(labels.data());
    gpu::softmax_xent_forward(f.s, logits.data(), lab, 2, 3, probs.data(), loss.data(),
                              static_cast<float*>(correct.data()));
    gpu::softmax_xent_backward(f.s, probs.data(), lab, 2, 3, 0.5f, grad.data());
    auto p = f.download(probs.data(), 6);
    auto l = f.download(loss.data(), 2);
    auto c = f.download(static_cast<const float*>(correct.data()), 1);
    auto g = f.download(grad.data(), 6);
    CHECK(p[0] == doctest::Approx(0.25));
    CHECK(p[2] == doctest::Approx(0.5));
    CHECK(l[0] == doctest::Approx(std::log(2.0)));
    CHECK(c[0] == 1);  // row 0 right (label 2), row 1 wrong (arg-max 0, label 1)
    CHECK(g[2] == doctest::Approx(0.5 * (0.5 - 1.0)));
    CHECK(g[0] == doctest::Approx(0.5 * 0.25));
  }

  TEST_CASE("sgd with momentum and nesterov follows PyTorch's recurrence") {
    fixture f;
    auto w = f.upload({1.0f}, {1});
    auto g = f.upload({0.5f}, {1});
    auto v = f.upload({0.0f}, {1});
    gpu::sgd_params p{0.1f, 0.9f, 0.0f, true};
    gpu::sgd_update(f.s, w.data(), g.data(), v.data(), 1, p);  // v = 0.5; step = 0.5 + 0.45
    gpu::sgd_update(f.s, w.data(), g.data(), v.data(), 1, p);  // v = 0.95; step = 0.5 + 0.855
    CHECK(f.download(w.data(), 1)[0] == doctest::Approx(1.0 - 0.1 * 0.95 - 0.1 * 1.355));
  }

  TEST_CASE("adam's first step moves every weight by lr") {
    fixture f;
    auto w = f.upload({1.0f, -1.0f}, {2});
    auto g = f.upload({0.3f, -7.0f}, {2});
    auto m = f.upload({0, 0}, {2});
    auto v = f.upload({0, 0}, {2});
    gpu::adam_update(f.s, w.data(), g.data(), m.data(), v.data(), 2, gpu::adam_params{});
    auto got = f.download(w.data(), 2);
    CHECK(got[0] == doctest::Approx(1.0 - 1e-3).epsilon(1e-5));
    CHECK(got[1] == doctest::Approx(-1.0 + 1e-3).epsilon(1e-5));
  }

  TEST_CASE("col2im is the adjoint of im2col, pooling backward conserves the gradient") {
    fixture f;
    gpu::window_geometry geo{2, 3, 7, 6, 3, 2, 1, 0, 2, 1};
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1, 1);
    std::vector<float> x(2 * 3 * 7 * 6), c(2 * geo.patch_rows() * geo.patch_cols());
    for (auto& e : x) e = u(rng);
    for (auto& e : c) e = u(rng);
    auto dx = f.upload(x, {x.size()});
    auto dc = f.upload(c, {c.size()});
    gpu::device_tensor col(f.s, {c.size()}), img(f.s, {x.size()});
    gpu::im2col(f.s, dx.data(), geo, col.data());
    gpu::col2im(f.s, dc.data(), geo, img.data());
    auto ax = f.download(col.data(), c.size());
    auto aty = f.download(img.data(), x.size());
    double lhs = 0, rhs = 0;
    for (std::size_t i = 0; i < c.size(); ++i) lhs += double(ax[i]) * c[i];
    for (std::size_t i = 0; i < x.size(); ++i) rhs += double(x[i]) * aty[i];
    CHECK(lhs == doctest::Approx(rhs).epsilon(1e-5));

    gpu::window_geometry pool{2, 3, 7, 6, 3, 3, 1, 1, 2, 2};
    const std::size_t outs = 2 * 3 * std::size_t(pool.out_h()) * pool.out_w();
    gpu::device_tensor y(f.s, {outs}), dy(f.s, {outs}), back(f.s, {x.size()});
    gpu::device_buffer arg(f.s, outs * sizeof(std::int32_t));
    gpu::max_pool_forward(f.s, dx.data(), pool, y.data(), static_cast<std::int32_t*>(arg.data()));
    gpu::fill(f.s, outs, 1.0f, dy.data());
    gpu::max_pool_backward(f.s, dy.data(), static_cast<const std::int32_t*>(arg.data()), pool, back.data());
    auto b = f.download(back.data(), x.size());
    CHECK(std::accumulate(b.begin(), b.end(), 0.0) == doctest::Approx(double(outs)));
    gpu::avg_pool_backward(f.s, dy.data(), pool, back.data());
    b = f.download(back.data(), x.size());
    // Windows hanging over the padding lose the padding's share.
    CHECK(std::accumulate(b.begin(), b.end(), 0.0) <= double(outs) + 1e-3);
  }

  TEST_CASE("attention's ops on the stand-in: the CPU op set's softmax and permutation bits, its products' values") {
    fixture f;
    gpu::device_op_set dev(f.s, "standin");
    auto& cpu = layers::cpu_op_set<float>();
    std::mt19937 rng(36);
    std::normal_distribution<float> d(0.0f, 10.0f);
    auto random = [&](std::vector<std::int64_t> dims) {
      auto on_cpu = cpu.alloc(dims);
      for (std::int64_t i = 0; i < on_cpu.size(); ++i) on_cpu.data[i] = d(rng);
      auto on_dev = dev.alloc(std::move(dims));
      dev.write(on_cpu.data, on_dev.data, on_cpu.size());
      return std::pair{on_cpu, on_dev};
    };
    auto same_bits = [&](const layers::array& on_cpu, const layers::array& on_dev) {
      std::vector<float> got(std::size_t(on_dev.size()));
      dev.read(on_dev.data, got.data(), on_dev.size());
      return std::memcmp(got.data(), on_cpu.data, got.size() * sizeof(float)) == 0;
    };

    const std::int64_t t = 7, rows = 3 * t;  // three [7, 7] blocks of scores
    auto [x, dx_] = random({3, t, t});
    auto [dy, ddy] = random({3, t, t});
    for (const layers::causal_mask m : {layers::causal_mask{}, layers::causal_mask{true, t, 0},
                                        layers::causal_mask{true, t, -1}, layers::causal_mask{true, t, 3}}) {
      CAPTURE(m.on);
      CAPTURE(m.offset);
      auto y = cpu.alloc(x.dims), gy = dev.alloc(x.dims), g = cpu.alloc(x.dims), gg = dev.alloc(x.dims);
      cpu.softmax_rows(x.data, y.data, rows, t, m);
      dev.softmax_rows(dx_.data, gy.data, rows, t, m);
      CHECK(same_bits(y, gy));
      cpu.softmax_rows_grad(y.data, dy.data, g.data, rows, t);
      dev.softmax_rows_grad(gy.data, ddy.data, gg.data, rows, t);
      CHECK(same_bits(g, gg));
    }

    const layers::head_geometry g{2, 5, 3, 2, 4};
    auto [h, dh] = random({2, 5, 24});
    auto split = cpu.alloc({3, 2, 2, 5, 4}), dsplit = dev.alloc({3, 2, 2, 5, 4});
    cpu.split_heads(g, h.data, split.data);
    dev.split_heads(g, dh.data, dsplit.data);
    CHECK(same_bits(split, dsplit));
    auto merged = cpu.alloc(h.dims), dmerged = dev.alloc(h.dims);
    cpu.merge_heads(g, split.data, merged.data);
    dev.merge_heads(g, dsplit.data, dmerged.data);
    CHECK(same_bits(merged, dmerged));
    CHECK(same_bits(h, dmerged));

    // q·kᵀ over 4 heads, k shared by every head in the second product (stride 0).
    auto [q, dq] = random({4, 5, 3});
    auto [k, dk] = random({4, 6, 3});
    for (std::int64_t stride_b : {18, 0}) {
      CAPTURE(stride_b);
      auto c = cpu.alloc({4, 5, 6}), dc = dev.alloc({4, 5, 6});
      cpu.gemm_batched(layers::trans::no, layers::trans::yes, 5, 6, 3, 0.5f, q.data, 3, 15, k.data, 3,
                       stride_b, 0.0f, c.data, 6, 30, 4);
      dev.gemm_batched(layers::trans::no, layers::trans::yes, 5, 6, 3, 0.5f, dq.data, 3, 15, dk.data, 3,
                       stride_b, 0.0f, dc.data, 6, 30, 4);
      std::vector<float> got(std::size_t(dc.size()));
      dev.read(dc.data, got.data(), dc.size());
      for (std::int64_t i = 0; i < c.size(); ++i)
        CHECK(got[std::size_t(i)] == doctest::Approx(c.data[i]).epsilon(1e-5));
    }
  }
}

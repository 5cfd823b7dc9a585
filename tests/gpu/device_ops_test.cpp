// Every GPU op against its CPU twin (gpu/standin/cpu_kernels) on fresh random
// inputs, fp32, TF32 off. Tolerances, with u = 2^-24 (docs/gpu.md derives them):
// - gemm: |C − C_ref| ≤ (k+2)·u·(|α|·Σ_p|a_ip||b_pj| + |β·c_ij|): the rigorous bound
//   for any summation order of a k-term fp32 dot product (Higham 3.5) plus the final
//   rounding; the reference is accumulated in double.
// - transcendental activations: 16·u·(|ref| + |x|·|dy|) (expf/tanhf within 2 ulp and
//   erfcf within 4 on the GPU, glibc's within 3.5; each formula adds at most 4
//   roundings; GELU's Φ is ½·erfc(−x/√2), which does not cancel for negative x as
//   ½·(1 + erf(x/√2)) did).
// - ops with one FMA the CPU does not fuse (axpy, optimizers): a few roundings of
//   the terms' magnitudes.
// - bias add, relu, scale, fill, im2col/col2im, pooling: bitwise, the same float
//   operations in the same order on both sides.
// - the row softmax: 16·u·|ref| (expf's error on each side, through the sum and the
//   quotient); its backward from the same output, and the head permutations: bitwise.
#include "gpu/blas.hpp"
#include "gpu/kernels.hpp"
#include "gpu/kernels/ops.hpp"
#include "gpu/standin/cpu_kernels.hpp"
#include "gpu/status.hpp"
#include "tests/gpu/gpu_fixture.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <utility>

using namespace nerve;
using namespace nerve::gpu::test;
using gpu::transpose;

namespace {

struct gemm_case {
  int m, n, k;
};

/// |α|·|op(A)|·|op(B)| + |β·C|, for the bound.
std::vector<double> gemm_magnitude(transpose ta, transpose tb, int m, int n, int k, float alpha,
                                   const std::vector<float>& a, int lda, const std::vector<float>& b, int ldb,
                                   float beta, const std::vector<float>& c, int ldc) {
  std::vector<double> mag(std::size_t(m) * ldc, 0.0);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double acc = 0.0;
      for (int p = 0; p < k; ++p) {
        const float av = ta == transpose::yes ? a[std::size_t(p) * lda + i] : a[std::size_t(i) * lda + p];
        const float bv = tb == transpose::yes ? b[std::size_t(j) * ldb + p] : b[std::size_t(p) * ldb + j];
        acc += std::abs(double(av) * double(bv));
      }
      mag[std::size_t(i) * ldc + j] = std::abs(double(alpha)) * acc + std::abs(double(beta) * c[std::size_t(i) * ldc + j]);
    }
  return mag;
}

double run_gemm_case(cuda_fixture& fx, gpu::stream& s, transpose ta, transpose tb, gemm_case g, float alpha,
                     float beta, int pad, bool report = true) {
  const int a_rows = ta == transpose::no ? g.m : g.k, a_cols = ta == transpose::no ? g.k : g.m;
  const int b_rows = tb == transpose::no ? g.k : g.n, b_cols = tb == transpose::no ? g.n : g.k;
  const int lda = a_cols + pad, ldb = b_cols + pad, ldc = g.n + pad;
  auto a = fx.normal(std::size_t(a_rows) * lda), b = fx.normal(std::size_t(b_rows) * ldb);
  auto c = fx.normal(std::size_t(g.m) * ldc);
  auto da = fx.up(a), db = fx.up(b), dc = fx.up(c);
  gpu::gemm(s, ta, tb, g.m, g.n, g.k, alpha, f(da), lda, f(db), ldb, beta, f(dc), ldc);
  s.synchronize();
  auto got = fx.down<float>(dc.data(), c.size());
  auto want = c;
  gpu::cpu::gemm(ta, tb, g.m, g.n, g.k, alpha, a.data(), lda, b.data(), ldb, beta, want.data(), ldc);
  auto mag = gemm_magnitude(ta, tb, g.m, g.n, g.k, alpha, a, lda, b, ldb, beta, c, ldc);
  std::vector<double> tol(mag.size());
  double worst = 0.0;
  for (std::size_t i = 0; i < tol.size(); ++i) {
    tol[i] = (g.k + 2) * unit_roundoff * mag[i] + 1e-30;
    worst = std::max(worst, std::abs(double(got[i]) - want[i]) / tol[i]);
  }
  if (report)
    check_within("gemm " + std::to_string(g.m) + "x" + std::to_string(g.n) + "x" + std::to_string(g.k), got, want, tol);
  return worst;
}

}  // namespace

TEST_SUITE("gpu.device.ops") {
  TEST_CASE("gemm matches the double reference for every transpose, shape, beta and stride") {
    cuda_fixture fx;
    const gemm_case cases[] = {{1, 1, 1}, {7, 13, 5}, {64, 64, 64}, {33, 1, 300}, {256, 128, 784}, {129, 257, 1000}};
    for (auto g : cases)
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          CAPTURE(g.m);
          CAPTURE(g.n);
          CAPTURE(g.k);
          CAPTURE(ta);
          CAPTURE(tb);
          run_gemm_case(fx, fx.s, transpose(ta), transpose(tb), g, 1.0f, 0.0f, 0);
          run_gemm_case(fx, fx.s, transpose(ta), transpose(tb), g, 0.5f, 1.0f, 3);  // accumulate, padded rows
        }
  }

  TEST_CASE("TF32 is off unless the stream asks for it") {
    cuda_fixture fx;
    auto tf32 = fx.dev.create_stream(gpu::stream_options{true});
    const gemm_case big{256, 256, 2048};
    const double fp32 = run_gemm_case(fx, fx.s, transpose::no, transpose::no, big, 1.0f, 0.0f, 0);
    const double with_tf32 = run_gemm_case(fx, tf32, transpose::no, transpose::no, big, 1.0f, 0.0f, 0, false);
    MESSAGE("worst error / fp32 bound: default " << fp32 << ", tf32 stream " << with_tf32);
    CHECK(fp32 <= 1.0);
    if (fx.dev.kind() == gpu::backend_kind::cuda)
      CHECK(with_tf32 > fp32);  // 10-bit mantissas show: the math mode really switched (the stand-in has no TF32)
  }

  TEST_CASE("strided batched gemm shares the weights across images (convolution)") {
    cuda_fixture fx;
    const int batch = 5, m = 16, n = 49, k = 75;  // K filters × (C·kh·kw) · patches
    auto w = fx.normal(std::size_t(m) * k), col = fx.normal(std::size_t(batch) * k * n);
    auto dw = fx.up(w), dcol = fx.up(col);
    gpu::device_buffer dy(fx.s, std::size_t(batch) * m * n * sizeof(float));
    gpu::gemm_strided_batched(fx.s, transpose::no, transpose::no, m, n, k, 1.0f, f(dw), k, 0, f(dcol), n,
                              std::int64_t(k) * n, 0.0f, f(dy), n, std::int64_t(m) * n, batch);
    auto got = fx.down<float>(dy.data(), std::size_t(batch) * m * n);
    std::vector<float> want(got.size());
    std::vector<double> tol(got.size());
    for (int i = 0; i < batch; ++i) {
      gpu::cpu::gemm(transpose::no, transpose::no, m, n, k, 1.0f, w.data(), k, col.data() + std::size_t(i) * k * n, n,
                     0.0f, want.data() + std::size_t(i) * m * n, n);
      std::vector<float> zero(std::size_t(m) * n, 0.0f);
      std::vector<float> ci(col.begin() + std::ptrdiff_t(i) * k * n, col.begin() + std::ptrdiff_t(i + 1) * k * n);
      auto mag = gemm_magnitude(transpose::no, transpose::no, m, n, k, 1.0f, w, k, ci, n, 0.0f, zero, n);
      for (std::size_t j = 0; j < mag.size(); ++j) tol[std::size_t(i) * m * n + j] = (k + 2) * unit_roundoff * mag[j];
    }
    check_within("strided batched gemm", got, want, tol);
  }

  TEST_CASE("activations forward and backward") {
    cuda_fixture fx;
    const std::size_t n = 100003;
    auto x = fx.normal(n, 3.0f), dy = fx.normal(n);
    auto dx_ = fx.up(x), ddy = fx.up(dy);
    gpu::device_buffer y(fx.s, n * 4), dx(fx.s, n * 4);
    for (auto act : {gpu::activation::relu, gpu::activation::leaky_relu, gpu::activation::sigmoid,
                     gpu::activation::tanh, gpu::activation::gelu}) {
      CAPTURE(int(act));
      gpu::activation_forward(fx.s, act, f(dx_), f(y), n, 0.1f);
      gpu::activation_backward(fx.s, act, f(dx_), f(y), f(ddy), f(dx), n, 0.1f);
      auto gy = fx.down<float>(y.data(), n), gdx = fx.down<float>(dx.data(), n);
      std::vector<float> ry(n), rdx(n);
      // Backward from the GPU's own forward output, so only the backward formula is compared.
      gpu::ops::with_activation(act, [&](auto k) {
        gpu::cpu::each(n, gpu::ops::activation_forward<k>{x.data(), ry.data(), 0.1f});
        gpu::cpu::each(n, gpu::ops::activation_backward<k>{x.data(), gy.data(), dy.data(), rdx.data(), 0.1f});
      });
      const bool exact = act == gpu::activation::relu || act == gpu::activation::leaky_relu;
      if (exact) {
        check_equal("forward", gy, ry);
        check_equal("backward", gdx, rdx);
      } else {
        std::vector<double> ty(n), tdx(n);
        for (std::size_t i = 0; i < n; ++i) {
          ty[i] = 16 * unit_roundoff * (std::abs(ry[i]) + std::abs(x[i])) + 1e-30;
          tdx[i] = 16 * unit_roundoff * (std::abs(rdx[i]) + std::abs(dy[i]) * (1.0 + std::abs(x[i]))) + 1e-30;
        }
        check_within("forward", gy, ry, ty);
        check_within("backward", gdx, rdx, tdx);
      }
    }
  }

  TEST_CASE("bias add with and without relu, column sums with accumulation") {
    cuda_fixture fx;
    const std::size_t rows = 1024, cols = 333;
    auto x = fx.normal(rows * cols), bias = fx.normal(cols), acc = fx.normal(cols);
    auto dx = fx.up(x), db = fx.up(bias);
    gpu::device_buffer y(fx.s, rows * cols * 4);
    for (bool relu : {false, true}) {
      gpu::bias_add(fx.s, f(dx), f(db), f(y), rows, cols, relu);
      std::vector<float> want(rows * cols);
      gpu::cpu::each(rows * cols, gpu::ops::bias_add{x.data(), bias.data(), want.data(), cols, relu});
      check_equal(relu ? "bias add relu" : "bias add", fx.down<float>(y.data(), rows * cols), want);
    }
    // Column sums: the loss's one column, a partial tile, rows not a multiple of 32.
    for (auto [r, c] : {std::pair<std::size_t, std::size_t>{rows, cols}, {1000, 1}, {37, 70}}) {
      CAPTURE(r);
      CAPTURE(c);
      const float beta = c == 1 ? 0.0f : 1.0f;
      const std::vector<float> start(acc.begin(), acc.begin() + std::ptrdiff_t(c));
      auto out = fx.up(start);
      gpu::column_sums(fx.s, f(dx), r, c, f(out), beta);
      auto want = start;
      gpu::cpu::column_sums(x.data(), r, c, want.data(), beta);
      // Both sides sum in double, in different orders (the GPU by 32 row strides, then
      // the strides), then round to float: u·|sum| + 2·r·2⁻⁵³·Σ|x| (Higham 3.5, in double).
      std::vector<double> tol(c);
      for (std::size_t j = 0; j < c; ++j) {
        double mag = std::abs(double(acc[j]));
        for (std::size_t i = 0; i < r; ++i) mag += std::abs(double(x[i * c + j]));
        tol[j] = unit_roundoff * std::abs(want[j]) + 2.0 * double(r) * std::ldexp(1.0, -53) * mag + 1e-30;
      }
      check_within("column sums", fx.down<float>(out.data(), c), want, tol);
    }
  }

  TEST_CASE("softmax cross-entropy forward and backward") {
    cuda_fixture fx;
    for (std::size_t cols : {std::size_t(10), std::size_t(37), std::size_t(1000)}) {
      CAPTURE(cols);
      const std::size_t rows = 777;
      auto z = fx.normal(rows * cols, 4.0f);
      std::vector<std::int32_t> labels(rows);
      std::uniform_int_distribution<int> pick(0, int(cols) - 1);
      for (auto& l : labels) l = pick(fx.rng);
      auto dz = fx.up(z);
      auto dl = fx.up(labels);
      gpu::device_buffer probs(fx.s, rows * cols * 4), loss(fx.s, rows * 4), correct(fx.s, 4), grad(fx.s, rows * cols * 4);
      gpu::softmax_xent_forward(fx.s, f(dz), i32(dl), rows, cols, f(probs), f(loss), f(correct));
      gpu::softmax_xent_backward(fx.s, f(probs), i32(dl), rows, cols, 1.0f / rows, f(grad));
      std::vector<float> rp(rows * cols), rl(rows), rg(rows * cols);
      float rc = -1;
      gpu::cpu::softmax_xent_forward(z.data(), labels.data(), rows, cols, rp.data(), rl.data(), &rc);
      auto gp = fx.down<float>(probs.data(), rows * cols);
      // Both sides work in double and round once, but CUDA's double exp/log and the
      // warp's summation order differ from glibc's in the last double bits.
      std::vector<double> tp(rp.size()), tl(rows);
      for (std::size_t i = 0; i < rp.size(); ++i) tp[i] = 2 * unit_roundoff * std::abs(rp[i]) + 1e-30;
      for (std::size_t r = 0; r < rows; ++r) tl[r] = 2 * unit_roundoff * (std::abs(rl[r]) + 1.0) + 1e-30;
      check_within("probs", gp, rp, tp);
      check_within("loss", fx.down<float>(loss.data(), rows), rl, tl);
      CHECK(fx.down<float>(correct.data(), 1)[0] == rc);
      gpu::cpu::each(rows * cols,
                     gpu::ops::softmax_xent_backward{gp.data(), labels.data(), cols, 1.0f / rows, rg.data()});
      check_equal("gradient", fx.down<float>(grad.data(), rows * cols), rg);
    }
  }

  TEST_CASE("axpy, scale and fill") {
    cuda_fixture fx;
    const std::size_t n = 65537;
    auto x = fx.normal(n), y = fx.normal(n);
    auto dx = fx.up(x), dy = fx.up(y);
    gpu::axpy(fx.s, n, -0.7f, f(dx), f(dy));
    auto want = y;
    gpu::cpu::each(n, gpu::ops::axpy{-0.7f, x.data(), want.data()});
    std::vector<double> tol(n);
    for (std::size_t i = 0; i < n; ++i) tol[i] = 2 * unit_roundoff * (std::abs(y[i]) + std::abs(0.7 * x[i])) + 1e-30;
    check_within("axpy", fx.down<float>(dy.data(), n), want, tol);
    gpu::scale(fx.s, n, 3.0f, f(dx));
    gpu::cpu::each(n, gpu::ops::scale{3.0f, x.data()});
    check_equal("scale", fx.down<float>(dx.data(), n), x);
    gpu::fill(fx.s, n, 0.25f, f(dx));
    check_equal("fill", fx.down<float>(dx.data(), n), std::vector<float>(n, 0.25f));
  }

  TEST_CASE("sgd and adam updates, three steps") {
    cuda_fixture fx;
    const std::size_t n = 50001;
    for (int variant = 0; variant < 5; ++variant) {
      CAPTURE(variant);
      auto w = fx.normal(n), g = fx.normal(n);
      std::vector<float> s1(n, 0.0f), s2(n, 0.0f);
      auto dw = fx.up(w), dg = fx.up(g), d1 = fx.up(s1), d2 = fx.up(s2);
      auto rw = w;
      for (int step = 1; step <= 3; ++step) {
        if (variant < 3) {
          gpu::sgd_params p{0.05f, variant == 0 ? 0.0f : 0.9f, 1e-2f, variant == 2};
          gpu::sgd_update(fx.s, f(dw), f(dg), f(d1), n, p);
          gpu::cpu::each(n, gpu::ops::sgd_update::make(rw.data(), g.data(), s1.data(), p));
        } else {
          gpu::adam_params p;
          p.lr = 1e-2f;
          p.weight_decay = 0.1f;
          p.decoupled = variant == 4;
          p.step = step;
          gpu::adam_update(fx.s, f(dw), f(dg), f(d1), f(d2), n, p);
          gpu::cpu::each(n, gpu::ops::adam_update::make(rw.data(), g.data(), s1.data(), s2.data(), p));
        }
      }
      // Each step: a handful of roundings of the update's terms (the GPU fuses
      // multiply-adds the CPU rounds twice); three steps compound them.
      std::vector<double> tol(n);
      for (std::size_t i = 0; i < n; ++i)
        tol[i] = 8 * unit_roundoff * (std::abs(w[i]) + std::abs(rw[i])) + 64 * unit_roundoff * std::abs(rw[i] - w[i]) +
                 1e-30;
      check_within("weights", fx.down<float>(dw.data(), n), rw, tol);
    }
  }

  TEST_CASE("im2col, col2im and pooling are bitwise the CPU's") {
    cuda_fixture fx;
    const gpu::window_geometry geos[] = {
        {8, 3, 28, 28, 5, 5, 2, 2, 1, 1},   // LeNet-like conv, same padding
        {4, 6, 14, 13, 3, 3, 1, 1, 2, 2},   // strided, odd width
        {4, 6, 14, 14, 2, 2, 0, 0, 2, 2},   // 2×2 pooling
        {3, 5, 11, 9, 3, 3, 1, 1, 2, 2},    // overlapping 3×3/2 pooling with padding
    };
    for (const auto& g : geos) {
      CAPTURE(g.kernel_h);
      CAPTURE(g.stride_h);
      CAPTURE(g.pad_h);
      const std::size_t in = std::size_t(g.batch) * g.channels * g.height * g.width;
      const std::size_t cols = std::size_t(g.batch) * g.patch_rows() * g.patch_cols();
      const std::size_t out = std::size_t(g.batch) * g.channels * g.out_h() * g.out_w();
      auto x = fx.normal(in), c = fx.normal(cols), dyv = fx.normal(out);
      auto dx = fx.up(x), dc = fx.up(c), ddy = fx.up(dyv);
      gpu::device_buffer col(fx.s, cols * 4), img(fx.s, in * 4), y(fx.s, out * 4), arg(fx.s, out * 4), back(fx.s, in * 4);
      std::vector<float> rcol(cols), rimg(in), ry(out), rback(in);
      std::vector<std::int32_t> rarg(out);

      gpu::im2col(fx.s, f(dx), g, f(col));
      gpu::cpu::each(cols, gpu::ops::im2col{x.data(), g, rcol.data()});
      check_equal("im2col", fx.down<float>(col.data(), cols), rcol);
      gpu::col2im(fx.s, f(dc), g, f(img));
      gpu::cpu::each(in, gpu::ops::col2im{c.data(), g, rimg.data()});
      check_equal("col2im", fx.down<float>(img.data(), in), rimg);

      if (g.pad_h < g.kernel_h && g.pad_w < g.kernel_w) {
        gpu::max_pool_forward(fx.s, f(dx), g, f(y), i32(arg));
        gpu::cpu::each(out, gpu::ops::pool_forward<true>{x.data(), g, ry.data(), rarg.data()});
        check_equal("max pool", fx.down<float>(y.data(), out), ry);
        check_equal("max pool argmax", fx.down<std::int32_t>(arg.data(), out), rarg);
        gpu::max_pool_backward(fx.s, f(ddy), i32(arg), g, f(back));
        gpu::cpu::each(in, gpu::ops::pool_backward<true>{dyv.data(), rarg.data(), g, rback.data()});
        check_equal("max pool backward", fx.down<float>(back.data(), in), rback);
      }
      gpu::avg_pool_forward(fx.s, f(dx), g, f(y));
      gpu::cpu::each(out, gpu::ops::pool_forward<false>{x.data(), g, ry.data(), nullptr});
      check_equal("avg pool", fx.down<float>(y.data(), out), ry);
      gpu::avg_pool_backward(fx.s, f(ddy), g, f(back));
      gpu::cpu::each(in, gpu::ops::pool_backward<false>{dyv.data(), nullptr, g, rback.data()});
      check_equal("avg pool backward", fx.down<float>(back.data(), in), rback);
    }
  }

  TEST_CASE("the row softmax, causal or not, and its backward against the CPU twin; the head permutations bitwise") {
    cuda_fixture fx;
    // Rows of [B·H, T, T] scores (long rows: one thread per row walks them in order).
    const std::size_t t = 97, rows = 6 * t, cols = t;
    auto x = fx.normal(rows * cols, 20.0f), dyv = fx.normal(rows * cols);
    auto dx_ = fx.up(x), ddy = fx.up(dyv);
    gpu::device_buffer y(fx.s, rows * cols * 4), dx(fx.s, rows * cols * 4);
    struct mask {
      bool causal;
      std::int64_t offset;
    };
    for (const mask m : {mask{false, 0}, mask{true, 0}, mask{true, -1}, mask{true, 5}}) {
      CAPTURE(m.causal);
      CAPTURE(m.offset);
      gpu::softmax_rows(fx.s, f(dx_), f(y), rows, cols, m.causal, t, m.offset);
      auto gy = fx.down<float>(y.data(), rows * cols);
      std::vector<float> ry(rows * cols), rdx(rows * cols);
      gpu::cpu::each(rows, gpu::ops::softmax_rows{x.data(), ry.data(), cols, m.causal, t, m.offset});
      // expf is within 2 ulp on the GPU and 1 on the host, so an exponential within 6·u
      // of the other side's, their double sum as close, and the quotient one rounding
      // more: 13·u, bounded by 16·u.
      std::vector<double> tol(ry.size());
      for (std::size_t i = 0; i < tol.size(); ++i) tol[i] = 16 * unit_roundoff * std::abs(ry[i]);
      check_within("softmax", gy, ry, tol);
      for (std::size_t i = 0; i < gy.size(); ++i) CHECK(std::isfinite(gy[i]));
      // Backward from the GPU's own output: the same float and double operations.
      gpu::softmax_rows_backward(fx.s, f(y), f(ddy), f(dx), rows, cols);
      gpu::cpu::each(rows, gpu::ops::softmax_rows_backward{gy.data(), dyv.data(), rdx.data(), cols});
      check_equal("softmax backward", fx.down<float>(dx.data(), rows * cols), rdx);
    }

    const gpu::head_layout g{3, 17, 3, 4, 8};
    auto h = fx.normal(g.size());
    auto dh = fx.up(h);
    gpu::device_buffer split(fx.s, g.size() * 4), merged(fx.s, g.size() * 4);
    gpu::split_heads(fx.s, g, f(dh), f(split));
    gpu::merge_heads(fx.s, g, f(split), f(merged));
    std::vector<float> rsplit(g.size());
    gpu::cpu::each(g.size(), gpu::ops::permute_heads<true>{h.data(), rsplit.data(), g});
    check_equal("split heads", fx.down<float>(split.data(), g.size()), rsplit);
    check_equal("merge heads", fx.down<float>(merged.data(), g.size()), h);
  }

  TEST_CASE("bad arguments are errors at the call, not faults on the device") {
    cuda_fixture fx;
    gpu::device_buffer a(fx.s, 64);
    CHECK_THROWS_AS(gpu::gemm(fx.s, transpose::no, transpose::no, 4, 4, 4, 1.0f, f(a), 2, f(a), 4, 0.0f, f(a), 4),
                    gpu::error);
    CHECK_THROWS_AS(gpu::sgd_update(fx.s, f(a), f(a), nullptr, 4, gpu::sgd_params{0.1f, 0.9f}), gpu::error);
  }
}

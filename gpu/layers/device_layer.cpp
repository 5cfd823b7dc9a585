// The device twins of the CPU layers: the same math as layers/*.cpp, as cuBLAS
// calls and the kernels of gpu/kernels.hpp on one stream.
#include "gpu/layers/device_layer.hpp"

#include "gpu/blas.hpp"
#include "gpu/kernels.hpp"
#include "gpu/status.hpp"
#include "layers/conv2d.hpp"
#include "layers/linear.hpp"
#include "layers/pool.hpp"

namespace nerve::gpu {
namespace {

using cpu_layer = layers::basic_layer<float>;

std::string shape_text(const shape_t& s) {
  std::string t = "[";
  for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

[[noreturn]] void bad_shape(std::string_view kind, const shape_t& got, const std::string& want) {
  throw error(errc::invalid_argument,
              std::string(kind) + ": input has shape " + shape_text(got) + ", expected " + want);
}

/// A parameter tensor of `shape` plus its gradient, zeroed.
struct parameter_pair {
  device_tensor value, grad;
  parameter_pair(stream& s, shape_t shape) : value(s, shape), grad(s, std::move(shape)) {
    fill_zero_async(s, value.data(), value.bytes());
    fill_zero_async(s, grad.data(), grad.bytes());
  }
};

/// A weight and an optional bias (`bias` elements; 0: none), as the CPU layer lists them.
struct weight_and_bias {
  parameter_pair w;
  std::vector<parameter_pair> b;  // empty without a bias
  weight_and_bias(stream& s, shape_t weight, std::size_t bias) : w(s, std::move(weight)) {
    if (bias) b.emplace_back(s, shape_t{bias});
  }
  std::vector<device_parameter> parameters() {
    std::vector<device_parameter> p{{"weight", &w.value, &w.grad}};
    if (!b.empty()) p.push_back({"bias", &b[0].value, &b[0].grad});
    return p;
  }
};

/// The window of an NCHW input `x`.
window_geometry window_of(const shape_t& x, int kh, int kw, int ph, int pw, int sh, int sw) {
  return {int(x[0]), int(x[1]), int(x[2]), int(x[3]), kh, kw, ph, pw, sh, sw};
}

/// A layer of one input: the output (of `output_shape`) and the input's gradient are
/// allocated here; `compute` and `input_gradient` fill them.
class unary_layer : public device_layer {
 public:
  void forward(stream& s, std::span<const device_tensor* const> in, device_tensor& y, device_stash& st) final {
    const auto& x = *in[0];
    y = device_tensor(s, output_shape(std::span<const shape_t>(&x.shape(), 1)));
    compute(s, x, y, st);
    st.inputs.assign(in.begin(), in.end());
    st.output = &y;
  }
  std::vector<device_tensor> backward_input(stream& s, const device_stash& st, const device_tensor& dy,
                                            std::uint64_t wanted) final {
    std::vector<device_tensor> g(1);
    if (!(wanted & 1)) return g;
    g[0] = device_tensor(s, st.inputs[0]->shape());
    input_gradient(s, st, dy, g[0]);
    return g;
  }

 protected:
  virtual void compute(stream& s, const device_tensor& x, device_tensor& y, device_stash& st) = 0;
  virtual void input_gradient(stream& s, const device_stash& st, const device_tensor& dy, device_tensor& dx) = 0;
};

// ---- Linear: y = x·Wᵀ + b; dx = dy·W; dW += dyᵀ·x; db += Σ dy ----------------
class linear_layer final : public unary_layer {
 public:
  linear_layer(stream& s, std::size_t in, std::size_t out, bool bias)
      : in_(in), out_(out), p_(s, {out, in}, bias ? out : 0) {}
  std::string_view kind() const noexcept override { return "Linear"; }
  shape_t output_shape(std::span<const shape_t> in) const override {
    if (in[0].size() != 2 || in[0][1] != in_) bad_shape(kind(), in[0], "[N, " + std::to_string(in_) + "]");
    return {in[0][0], out_};
  }
  void compute(stream& s, const device_tensor& x, device_tensor& y, device_stash&) override {
    gemm(s, transpose::no, transpose::yes, int(x.rows()), int(out_), int(in_), 1.0f, x.data(), p_.w.value.data(), 0.0f,
         y.data());
    if (!p_.b.empty()) bias_add(s, y.data(), p_.b[0].value.data(), y.data(), x.rows(), out_);
  }
  void input_gradient(stream& s, const device_stash&, const device_tensor& dy, device_tensor& dx) override {
    gemm(s, transpose::no, transpose::no, int(dx.rows()), int(in_), int(out_), 1.0f, dy.data(), p_.w.value.data(), 0.0f,
         dx.data());
  }
  void backward_weight(stream& s, const device_stash& st, const device_tensor& dy) override {
    const auto& x = *st.inputs[0];
    gemm(s, transpose::yes, transpose::no, int(out_), int(in_), int(x.rows()), 1.0f, dy.data(), x.data(), 1.0f,
         p_.w.grad.data());
    if (!p_.b.empty()) column_sums(s, dy.data(), dy.rows(), out_, p_.b[0].grad.data(), 1.0f);
  }
  std::vector<device_parameter> parameters() override { return p_.parameters(); }

 private:
  std::size_t in_, out_;
  weight_and_bias p_;
};

// ---- Conv2d: im2col, then Y_n = W·col_n for every image (one strided-batched call) ----
class conv2d_layer final : public unary_layer {
 public:
  conv2d_layer(stream& s, const layers::conv2d_options& o)
      : o_(o),
        p_(s, {std::size_t(o.out_channels), std::size_t(o.in_channels * o.kernel[0] * o.kernel[1])},
           o.bias ? std::size_t(o.out_channels) : 0) {}
  std::string_view kind() const noexcept override { return "Conv2d"; }
  shape_t output_shape(std::span<const shape_t> in) const override {
    const auto& x = in[0];
    if (x.size() != 4 || x[1] != std::size_t(o_.in_channels))
      bad_shape(kind(), x, "[N, " + std::to_string(o_.in_channels) + ", H, W]");
    const auto g = geometry(x);
    if (g.out_h() < 1 || g.out_w() < 1) bad_shape(kind(), x, "an image no smaller than the kernel");
    return {x[0], std::size_t(o_.out_channels), std::size_t(g.out_h()), std::size_t(g.out_w())};
  }
  void compute(stream& s, const device_tensor& x, device_tensor& y, device_stash&) override {
    const auto g = geometry(x.shape());
    const std::int64_t pr = std::int64_t(g.patch_rows()), pc = std::int64_t(g.patch_cols()), k = o_.out_channels;
    device_tensor col(s, {std::size_t(g.batch), std::size_t(pr), std::size_t(pc)});
    im2col(s, x.data(), g, col.data());
    gemm_strided_batched(s, transpose::no, transpose::no, int(k), int(pc), int(pr), 1.0f, p_.w.value.data(), int(pr), 0,
                         col.data(), int(pc), pr * pc, 0.0f, y.data(), int(pc), k * pc, g.batch);
    if (!p_.b.empty()) {
      // Y_n += b·1ᵀ: the bias broadcast over the pixels as a rank-1 product.
      ensure_ones(s, std::size_t(pc));
      gemm_strided_batched(s, transpose::no, transpose::no, int(k), int(pc), 1, 1.0f, p_.b[0].value.data(), 1, 0,
                           ones_.data(), int(pc), 0, 1.0f, y.data(), int(pc), k * pc, g.batch);
    }
  }
  void input_gradient(stream& s, const device_stash&, const device_tensor& dy, device_tensor& dx) override {
    const auto g = geometry(dx.shape());
    const std::int64_t pr = std::int64_t(g.patch_rows()), pc = std::int64_t(g.patch_cols()), k = o_.out_channels;
    device_tensor dcol(s, {std::size_t(g.batch), std::size_t(pr), std::size_t(pc)});
    // dcol_n = Wᵀ·dY_n, then col2im gathers every patch entry back onto its pixel.
    gemm_strided_batched(s, transpose::yes, transpose::no, int(pr), int(pc), int(k), 1.0f, p_.w.value.data(), int(pr),
                         0, dy.data(), int(pc), k * pc, 0.0f, dcol.data(), int(pc), pr * pc, g.batch);
    col2im(s, dcol.data(), g, dx.data());
  }
  void backward_weight(stream& s, const device_stash& st, const device_tensor& dy) override {
    const auto& x = *st.inputs[0];
    const auto g = geometry(x.shape());
    const std::int64_t pr = std::int64_t(g.patch_rows()), pc = std::int64_t(g.patch_cols()), k = o_.out_channels;
    device_tensor col(s, {std::size_t(g.batch), std::size_t(pr), std::size_t(pc)});
    im2col(s, x.data(), g, col.data());  // recomputed: the columns are kh·kw times the input
    // Per image dW_n = dY_n·col_nᵀ, then a fixed-order sum over the images (no atomics:
    // the same bits every run).
    device_tensor per_image(s, {std::size_t(g.batch), std::size_t(k * pr)});
    gemm_strided_batched(s, transpose::no, transpose::yes, int(k), int(pr), int(pc), 1.0f, dy.data(), int(pc), k * pc,
                         col.data(), int(pc), pr * pc, 0.0f, per_image.data(), int(pr), k * pr, g.batch);
    column_sums(s, per_image.data(), std::size_t(g.batch), std::size_t(k * pr), p_.w.grad.data(), 1.0f);
    if (!p_.b.empty()) {
      device_tensor pixel_sums(s, {std::size_t(k * pc)});
      column_sums(s, dy.data(), std::size_t(g.batch), std::size_t(k * pc), pixel_sums.data(), 0.0f);
      ensure_ones(s, std::size_t(pc));
      gemm(s, transpose::no, transpose::no, int(k), 1, int(pc), 1.0f, pixel_sums.data(), int(pc), ones_.data(), 1, 1.0f,
           p_.b[0].grad.data(), 1);
    }
  }
  std::vector<device_parameter> parameters() override { return p_.parameters(); }

 private:
  window_geometry geometry(const shape_t& x) const {
    return window_of(x, int(o_.kernel[0]), int(o_.kernel[1]), int(o_.padding[0]), int(o_.padding[1]), int(o_.stride[0]),
                     int(o_.stride[1]));
  }
  void ensure_ones(stream& s, std::size_t n) {
    if (ones_.size() >= n) return;
    ones_ = device_tensor(s, {n});
    fill(s, n, 1.0f, ones_.data());
  }

  layers::conv2d_options o_;
  weight_and_bias p_;
  device_tensor ones_;
};

// ---- pooling ------------------------------------------------------------------
class pool_layer final : public unary_layer {
 public:
  pool_layer(bool max, const layers::pool2d_options& o) : max_(max), o_(o) {}
  std::string_view kind() const noexcept override { return max_ ? "MaxPool2d" : "AvgPool2d"; }
  shape_t output_shape(std::span<const shape_t> in) const override {
    const auto& x = in[0];
    if (x.size() != 4) bad_shape(kind(), x, "[N, C, H, W]");
    const auto g = geometry(x);
    if (g.out_h() < 1 || g.out_w() < 1) bad_shape(kind(), x, "an image no smaller than the window");
    return {x[0], x[1], std::size_t(g.out_h()), std::size_t(g.out_w())};
  }
  void compute(stream& s, const device_tensor& x, device_tensor& y, device_stash& st) override {
    const auto g = geometry(x.shape());
    if (max_) {
      st.indices = device_buffer(s, std::max<std::size_t>(1, y.size()) * sizeof(std::int32_t));
      max_pool_forward(s, x.data(), g, y.data(), static_cast<std::int32_t*>(st.indices.data()));
    } else {
      avg_pool_forward(s, x.data(), g, y.data());
    }
  }
  void input_gradient(stream& s, const device_stash& st, const device_tensor& dy, device_tensor& dx) override {
    const auto g = geometry(dx.shape());
    if (max_)
      max_pool_backward(s, dy.data(), static_cast<const std::int32_t*>(st.indices.data()), g, dx.data());
    else
      avg_pool_backward(s, dy.data(), g, dx.data());
  }

 private:
  window_geometry geometry(const shape_t& x) const {
    const int k = int(o_.kernel), stride = int(o_.stride ? o_.stride : o_.kernel), pad = int(o_.padding);
    return window_of(x, k, k, pad, pad, stride, stride);
  }
  bool max_;
  layers::pool2d_options o_;
};

/// Copies the parameters (or, `grads`, their gradients) between `dev` and `cpu`, then waits.
void transfer(stream& s, device_layer& dev, cpu_layer& cpu, bool to_device, bool grads) {
  auto dp = dev.parameters();
  auto cp = cpu.parameters();
  if (dp.size() != cp.size())
    throw error(errc::invalid_argument, cpu.label() + ": " + std::to_string(cp.size()) + " parameters on the CPU, " +
                                            std::to_string(dp.size()) + " on the device");
  for (std::size_t i = 0; i < dp.size(); ++i) {
    device_tensor& d = grads ? *dp[i].grad : *dp[i].value;
    auto& h = grads ? *cp[i].grad : *cp[i].value;
    if (std::size_t(h.size()) != d.size())
      throw error(errc::invalid_argument, cpu.label() + "." + cp[i].name + ": " + std::to_string(h.size()) +
                                              " values on the CPU, " + std::to_string(d.size()) + " on the device");
    if (to_device)
      copy_async(s, d.data(), h.data(), d.bytes());
    else
      copy_async(s, h.data(), d.data(), d.bytes());
  }
  s.synchronize();  // pageable host memory: done before the caller touches it
}


}  // namespace

std::unique_ptr<device_layer> make_device_layer(stream& s, cpu_layer& cpu) {
  std::unique_ptr<device_layer> d;
  if (auto* l = dynamic_cast<layers::basic_linear<float>*>(&cpu))
    d = std::make_unique<linear_layer>(s, std::size_t(l->in_features()), std::size_t(l->out_features()), l->has_bias());
  else if (auto* c = dynamic_cast<layers::basic_conv2d<float>*>(&cpu))
    d = std::make_unique<conv2d_layer>(s, c->options());
  else if (auto* mp = dynamic_cast<layers::basic_max_pool2d<float>*>(&cpu))
    d = std::make_unique<pool_layer>(true, mp->options());
  else if (auto* ap = dynamic_cast<layers::basic_avg_pool2d<float>*>(&cpu))
    d = std::make_unique<pool_layer>(false, ap->options());
  else
    throw error(errc::not_supported, cpu.label() + ": no GPU twin for " + std::string(cpu.kind()));
  transfer(s, *d, cpu, true, false);
  return d;
}

void download_parameters(stream& s, device_layer& dev, cpu_layer& cpu) { transfer(s, dev, cpu, false, false); }
void download_gradients(stream& s, device_layer& dev, cpu_layer& cpu) { transfer(s, dev, cpu, false, true); }

device_tensor upload(stream& s, const float* host, shape_t shape) {
  device_tensor t(s, std::move(shape));
  copy_async(s, t.data(), host, t.bytes());
  s.synchronize();
  return t;
}

std::vector<float> download(stream& s, const device_tensor& t) {
  std::vector<float> v(t.size());
  copy_async(s, v.data(), t.data(), t.bytes());
  s.synchronize();
  return v;
}

}  // namespace nerve::gpu

#pragma once
/// \file
/// `device_layer`: the math of one layer on a stream, the device-resident twin of
/// `layers::basic_layer<float>`. Tensors stay on the device; every call only
/// enqueues (cuBLAS and the kernels of gpu/kernels.hpp), so a caller learns of
/// completion through `stream::async_wait` on its own loop.
///
/// ```
///   layers::linear (Eigen, CPU) ──make_device_layer──► device_layer (cuBLAS, one stream)
///        parameters ──upload (setup)──►  device parameters ──download (end)──► checkpoint
/// ```
///
/// Covered: Linear (cuBLAS through the row-major transpose identity), Conv2d (im2col +
/// strided-batched cuBLAS), MaxPool2d, AvgPool2d: the built-in layers not yet written
/// with ops (layers/ops.hpp, which need no twin). Anything else throws `errc::not_supported`
/// naming the layer. Compiles without CUDA headers.

#include "gpu/memory.hpp"

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace nerve::layers {
template <class Scalar>
class basic_layer;
}

namespace nerve::gpu {

/// What forward leaves for backward of one micro-batch. The inputs and the
/// output are the caller's tensors (a network keeps every node's output until its
/// backward); they must stay where they are until backward has been enqueued.
struct device_stash {
  std::vector<const device_tensor*> inputs;
  const device_tensor* output = nullptr;
  /// Integer side data (max-pool arg-max), device memory.
  device_buffer indices;
};

/// `wanted` of `backward_input`: every input wants its gradient.
inline constexpr std::uint64_t all_inputs = ~std::uint64_t{0};

/// A trainable tensor on the device and its gradient, with the CPU layer's name.
struct device_parameter {
  std::string name;  ///< "weight", "bias"
  device_tensor* value = nullptr;
  device_tensor* grad = nullptr;
};

/// One layer on a device. Calls enqueue on the stream they are given and return
/// at once; one thread (the owning actor's loop) at a time.
class device_layer {
 public:
  virtual ~device_layer() = default;
  /// The CPU layer's kind: "Linear", "Conv2d", ...
  virtual std::string_view kind() const noexcept = 0;
  /// The output shape (batch first) for these input shapes.
  virtual shape_t output_shape(std::span<const shape_t> inputs) const = 0;
  /// Forward: fills `out` (allocated here on `s`), keeps what backward needs in `stash`
  /// (pointers to `inputs` and `out`, which must not move until backward).
  virtual void forward(stream& s, std::span<const device_tensor* const> inputs, device_tensor& out,
                       device_stash& stash) = 0;
  /// B: gradients of the inputs whose bit is set in `wanted` (others come back empty).
  virtual std::vector<device_tensor> backward_input(stream& s, const device_stash& stash, const device_tensor& dy,
                                                    std::uint64_t wanted) = 0;
  /// W: adds this micro-batch's parameter gradients to the `grad` tensors.
  virtual void backward_weight(stream& s, const device_stash& stash, const device_tensor& dy) {}
  /// Parameters in the CPU layer's `parameters()` order.
  virtual std::vector<device_parameter> parameters() { return {}; }
};

/// The device twin of `cpu` with parameters (and zeroed gradients) allocated on `s`
/// and copied from the CPU layer. Setup: it synchronizes `s`, never call it on a
/// loop. Throws `gpu::error` (`errc::not_supported`) for a layer without a twin.
std::unique_ptr<device_layer> make_device_layer(stream& s, layers::basic_layer<float>& cpu);

/// Copies the parameters of `dev` into `cpu` (device → host) and waits. Not on a loop.
void download_parameters(stream& s, device_layer& dev, layers::basic_layer<float>& cpu);
/// As above for the gradients (tests).
void download_gradients(stream& s, device_layer& dev, layers::basic_layer<float>& cpu);

/// A tensor of `shape` on `s` filled from host memory (copied through the stream,
/// then waited for: setup and tests).
device_tensor upload(stream& s, const float* host, shape_t shape);
/// The contents of `t` on the host (waits: not on a loop).
std::vector<float> download(stream& s, const device_tensor& t);

}  // namespace nerve::gpu

#pragma once
/// \file
/// `device_parameters`: the trainable tensors of some device layers with their optimizer
/// state, and the update that steps them — what a device network and a device pipeline
/// stage both step, written once.
///
/// ```
///   layers' device_parameter (value, grad) ──add──► entry {name "fc1.weight", velocity | m, v, t}
///   step(lr) ──► sgd_update / adam_update on the stream, in the order they were added
///   state() ──download──► layers::optimizer_state (checkpoints) ──load──► upload
/// ```
/// The update rules are PyTorch's (SGD with momentum, Nesterov and weight decay; Adam;
/// AdamW), the same as `layers::basic_sgd` / `basic_adam` on the CPU.
///
/// Thread safety: none; one owner (a network's or a stage's loop) at a time. `state` and
/// `load` wait for the stream: not on a loop.

#include "gpu/memory.hpp"
#include "layers/optimizer.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace nerve::gpu {

/// A trainable tensor on the device and its gradient, with the CPU layer's name.
struct device_parameter {
  std::string name;  ///< "weight", "bias"
  device_tensor* value = nullptr;
  device_tensor* grad = nullptr;
};

/// A tensor of `shape` on `s` filled from host memory (copied through the stream,
/// then waited for: setup and tests).
device_tensor upload(stream& s, const float* host, shape_t shape);
/// The contents of `t` on the host (waits: not on a loop).
std::vector<float> download(stream& s, const device_tensor& t);

/// The optimizer a device network or stage runs (the trainer's `--optimizer` names).
struct device_optimizer {
  std::string kind = "sgd";  ///< sgd, adam, adamw
  double lr = 0.01;          ///< default rate; each step may give its own
  double momentum = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
};

class device_parameters {
 public:
  /// Throws `gpu::error` (`invalid_argument`) for an optimizer kind other than sgd, adam, adamw.
  explicit device_parameters(device_optimizer opt);

  /// Adds `p` under the graph's name for it (`fc1.weight`), with zeroed optimizer buffers on `s`.
  void add(stream& s, std::string name, device_parameter p);
  /// Enqueues zeroing every gradient on `s`.
  void zero_grad(stream& s);
  /// Enqueues one update of every parameter on `s` at `lr` (negative: the optimizer's rate).
  void step(stream& s, double lr);

  /// The optimizer's buffers in PyTorch's names (`momentum_buffer`, `exp_avg`, `exp_avg_sq`)
  /// and Adam's step counts (`<parameter>.step`). Waits for `s`.
  layers::basic_optimizer_state<float> state(stream& s);
  /// Replaces the buffers and counts with `st` (as `state` made it). Waits for `s`. Throws
  /// `std::invalid_argument` naming a buffer this optimizer does not keep.
  void load(stream& s, const layers::basic_optimizer_state<float>& st);

 private:
  struct entry {
    std::string name;
    device_parameter p;
    device_tensor velocity, m, v;
    std::int64_t t = 0;
  };
  device_optimizer opt_;
  std::vector<entry> params_;
};

}  // namespace nerve::gpu

#pragma once
/// \file
/// Optimizers with PyTorch's update rules: SGD (momentum, Nesterov, weight decay), Adam, AdamW.

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "layers/layer.hpp"

namespace nerve::layers {

/// What an optimizer carries from step to step, for a checkpoint: per parameter (by the
/// name it was stepped under) its buffers in PyTorch's names (`momentum_buffer`,
/// `exp_avg`, `exp_avg_sq`), flat in the parameter's layout, and integer counters
/// (`steps`, `<parameter>.step`).
template <class Scalar>
struct basic_optimizer_state {
  struct buffer {
    std::string parameter;
    std::string name;
    std::vector<Scalar> values;
  };
  std::vector<buffer> buffers;
  std::map<std::string, std::int64_t, std::less<>> counters;
};

/// Updates parameters from their accumulated gradients.
///
/// State (momentum, moments) is kept per parameter name, so the same optimizer
/// serves a graph's `parameters()` list step after step, and a pipeline stage
/// can own an optimizer over just its own parameters. Scalars (lr, betas, …)
/// are doubles and rounded to the parameter's scalar type where PyTorch does.
/// Not thread-safe: one caller at a time.
template <class Scalar>
class basic_optimizer {
 public:
  using parameter_ref = basic_parameter_ref<Scalar>;
  virtual ~basic_optimizer() = default;
  virtual std::string_view kind() const noexcept = 0;

  /// One update of every parameter in `params`; gradients are read, not cleared.
  void step(std::span<const parameter_ref> params) {
    ++steps_;
    for (const auto& p : params) update(p);
  }
  /// Learning rate for the next steps (a schedule sets it before each step).
  double lr() const noexcept { return lr_; }
  void set_lr(double lr) noexcept { lr_ = lr; }
  /// Steps taken so far.
  std::int64_t steps() const noexcept { return steps_; }

  /// Appends the state to `out` (checkpoints). One caller at a time, between steps.
  virtual void save_state(basic_optimizer_state<Scalar>& out) const { out.counters["steps"] = steps_; }
  /// Replaces the state with `in` (as `save_state` wrote it); `params` give the buffers'
  /// shapes. Throws `std::invalid_argument` naming a buffer whose parameter is not in
  /// `params` or whose size differs.
  virtual void load_state(const basic_optimizer_state<Scalar>& in, std::span<const parameter_ref> params) {
    auto it = in.counters.find("steps");
    steps_ = it == in.counters.end() ? 0 : it->second;
  }

 protected:
  explicit basic_optimizer(double lr) : lr_(lr) {}
  virtual void update(const parameter_ref& p) = 0;

 private:
  double lr_;
  std::int64_t steps_ = 0;
};

/// `torch.optim.SGD` options.
struct sgd_options {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

/// `torch.optim.SGD`: g ← g + wd·p; with momentum, b ← g on the first step and
/// b ← μ·b + (1−dampening)·g afterwards; g ← g + μ·b (Nesterov) or g ← b; p ← p − lr·g.
template <class Scalar>
class basic_sgd final : public basic_optimizer<Scalar> {
 public:
  using typename basic_optimizer<Scalar>::parameter_ref;
  explicit basic_sgd(sgd_options options = {});
  std::string_view kind() const noexcept override { return "SGD"; }
  const sgd_options& options() const noexcept { return o_; }
  void save_state(basic_optimizer_state<Scalar>& out) const override;
  void load_state(const basic_optimizer_state<Scalar>& in, std::span<const parameter_ref> params) override;

 protected:
  void update(const parameter_ref& p) override;

 private:
  sgd_options o_;
  std::unordered_map<std::string, basic_tensor<Scalar>> momentum_;
};

/// `torch.optim.Adam` / `AdamW` options.
struct adam_options {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

/// `torch.optim.Adam` (weight decay as L2 added to the gradient) or, with
/// `decoupled = true`, `torch.optim.AdamW` (p ← p·(1 − lr·wd) before the step).
/// m ← β₁m + (1−β₁)g; v ← β₂v + (1−β₂)g²; p ← p − (lr/(1−β₁ᵗ))·m / (√v/√(1−β₂ᵗ) + ε),
/// t counted per parameter as PyTorch does.
template <class Scalar>
class basic_adam : public basic_optimizer<Scalar> {
 public:
  using typename basic_optimizer<Scalar>::parameter_ref;
  explicit basic_adam(adam_options options = {}, bool decoupled = false);
  std::string_view kind() const noexcept override { return decoupled_ ? "AdamW" : "Adam"; }
  const adam_options& options() const noexcept { return o_; }
  void save_state(basic_optimizer_state<Scalar>& out) const override;
  void load_state(const basic_optimizer_state<Scalar>& in, std::span<const parameter_ref> params) override;

 protected:
  void update(const parameter_ref& p) override;

 private:
  struct moments {
    basic_tensor<Scalar> m, v;
    std::int64_t t = 0;
  };
  adam_options o_;
  bool decoupled_;
  std::unordered_map<std::string, moments> state_;
};

/// `torch.optim.AdamW` (default weight decay 0.01 as in PyTorch).
template <class Scalar>
class basic_adamw final : public basic_adam<Scalar> {
 public:
  explicit basic_adamw(adam_options options = {0.001, 0.9, 0.999, 1e-8, 0.01}) : basic_adam<Scalar>(options, true) {}
};

/// Makes an optimizer by name: `sgd` (uses `lr`, `momentum`, `weight_decay`, `nesterov`),
/// `adam`, `adamw` (`lr` and `weight_decay` as given: 0 is no decay, also for AdamW; PyTorch's
/// defaults are `preset_defaults`'s). Throws `std::invalid_argument` for an unknown name.
template <class Scalar>
std::unique_ptr<basic_optimizer<Scalar>> make_optimizer(std::string_view name, double lr, double momentum = 0.0,
                                                        double weight_decay = 0.0, bool nesterov = false);

using optimizer = basic_optimizer<float>;
using optimizer_state = basic_optimizer_state<float>;
using sgd = basic_sgd<float>;
using adam = basic_adam<float>;
using adamw = basic_adamw<float>;

}  // namespace nerve::layers

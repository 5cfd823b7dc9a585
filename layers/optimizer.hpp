#pragma once
/// \file
/// Optimizers with PyTorch's update rules: SGD (momentum, Nesterov, weight decay), Adam, AdamW,
/// written once for every backend with the op set's update ops (layers/ops.hpp).

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "layers/layer.hpp"
#include "layers/ops.hpp"

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

/// Updates parameters from their accumulated gradients, written once for every backend:
/// the update is an op of the parameters' op set (`basic_op_set::sgd_update`,
/// `adam_update`), and the state (momentum, moments) is arrays of that set, so the same
/// optimizer steps host tensors on the CPU and a device's parameters on its stream.
///
/// State is kept per parameter name, so the same optimizer serves a graph's
/// `parameters()` list step after step, and a pipeline stage can own an optimizer over
/// just its own parameters. Scalars (lr, betas, …) are doubles and rounded to the
/// parameter's scalar type where PyTorch does. An optimizer keeps its state on the op set
/// of its first step (or `load_state`). Not thread-safe: one caller at a time.
template <class Scalar>
class basic_optimizer {
 public:
  using parameter_ref = basic_parameter_ref<Scalar>;
  using array = basic_array<Scalar>;
  /// A parameter in an op set's memory: its values and gradient, the name it is stepped
  /// under (`fc1.weight`); `value.dims` give its shape.
  struct parameter {
    std::string name;
    array value, grad;
  };
  virtual ~basic_optimizer() = default;
  virtual std::string_view kind() const noexcept = 0;

  /// One update of every parameter in `params`, on `set` (which holds them); gradients
  /// are read, not cleared. Throws `std::logic_error` when the state is on another set.
  void step(basic_op_set<Scalar>& set, std::span<const parameter> params) {
    use(set);
    ++steps_;
    for (const auto& p : params) update(set, p);
  }
  /// The same for host tensors, on the CPU's op set.
  void step(std::span<const parameter_ref> params);
  /// Learning rate for the next steps (a schedule sets it before each step).
  double lr() const noexcept { return lr_; }
  void set_lr(double lr) noexcept { lr_ = lr; }
  /// Steps taken so far.
  std::int64_t steps() const noexcept { return steps_; }

  /// Appends the state to `out` (checkpoints), read from its op set (a device's waits).
  /// One caller at a time, between steps, off the loops.
  virtual void save_state(basic_optimizer_state<Scalar>& out) const { out.counters["steps"] = steps_; }
  /// Replaces the state with `in` (as `save_state` wrote it), in `set`'s memory; `params`
  /// give the buffers' shapes. Throws `std::invalid_argument` naming a buffer whose
  /// parameter is not in `params` or whose size differs.
  virtual void load_state(const basic_optimizer_state<Scalar>& in, basic_op_set<Scalar>& set,
                          std::span<const parameter> params) {
    use(set);
    auto it = in.counters.find("steps");
    steps_ = it == in.counters.end() ? 0 : it->second;
  }
  /// The same for host tensors, on the CPU's op set.
  void load_state(const basic_optimizer_state<Scalar>& in, std::span<const parameter_ref> params);

 protected:
  explicit basic_optimizer(double lr) : lr_(lr) {}
  virtual void update(basic_op_set<Scalar>& set, const parameter& p) = 0;
  /// Whether any state is kept (it then lives on `set_`).
  virtual bool has_state() const noexcept = 0;
  /// A new state array shaped like `p`, on `set`, from `values` (empty: zeros); throws
  /// naming the buffer when the sizes differ.
  static array state_like(basic_op_set<Scalar>& set, const parameter& p, const std::string& buffer,
                          const std::vector<Scalar>& values);
  /// `a`'s values on the host.
  std::vector<Scalar> host_values(const array& a) const;

 private:
  void use(basic_op_set<Scalar>& set);
  double lr_;
  std::int64_t steps_ = 0;
  basic_op_set<Scalar>* set_ = nullptr;  // where the state lives
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
  using basic_optimizer<Scalar>::load_state;
  void save_state(basic_optimizer_state<Scalar>& out) const override;
  void load_state(const basic_optimizer_state<Scalar>& in, basic_op_set<Scalar>& set,
                  std::span<const typename basic_optimizer<Scalar>::parameter> params) override;

 protected:
  void update(basic_op_set<Scalar>& set, const typename basic_optimizer<Scalar>::parameter& p) override;
  bool has_state() const noexcept override { return !momentum_.empty(); }

 private:
  sgd_options o_;
  std::unordered_map<std::string, basic_array<Scalar>> momentum_;
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
  using basic_optimizer<Scalar>::load_state;
  void save_state(basic_optimizer_state<Scalar>& out) const override;
  void load_state(const basic_optimizer_state<Scalar>& in, basic_op_set<Scalar>& set,
                  std::span<const typename basic_optimizer<Scalar>::parameter> params) override;

 protected:
  void update(basic_op_set<Scalar>& set, const typename basic_optimizer<Scalar>::parameter& p) override;
  bool has_state() const noexcept override { return !state_.empty(); }

 private:
  struct moments {
    basic_array<Scalar> m, v;
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
/// `adam`, `adamw` (`lr`, `weight_decay` and `beta2` as given: 0 is no decay, also for AdamW;
/// PyTorch's defaults are `preset_defaults`'s; β₁ is 0.9). Throws `std::invalid_argument`
/// for an unknown name.
template <class Scalar>
std::unique_ptr<basic_optimizer<Scalar>> make_optimizer(std::string_view name, double lr, double momentum = 0.0,
                                                        double weight_decay = 0.0, bool nesterov = false,
                                                        double beta2 = 0.999);

using optimizer = basic_optimizer<float>;
/// Makes one optimizer per layer actor (each layer steps its own parameters, on whichever
/// backend runs it).
using optimizer_factory = std::function<std::unique_ptr<optimizer>()>;
using optimizer_state = basic_optimizer_state<float>;
using sgd = basic_sgd<float>;
using adam = basic_adam<float>;
using adamw = basic_adamw<float>;

}  // namespace nerve::layers

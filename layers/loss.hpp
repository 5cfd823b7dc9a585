#pragma once
/// \file
/// Losses: softmax + cross-entropy and mean squared error, mean-reduced as in PyTorch,
/// written once with ops (layers/ops.hpp), so every backend runs them: the CPU through
/// `forward`/`backward` on host tensors, a device with its own op set.

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "layers/layer.hpp"
#include "layers/ops.hpp"

namespace nerve::layers {

/// What a loss compares the prediction with: class labels (cross-entropy) or
/// target values (MSE). A value type owned by the caller.
template <class Scalar>
struct basic_targets {
  std::vector<std::int32_t> labels;
  basic_tensor<Scalar> values;
  /// Labels per sample, one after the other: 1 (a class per sample), or T for a
  /// sequence's tokens (`[B, T]` labels, row-major, for a `[B, T, vocab]` prediction).
  std::int64_t labels_per_sample = 1;

  /// Number of samples described (labels or rows of values).
  std::int64_t size() const noexcept {
    return labels.empty() ? values.batch() : static_cast<std::int64_t>(labels.size()) / labels_per_sample;
  }
  /// An explicit deep copy (like `basic_tensor::clone`).
  basic_targets clone() const { return slice(0, size()); }

  /// Samples `[first, first + count)` (a micro-batch), copied.
  basic_targets slice(std::int64_t first, std::int64_t count) const {
    basic_targets t;
    t.labels_per_sample = labels_per_sample;
    if (!labels.empty())
      t.labels.assign(labels.begin() + first * labels_per_sample, labels.begin() + (first + count) * labels_per_sample);
    if (!values.empty()) t.values = values.slice(first, count);
    return t;
  }
};

/// A loss on one micro-batch.
///
/// `forward` gives the loss averaged over the micro-batch. `backward(stash,
/// scale)` gives `scale · d(loss)/d(prediction)`. When a mini-batch of N samples
/// is split into micro-batches of nᵢ samples, the mini-batch loss (the mean over
/// all N) is Σ (nᵢ/N)·lossᵢ, so each micro-batch's backward takes
/// `scale = nᵢ / N`; the accumulated parameter gradients then equal one
/// backward over the whole mini-batch. Stateless: any number of micro-batches
/// may be in flight. A loss written with ops (`basic_op_loss`) runs on every
/// backend; one that overrides `forward`/`backward` itself runs on the CPU only.
template <class Scalar>
class basic_op_loss;

template <class Scalar>
class basic_loss {
 public:
  using tensor_type = basic_tensor<Scalar>;
  using stash_type = basic_stash<Scalar>;
  using targets_type = basic_targets<Scalar>;

  struct result {
    /// Mean loss over the micro-batch (accumulated in double).
    double loss = 0;
    /// Samples whose arg-max prediction equals the label (cross-entropy; 0 for MSE).
    std::int64_t correct = 0;
    stash_type stash;
  };

  virtual ~basic_loss() = default;
  virtual std::string_view kind() const noexcept = 0;
  virtual result forward(const tensor_type& prediction, const targets_type& target) const = 0;
  virtual tensor_type backward(const stash_type& saved, Scalar scale = Scalar(1)) const = 0;
  /// This loss as one written with ops (every backend runs it), or null.
  virtual const basic_op_loss<Scalar>* as_op_loss() const noexcept { return nullptr; }
};

/// A micro-batch's targets in an op set's memory (what a backend staged): class labels,
/// or values shaped like the prediction. `host_labels` are the labels as given (the
/// checks read them on the host).
template <class Scalar>
struct basic_op_targets {
  const std::int32_t* labels = nullptr;
  std::span<const std::int32_t> host_labels;
  basic_array<Scalar> values;
};

/// What a loss's forward on ops leaves: the loss is Σ `terms` (summed in double, in
/// order, on the host) / `divisor`; `correct` holds one value, the samples whose arg-max
/// is their label (empty where the loss has no classes); `stash` is what backward reads.
template <class Scalar>
struct basic_op_loss_run {
  basic_array<Scalar> terms;
  double divisor = 1;
  basic_array<Scalar> correct;
  std::vector<basic_array<Scalar>> stash;
};

/// A loss written once with ops: the CPU runs `compute` and `gradient` on its op set
/// through `forward`/`backward`, a device backend on its own.
template <class Scalar>
class basic_op_loss : public basic_loss<Scalar> {
 public:
  using array = basic_array<Scalar>;
  using run_type = basic_op_loss_run<Scalar>;
  using typename basic_loss<Scalar>::tensor_type;
  using typename basic_loss<Scalar>::stash_type;
  using typename basic_loss<Scalar>::targets_type;
  using typename basic_loss<Scalar>::result;

  /// The forward on `set`: `prediction` and `target` are in its memory. Throws
  /// `std::invalid_argument` for a target that does not fit the prediction.
  virtual run_type compute(basic_op_set<Scalar>& set, const array& prediction,
                           const basic_op_targets<Scalar>& target) const = 0;
  /// `scale · d(loss)/d(prediction)` from `run` (as `compute` left it), fresh memory.
  virtual array gradient(basic_op_set<Scalar>& set, const run_type& run, const basic_op_targets<Scalar>& target,
                         Scalar scale) const = 0;

  result forward(const tensor_type& prediction, const targets_type& target) const final;
  tensor_type backward(const stash_type& saved, Scalar scale = Scalar(1)) const final;
  const basic_op_loss<Scalar>* as_op_loss() const noexcept final { return this; }
};

/// Softmax followed by the negative log-likelihood of the labels
/// (`nn.CrossEntropyLoss()`, mean reduction), computed stably with the
/// log-sum-exp shift. Prediction `[K]` per sample, labels in [0, K); or `[T, K]` per
/// sample with a label per token (`targets::labels_per_sample` T), every token a row
/// and the loss the mean over all of them, as PyTorch's
/// `F.cross_entropy(logits.view(-1, K), y.view(-1))`; `correct` counts tokens then.
/// The stash holds the softmax probabilities.
template <class Scalar>
class basic_cross_entropy final : public basic_op_loss<Scalar> {
 public:
  using typename basic_op_loss<Scalar>::array;
  using typename basic_op_loss<Scalar>::run_type;
  std::string_view kind() const noexcept override { return "CrossEntropyLoss"; }
  run_type compute(basic_op_set<Scalar>& set, const array& logits,
                   const basic_op_targets<Scalar>& target) const override;
  array gradient(basic_op_set<Scalar>& set, const run_type& run, const basic_op_targets<Scalar>& target,
                 Scalar scale) const override;
};

/// Mean squared error over every element (`nn.MSELoss()`): Σ(y − t)² / (N·F).
template <class Scalar>
class basic_mse final : public basic_op_loss<Scalar> {
 public:
  using typename basic_op_loss<Scalar>::array;
  using typename basic_op_loss<Scalar>::run_type;
  std::string_view kind() const noexcept override { return "MSELoss"; }
  run_type compute(basic_op_set<Scalar>& set, const array& prediction,
                   const basic_op_targets<Scalar>& target) const override;
  array gradient(basic_op_set<Scalar>& set, const run_type& run, const basic_op_targets<Scalar>& target,
                 Scalar scale) const override;
};

using targets = basic_targets<float>;
using loss = basic_loss<float>;
using op_loss = basic_op_loss<float>;
using op_targets = basic_op_targets<float>;
using cross_entropy = basic_cross_entropy<float>;
using mse = basic_mse<float>;

}  // namespace nerve::layers

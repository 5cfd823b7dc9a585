#pragma once
/// \file
/// Losses: softmax + cross-entropy and mean squared error, mean-reduced as in PyTorch.

#include <cstdint>
#include <string_view>
#include <vector>

#include "layers/layer.hpp"

namespace nerve::layers {

/// What a loss compares the prediction with: class labels (cross-entropy) or
/// target values (MSE). A value type owned by the caller.
template <class Scalar>
struct basic_targets {
  std::vector<std::int32_t> labels;
  basic_tensor<Scalar> values;

  /// Number of samples described (labels or rows of values).
  std::int64_t size() const noexcept {
    return labels.empty() ? values.batch() : static_cast<std::int64_t>(labels.size());
  }
  /// An explicit deep copy (like `basic_tensor::clone`).
  basic_targets clone() const { return slice(0, size()); }

  /// Samples `[first, first + count)` (a micro-batch), copied.
  basic_targets slice(std::int64_t first, std::int64_t count) const {
    basic_targets t;
    if (!labels.empty()) t.labels.assign(labels.begin() + first, labels.begin() + first + count);
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
/// may be in flight.
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
};

/// Softmax followed by the negative log-likelihood of the labels
/// (`nn.CrossEntropyLoss()`, mean reduction), computed stably with the
/// log-sum-exp shift. Prediction `[K]` per sample, labels in [0, K).
/// The stash holds the softmax probabilities and the labels.
template <class Scalar>
class basic_cross_entropy final : public basic_loss<Scalar> {
 public:
  using typename basic_loss<Scalar>::tensor_type;
  using typename basic_loss<Scalar>::stash_type;
  using typename basic_loss<Scalar>::targets_type;
  using typename basic_loss<Scalar>::result;

  std::string_view kind() const noexcept override { return "CrossEntropyLoss"; }
  result forward(const tensor_type& logits, const targets_type& target) const override;
  tensor_type backward(const stash_type& saved, Scalar scale = Scalar(1)) const override;
};

/// Mean squared error over every element (`nn.MSELoss()`): Σ(y − t)² / (N·F).
template <class Scalar>
class basic_mse final : public basic_loss<Scalar> {
 public:
  using typename basic_loss<Scalar>::tensor_type;
  using typename basic_loss<Scalar>::stash_type;
  using typename basic_loss<Scalar>::targets_type;
  using typename basic_loss<Scalar>::result;

  std::string_view kind() const noexcept override { return "MSELoss"; }
  result forward(const tensor_type& prediction, const targets_type& target) const override;
  tensor_type backward(const stash_type& saved, Scalar scale = Scalar(1)) const override;
};

using targets = basic_targets<float>;
using loss = basic_loss<float>;
using cross_entropy = basic_cross_entropy<float>;
using mse = basic_mse<float>;

}  // namespace nerve::layers

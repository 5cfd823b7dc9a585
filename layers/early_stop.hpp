#pragma once
/// \file
/// `best_evaluation`: the trainer's record of its best evaluation, behind
/// `train_options::early_stop` (stop when the figure has not improved for PATIENCE
/// evaluations) and `train_options::save_best` (the weights of the best one so far).
///
/// The figure is the test set's loss, lower is better: the apps have no validation split
/// of their own, and the loss moves before the accuracy does. An evaluation improves on
/// the best when its loss is strictly below it (a tie keeps the earlier weights); a
/// non-finite loss never improves.

#include <cmath>
#include <optional>

namespace nerve::layers {

/// The best evaluation so far and the evaluations since. A value; one thread (the trainer's).
class best_evaluation {
 public:
  /// `patience`: evaluations without improvement that end the run (none: never ends it).
  explicit best_evaluation(std::optional<int> patience = std::nullopt) : patience_(patience) {}

  /// Takes evaluation `epoch`'s test loss. True when it is the best so far.
  bool add(int epoch, double test_loss) {
    if (std::isfinite(test_loss) && (best_epoch_ == 0 || test_loss < best_loss_)) {
      best_loss_ = test_loss;
      best_epoch_ = epoch;
      since_ = 0;
      return true;
    }
    ++since_;
    return false;
  }
  /// The run should stop: `patience` evaluations in a row did not improve on the best.
  bool exhausted() const noexcept { return patience_ && since_ >= *patience_; }
  /// The epoch of the best evaluation (0: none yet) and its loss.
  int best_epoch() const noexcept { return best_epoch_; }
  double best_loss() const noexcept { return best_loss_; }
  /// Evaluations since the best.
  int since_best() const noexcept { return since_; }

 private:
  std::optional<int> patience_;
  int best_epoch_ = 0, since_ = 0;
  double best_loss_ = 0;
};

}  // namespace nerve::layers

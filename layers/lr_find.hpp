#pragma once
/// \file
/// The learning-rate range test (`train_options::lr_find`, `nerve-train --lr-find`): the
/// rate rises geometrically from `min_lr` to `max_lr` over `steps` optimizer steps, one
/// batch each, and the run stops early once the loss diverges. The losses against the
/// rates say which rates train: `lr_finder::suggestion` picks a tenth of the rate at the
/// lowest loss (where the loss still falls steadily, below the edge of divergence).

#include <cstdint>
#include <string>
#include <vector>

namespace nerve::layers {

/// The range of a learning-rate range test.
struct lr_range {
  double min_lr = 1e-7;  ///< the first step's rate, above 0
  double max_lr = 10;    ///< the last step's rate, above `min_lr`
  std::int64_t steps = 100;  ///< steps from `min_lr` to `max_lr`, at least 2
  /// The run stops at the first step whose loss is more than this times the lowest so far
  /// (or not finite); above 1.
  double divergence = 4;
};

/// Step `t`'s rate (t from 0 to `steps - 1`): `min_lr · (max_lr / min_lr)^(t / (steps - 1))`,
/// so step 0 takes `min_lr` and the last `max_lr`.
double lr_range_rate(const lr_range& range, std::int64_t t);

/// Refuses a range out of its bounds (`std::invalid_argument` naming `--lr-find` and the value).
void check_lr_range(const lr_range& range);

/// One step of the test: its rate and its batch's loss.
struct lr_point {
  double lr = 0;
  double loss = 0;
};

/// What a range test found.
struct lr_find_result {
  std::vector<lr_point> points;  ///< every step taken, the diverging one included
  bool diverged = false;         ///< it stopped on divergence before its last step
  double suggested_lr = 0;       ///< a tenth of the rate at the lowest loss (0: no finite loss)
  double min_loss_lr = 0;        ///< the rate at the lowest loss
};

/// Follows a range test step by step. One thread (the trainer's).
class lr_finder {
 public:
  explicit lr_finder(lr_range range) : range_(range) {}
  /// Takes a step's rate and loss. False when the loss diverged: the run stops.
  bool add(double lr, double loss);
  const lr_find_result& result() const noexcept { return result_; }
  const lr_range& range() const noexcept { return range_; }

 private:
  lr_range range_;
  lr_find_result result_;
  double best_ = 0;
  bool any_ = false;
};

}  // namespace nerve::layers

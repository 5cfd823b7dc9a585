#include "layers/lr_find.hpp"

#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace nerve::layers {

double lr_range_rate(const lr_range& r, std::int64_t t) {
  return r.min_lr * std::pow(r.max_lr / r.min_lr, double(t) / double(r.steps - 1));
}

void check_lr_range(const lr_range& r) {
  auto num = [](double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", v);
    return std::string(b);
  };
  // Written so that NaN fails every test.
  if (!(std::isfinite(r.min_lr) && r.min_lr > 0))
    throw std::invalid_argument("--lr-find: the lowest rate must be a finite number above 0 (got " + num(r.min_lr) + ")");
  if (!(std::isfinite(r.max_lr) && r.max_lr > r.min_lr))
    throw std::invalid_argument("--lr-find: the highest rate must be a finite number above the lowest " +
                                num(r.min_lr) + " (got " + num(r.max_lr) + ")");
  if (r.steps < 2) throw std::invalid_argument("--lr-find-steps must be at least 2 (got " + std::to_string(r.steps) + ")");
  if (!(std::isfinite(r.divergence) && r.divergence > 1))
    throw std::invalid_argument("--lr-find: the divergence factor must be a finite number above 1 (got " +
                                num(r.divergence) + ")");
}

bool lr_finder::add(double lr, double loss) {
  result_.points.push_back({lr, loss});
  if (!std::isfinite(loss) || (any_ && loss > range_.divergence * best_)) {
    result_.diverged = true;
    return false;
  }
  if (!any_ || loss < best_) {
    best_ = loss;
    any_ = true;
    result_.min_loss_lr = lr;
    result_.suggested_lr = lr / 10;
  }
  return true;
}

}  // namespace nerve::layers

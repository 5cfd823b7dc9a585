#pragma once
/// \file
/// Learning-rate schedules as pure functions of the step (or epoch) count.

#include <cmath>
#include <cstdint>
#include <numbers>
#include <stdexcept>

namespace nerve::layers {

/// PyTorch's `StepLR`: lr = base · γ^⌊t / step_size⌋.
struct step_lr {
  double base_lr;
  std::int64_t step_size;
  double gamma = 0.1;
  double operator()(std::int64_t t) const {
    if (step_size <= 0) throw std::invalid_argument("step_lr: step_size must be positive");
    return base_lr * std::pow(gamma, double(t / step_size));
  }
};

/// PyTorch's `CosineAnnealingLR` in closed form:
/// lr = η_min + (base − η_min)·(1 + cos(π·t / T_max)) / 2, held at η_min after T_max.
struct cosine_lr {
  double base_lr;
  std::int64_t t_max;
  double eta_min = 0.0;
  double operator()(std::int64_t t) const {
    if (t_max <= 0) throw std::invalid_argument("cosine_lr: t_max must be positive");
    if (t >= t_max) return eta_min;
    return eta_min + (base_lr - eta_min) * (1 + std::cos(std::numbers::pi * double(t) / double(t_max))) / 2;
  }
};

}  // namespace nerve::layers

#pragma once
/// \file
/// Seeded parameter initialisation: PyTorch's default schemes on a documented RNG.
///
/// The generator is `std::mt19937_64` (fully specified by the C++ standard). A
/// uniform draw in [lo, hi) is `lo + (hi - lo) · u` with `u = (x >> 11) · 2⁻⁵³`
/// from one 64-bit output `x`, computed in double and rounded to the scalar, so
/// the values are bitwise reproducible from a seed on any standard library. They
/// follow PyTorch's distributions, not its random stream.

#include <cmath>
#include <cstdint>
#include <random>

#include "layers/tensor.hpp"

namespace nerve::layers {

/// A double in [0, 1) from one output of `rng`.
inline double uniform01(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

/// Fills `t` with uniform values in [-bound, bound), row-major order.
template <class Scalar>
void uniform_fill(basic_tensor<Scalar>& t, double bound, std::mt19937_64& rng) {
  Scalar* p = t.data();
  for (std::int64_t i = 0; i < t.size(); ++i) p[i] = static_cast<Scalar>(-bound + 2.0 * bound * uniform01(rng));
}

/// PyTorch's `kaiming_uniform_(w, a)` with fan-in mode and leaky-ReLU gain:
/// bound = sqrt(6 / ((1 + a²) · fan_in)). `nn.Linear` and `nn.Conv2d` use
/// a = sqrt(5), which gives bound = 1 / sqrt(fan_in).
template <class Scalar>
void kaiming_uniform(basic_tensor<Scalar>& w, std::int64_t fan_in, double a, std::mt19937_64& rng) {
  uniform_fill(w, std::sqrt(6.0 / ((1.0 + a * a) * static_cast<double>(fan_in))), rng);
}

/// PyTorch's default layer initialisation (`nn.Linear`, `nn.Conv2d`): the weight
/// Kaiming-uniform with a = sqrt(5), then the bias (if any) uniform in
/// ±1/sqrt(fan_in). Weight first, then bias, from the same stream.
template <class Scalar>
void default_init(basic_tensor<Scalar>& weight, basic_tensor<Scalar>* bias, std::int64_t fan_in,
                  std::mt19937_64& rng) {
  kaiming_uniform(weight, fan_in, std::sqrt(5.0), rng);
  if (bias) uniform_fill(*bias, fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0, rng);
}

/// Fills `t` with draws of N(0, std²), row-major order (PyTorch's `normal_`: `nn.Embedding`'s
/// weight), each from two uniform draws by Box–Muller: √(−2 ln(1 − u₁))·cos(2πu₂), in
/// double, rounded to the scalar.
template <class Scalar>
void normal_fill(basic_tensor<Scalar>& t, double std, std::mt19937_64& rng) {
  Scalar* p = t.data();
  for (std::int64_t i = 0; i < t.size(); ++i) {
    const double u1 = uniform01(rng), u2 = uniform01(rng);
    p[i] = static_cast<Scalar>(std * std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(6.283185307179586477 * u2));
  }
}

}  // namespace nerve::layers

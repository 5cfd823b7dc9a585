#pragma once
/// \file
/// `check_gradients`: a layer's input and parameter gradients against central differences,
/// in double precision, returned as a report (no test framework needed).
///
/// ```
///   L(x, θ) = Σ r ⊙ forward(x; θ)          r: a fixed random tensor of the output's shape
///   analytic:  backward(stash, r)            → ∂L/∂x, ∂L/∂θ
///   numeric:   (L(v + h) − L(v − h)) / 2h    for every scalar v of every input and parameter
/// ```
/// Use it on the layer instantiated for `double` (`basic_my_layer<double>`): in float the
/// differences drown in rounding. The report also says whether B + W (`backward_input`
/// then `backward_weight`) equals the full `backward`, and whether a second backward adds
/// to the parameter gradients (accumulation), as the runtime relies on both.

#include <cstdint>
#include <string>
#include <vector>

#include "layers/layer.hpp"

namespace nerve::layers {

/// How `check_gradients` perturbs and judges.
struct gradcheck_options {
  /// The finite-difference step h.
  double step = 1e-6;
  /// An element passes when |analytic − numeric| ≤ tolerance · max(1, |analytic|, |numeric|):
  /// relative for large gradients, absolute near zero.
  double tolerance = 1e-7;
  /// Seed of the random output weights r.
  std::uint64_t seed = 99;
  /// The context of every forward call (the same each time, so Dropout keeps its mask).
  forward_context context{3, 5};
  /// The inputs perturbed: bit `i` for input `i`. An input left out (token ids, which a
  /// step of h would make no id at all) is compared with a zero gradient instead.
  input_mask perturbed = all_inputs;
};

/// The comparison for one input or one parameter tensor.
struct gradient_check {
  /// `"input 0"`, or the parameter's name (`"weight"`).
  std::string name;
  /// Scalars compared.
  std::int64_t checked = 0;
  /// The largest |analytic − numeric| over the tensor.
  double max_abs_error = 0;
  /// The largest |analytic − numeric| / max(1, |analytic|, |numeric|) (what `tolerance` bounds).
  double max_rel_error = 0;
  /// The flat index (row-major, samples first) of the element with the largest relative
  /// error, and its two values; -1 when nothing was compared.
  std::int64_t worst_element = -1;
  double worst_analytic = 0;
  double worst_numeric = 0;
  /// Why the tensor could not be compared (a gradient of the wrong shape, or none); empty when it was.
  std::string problem;
  /// Every element within the tolerance, and no problem.
  bool passed = false;

  /// One line: name, pass/fail, errors and the worst element.
  std::string to_string() const;
};

/// What `check_gradients` found for one layer.
struct gradcheck_report {
  /// The layer's label (`"fc1 (Linear)"`, or its kind when unnamed).
  std::string layer;
  double tolerance = 0;
  /// One entry per input, in order, then one per parameter, in `parameters()` order.
  std::vector<gradient_check> inputs;
  std::vector<gradient_check> parameters;
  /// `backward_input` + `backward_weight` gave exactly the full `backward`'s gradients.
  bool split_matches = false;
  /// A second backward of the same micro-batch doubled every parameter gradient (to 1e-12).
  bool accumulates = false;

  /// Every input and parameter passed, B + W matched and gradients accumulate.
  bool passed() const;
  /// Scalars compared, over all inputs and parameters.
  std::int64_t checked() const;
  /// A readable report, one line per input and parameter, failures first marked `FAIL`.
  std::string to_string() const;
};

/// Checks every input gradient and parameter gradient of `layer` at `inputs` against
/// central differences of L = Σ r ⊙ forward(inputs). Leaves the parameters as they were
/// and the parameter gradients holding two backwards' worth. Throws what the layer throws
/// (a shape it cannot take). Not thread-safe: it calls the layer many times.
gradcheck_report check_gradients(basic_layer<double>& layer, const std::vector<tensor_d>& inputs,
                                 const gradcheck_options& options = {});
/// The same for a layer of one input.
gradcheck_report check_gradients(basic_layer<double>& layer, const tensor_d& input,
                                 const gradcheck_options& options = {});

/// `batch` samples of `sample_shape` drawn uniformly from [lo, hi) with `std::mt19937_64(seed)`
/// (`(x >> 11)·2⁻⁵³` scaled in double, as layers/init.hpp): inputs for a gradient check.
tensor_d random_tensor(std::int64_t batch, shape sample_shape, std::uint64_t seed, double lo = -1.0, double hi = 1.0);

}  // namespace nerve::layers

#include "layers/gradcheck.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

namespace nerve::layers {

namespace {

std::vector<tensor_d> clones(const std::vector<tensor_d>& v) {
  std::vector<tensor_d> out;
  out.reserve(v.size());
  for (const auto& t : v) out.push_back(t.clone());
  return out;
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

/// Folds one element's comparison into `c`. A NaN error wins and stays (so a NaN
/// gradient is reported as the worst element and fails the check).
void compare(gradient_check& c, std::int64_t element, double analytic, double numeric) {
  const double abs_error = std::abs(analytic - numeric);
  const double rel_error = abs_error / std::max({1.0, std::abs(analytic), std::abs(numeric)});
  if (!std::isnan(c.max_abs_error) && !(abs_error <= c.max_abs_error)) c.max_abs_error = abs_error;
  if (!std::isnan(c.max_rel_error) && (c.worst_element < 0 || !(rel_error <= c.max_rel_error))) {
    c.max_rel_error = rel_error;
    c.worst_element = element;
    c.worst_analytic = analytic;
    c.worst_numeric = numeric;
  }
  ++c.checked;
}

void finish(gradient_check& c, double tolerance) {
  c.passed = c.problem.empty() && c.max_rel_error <= tolerance;  // false for NaN
}

}  // namespace

std::string gradient_check::to_string() const {
  std::string s = std::string(passed ? "ok   " : "FAIL ") + name + ": ";
  if (!problem.empty()) return s + problem;
  s += std::to_string(checked) + " checked, max abs error " + number(max_abs_error) + ", max rel error " +
       number(max_rel_error);
  if (worst_element >= 0)
    s += ", worst element " + std::to_string(worst_element) + " (analytic " + number(worst_analytic) + ", numeric " +
         number(worst_numeric) + ")";
  return s;
}

bool gradcheck_report::passed() const {
  auto ok = [](const gradient_check& c) { return c.passed; };
  return split_matches && accumulates && std::all_of(inputs.begin(), inputs.end(), ok) &&
         std::all_of(parameters.begin(), parameters.end(), ok);
}

std::int64_t gradcheck_report::checked() const {
  std::int64_t n = 0;
  for (const auto& c : inputs) n += c.checked;
  for (const auto& c : parameters) n += c.checked;
  return n;
}

std::string gradcheck_report::to_string() const {
  std::string s = "gradient check of " + layer + " (tolerance " + number(tolerance) + "): " +
                  (passed() ? "passed" : "FAILED") + "\n";
  for (const auto& c : inputs) s += "  " + c.to_string() + "\n";
  for (const auto& c : parameters) s += "  " + c.to_string() + "\n";
  if (!split_matches) s += "  FAIL backward_input + backward_weight differ from backward\n";
  if (!accumulates) s += "  FAIL a second backward did not add the same parameter gradients again\n";
  return s;
}

tensor_d random_tensor(std::int64_t batch, shape sample_shape, std::uint64_t seed, double lo, double hi) {
  std::mt19937_64 rng(seed);
  tensor_d t(batch, std::move(sample_shape));
  for (std::int64_t i = 0; i < t.size(); ++i) t.data()[i] = lo + (hi - lo) * (double(rng() >> 11) * 0x1.0p-53);
  return t;
}

gradcheck_report check_gradients(basic_layer<double>& l, const tensor_d& input, const gradcheck_options& options) {
  std::vector<tensor_d> v;
  v.push_back(input.clone());
  return check_gradients(l, v, options);
}

gradcheck_report check_gradients(basic_layer<double>& l, const std::vector<tensor_d>& inputs,
                                 const gradcheck_options& options) {
  gradcheck_report report;
  report.layer = l.label();
  report.tolerance = options.tolerance;
  const double h = options.step;
  const forward_context& ctx = options.context;

  auto first = l.forward(clones(inputs), ctx);
  const tensor_d r = random_tensor(first.output.batch(), first.output.sample_shape(), options.seed);
  auto objective = [&](const std::vector<tensor_d>& x) {
    auto o = l.forward(clones(x), ctx).output;
    return (o.matrix().array() * r.matrix().array()).sum();
  };
  auto params = l.parameters();

  // B and W separately, then the full backward: the runtime may do either, so they must agree exactly.
  l.zero_grad();
  auto split_in = l.backward_input(first.stash, r);
  l.backward_weight(first.stash, r);
  std::vector<tensor_d> split_params;
  for (auto& p : params) split_params.push_back(p.grad->clone());
  l.zero_grad();
  auto grads = l.backward(std::move(first.stash), r);
  report.split_matches = grads.size() == split_in.size();
  for (std::size_t k = 0; report.split_matches && k < grads.size(); ++k)
    report.split_matches = grads[k].batch() == split_in[k].batch() && grads[k].features() == split_in[k].features() &&
                           grads[k].matrix() == split_in[k].matrix();
  for (std::size_t k = 0; report.split_matches && k < params.size(); ++k)
    report.split_matches = params[k].grad->matrix() == split_params[k].matrix();

  // Central differences of every scalar of `v` (n of them, of `at` or of a parameter),
  // compared with `analytic`.
  auto differences = [&](gradient_check& c, double* v, const double* analytic, std::int64_t n,
                         const std::vector<tensor_d>& at) {
    for (std::int64_t i = 0; i < n; ++i) {
      const double saved = v[i];
      v[i] = saved + h;
      const double lp = objective(at);
      v[i] = saved - h;
      const double lm = objective(at);
      v[i] = saved;
      compare(c, i, analytic[i], (lp - lm) / (2 * h));
    }
  };
  std::vector<tensor_d> x = clones(inputs);
  for (std::size_t k = 0; k < x.size(); ++k) {
    gradient_check c;
    c.name = "input " + std::to_string(k);
    if (k >= grads.size() || grads[k].empty()) {
      c.problem = "backward returned no gradient for it";
    } else if (grads[k].batch() != x[k].batch() || grads[k].sample_shape() != x[k].sample_shape()) {
      c.problem = "the gradient is " + std::to_string(grads[k].batch()) + " × " + grads[k].sample_shape().to_string() +
                  ", the input " + std::to_string(x[k].batch()) + " × " + x[k].sample_shape().to_string();
    } else if (!(options.perturbed & (input_mask{1} << k))) {
      for (std::int64_t i = 0; i < x[k].size(); ++i) compare(c, i, grads[k].data()[i], 0.0);
    } else {
      differences(c, x[k].data(), grads[k].data(), x[k].size(), x);
    }
    finish(c, options.tolerance);
    report.inputs.push_back(std::move(c));
  }
  for (auto& p : params) {
    gradient_check c;
    c.name = p.name;
    if (p.grad->size() != p.value->size()) {
      c.problem = "its gradient has " + std::to_string(p.grad->size()) + " elements, the parameter " +
                  std::to_string(p.value->size());
    } else {
      differences(c, p.value->data(), p.grad->data(), p.value->size(), inputs);
    }
    finish(c, options.tolerance);
    report.parameters.push_back(std::move(c));
  }

  // Accumulation: a second backward of the same micro-batch adds the same amount again.
  std::vector<tensor_d> once;
  for (auto& p : params) once.push_back(p.grad->clone());
  auto again = l.forward(clones(inputs), ctx);
  l.backward(std::move(again.stash), r);
  report.accumulates = true;
  for (std::size_t k = 0; k < params.size(); ++k) {
    if (once[k].size() == 0) continue;
    const double err = (params[k].grad->matrix() - 2.0 * once[k].matrix()).cwiseAbs().maxCoeff();
    if (!(err <= 1e-12 * std::max(1.0, once[k].matrix().cwiseAbs().maxCoeff()))) report.accumulates = false;
  }
  return report;
}

}  // namespace nerve::layers

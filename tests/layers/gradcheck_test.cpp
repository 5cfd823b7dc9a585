// The library's gradient checker reports what it finds: it passes right gradients and
// points at the element of a wrong one.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "layers/activation.hpp"
#include "layers/gradcheck.hpp"
#include "layers/join.hpp"
#include "layers/linear.hpp"
#include "tests/layers/common.hpp"

using namespace nerve::layers;

namespace {

/// tanh with a derivative that is wrong (by 10%) above x = 0.5 only.
struct tanh_with_bad_derivative {
  static constexpr std::string_view kind = "BadTanh";
  template <class S> S f(S x) const { return std::tanh(x); }
  template <class S> S df(S x) const {
    const S t = std::tanh(x);
    return (S(1) - t * t) * (x > S(0.5) ? S(1.1) : S(1));
  }
};

using nerve::layers::testing::contains;

}  // namespace

TEST_SUITE("layers.gradcheck") {
  TEST_CASE("right gradients pass, with one entry per input and parameter") {
    basic_linear<double> fc(5, 3);
    std::mt19937_64 rng(1);
    fc.reset_parameters(rng);
    const auto report = check_gradients(fc, random_tensor(4, {5}, 2));
    CAPTURE(report.to_string());
    CHECK(report.passed());
    CHECK(report.layer == "Linear");
    REQUIRE(report.inputs.size() == 1);
    CHECK(report.inputs[0].name == "input 0");
    CHECK(report.inputs[0].checked == 4 * 5);
    REQUIRE(report.parameters.size() == 2);
    CHECK(report.parameters[0].name == "weight");
    CHECK(report.parameters[0].checked == 3 * 5);
    CHECK(report.parameters[1].name == "bias");
    CHECK(report.checked() == 20 + 15 + 3);
    CHECK(report.split_matches);
    CHECK(report.accumulates);
    CHECK(report.inputs[0].max_rel_error <= 1e-7);

    basic_add<double> sum;
    std::vector<tensor_d> two;
    two.push_back(random_tensor(2, {3}, 3));
    two.push_back(random_tensor(2, {3}, 4));
    const auto joined = check_gradients(sum, two);
    CHECK(joined.passed());
    REQUIRE(joined.inputs.size() == 2);
    CHECK(joined.inputs[1].name == "input 1");
  }

  TEST_CASE("a wrong derivative fails and the report names its worst element") {
    basic_activation<double, tanh_with_bad_derivative> bad;
    // Inputs in [-1, 1): the derivative is wrong exactly where x > 0.5.
    const auto x = random_tensor(3, {4}, 5);
    const auto report = check_gradients(bad, x);
    CAPTURE(report.to_string());
    CHECK_FALSE(report.passed());
    REQUIRE(report.inputs.size() == 1);
    const auto& c = report.inputs[0];
    CHECK_FALSE(c.passed);
    CHECK(c.checked == 12);
    REQUIRE(c.worst_element >= 0);
    CHECK(x.data()[c.worst_element] > 0.5);
    CHECK(c.worst_analytic == doctest::Approx(1.1 * c.worst_numeric).epsilon(1e-6));
    CHECK(c.max_abs_error > 0.01);
    CHECK(report.split_matches);  // B + W still agree: only the maths is wrong
    CHECK(contains(report.to_string(), "FAIL input 0"));
    CHECK(contains(report.to_string(), "worst element " + std::to_string(c.worst_element)));
  }
}

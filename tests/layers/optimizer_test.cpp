// Optimizer steps against values worked out by hand from PyTorch's update rules.
#include <doctest/doctest.h>

#include "layers/lr_schedule.hpp"
#include "layers/optimizer.hpp"

using namespace nerve::layers;

namespace {

// One scalar parameter p with gradient g, as PyTorch would see `torch.tensor([p])`.
struct scalar_param {
  tensor_d value = tensor_d::constant(1, {1}, 1.0);
  tensor_d grad = tensor_d::constant(1, {1}, 0.5);
  std::vector<basic_parameter_ref<double>> refs() { return {{"p", &value, &grad, {1}}}; }
  double p() const { return value.data()[0]; }
};

}  // namespace

TEST_SUITE("layers.optimizer") {
  TEST_CASE("plain SGD steps against the gradient") {
    scalar_param s;
    basic_sgd<double> opt(sgd_options{0.1});
    opt.step(s.refs());
    CHECK(s.p() == doctest::Approx(0.95).epsilon(1e-15));
    CHECK(opt.steps() == 1);
  }
  TEST_CASE("SGD with momentum and weight decay follows PyTorch") {
    // step 1: d = 0.5 + 0.1·1 = 0.6, buf = 0.6, p = 1 − 0.06 = 0.94
    // step 2: d = 0.5 + 0.094 = 0.594, buf = 0.54 + 0.594 = 1.134, p = 0.94 − 0.1134 = 0.8266
    scalar_param s;
    basic_sgd<double> opt(sgd_options{0.1, 0.9, 0.0, 0.1, false});
    opt.step(s.refs());
    CHECK(s.p() == doctest::Approx(0.94).epsilon(1e-14));
    opt.step(s.refs());
    CHECK(s.p() == doctest::Approx(0.8266).epsilon(1e-14));
  }
  TEST_CASE("SGD with Nesterov momentum follows PyTorch") {
    // step 1: d = 0.6, buf = 0.6, d = 0.6 + 0.9·0.6 = 1.14, p = 0.886
    // step 2: d = 0.5 + 0.0886 = 0.5886, buf = 0.54 + 0.5886 = 1.1286, d = 0.5886 + 1.01574 = 1.60434, p = 0.725566
    scalar_param s;
    basic_sgd<double> opt(sgd_options{0.1, 0.9, 0.0, 0.1, true});
    opt.step(s.refs());
    CHECK(s.p() == doctest::Approx(0.886).epsilon(1e-14));
    opt.step(s.refs());
    CHECK(s.p() == doctest::Approx(0.725566).epsilon(1e-14));
  }
  TEST_CASE("SGD with dampening damps all but the first step") {
    // step 1: buf = 0.5, p = 0.95; step 2: buf = 0.45 + 0.5·0.5 = 0.7, p = 0.88
    scalar_param s;
    basic_sgd<double> opt(sgd_options{0.1, 0.9, 0.5, 0.0, false});
    opt.step(s.refs());
    opt.step(s.refs());
    CHECK(s.p() == doctest::Approx(0.88).epsilon(1e-14));
    CHECK_THROWS_AS(basic_sgd<double>(sgd_options{0.1, 0.9, 0.5, 0.0, true}), std::invalid_argument);
  }
  TEST_CASE("Adam with L2 weight decay and bias correction follows PyTorch") {
    scalar_param s;
    basic_adam<double> opt(adam_options{0.1, 0.9, 0.999, 1e-8, 0.1});
    opt.step(s.refs());
    CHECK(s.p() == doctest::Approx(0.9000000016666666).epsilon(1e-13));
    opt.step(s.refs());
    CHECK(s.p() == doctest::Approx(0.8000473404883315).epsilon(1e-13));
    CHECK(opt.kind() == "Adam");
  }
  TEST_CASE("AdamW decays the weight before the Adam step") {
    scalar_param s;
    basic_adamw<double> opt(adam_options{0.1, 0.9, 0.999, 1e-8, 0.1});
    opt.step(s.refs());
    CHECK(s.p() == doctest::Approx(0.890000002).epsilon(1e-13));
    s.grad.data()[0] = -0.25;
    opt.step(s.refs());
    CHECK(s.p() == doctest::Approx(0.8544662986878463).epsilon(1e-13));
    s.grad.data()[0] = 0.5;
    opt.step(s.refs());
    CHECK(s.p() == doctest::Approx(0.7879735689630422).epsilon(1e-13));
    CHECK(opt.kind() == "AdamW");
  }
  TEST_CASE("state is kept per parameter name") {
    scalar_param a, b;
    basic_sgd<double> opt(sgd_options{0.1, 0.9});
    std::vector<basic_parameter_ref<double>> both{{"a", &a.value, &a.grad, {1}}, {"b", &b.value, &b.grad, {1}}};
    opt.step(both);
    b.grad.data()[0] = 0.0;
    opt.step(both);
    CHECK(a.p() == doctest::Approx(1 - 0.05 - 0.1 * 0.95).epsilon(1e-14));  // buf 0.5 then 0.45 + 0.5
    CHECK(b.p() == doctest::Approx(1 - 0.05 - 0.1 * 0.45).epsilon(1e-14));  // buf 0.5 then 0.45 + 0
  }
  TEST_CASE("make_optimizer knows sgd, adam and adamw") {
    CHECK(make_optimizer<float>("sgd", 0.1)->kind() == "SGD");
    CHECK(make_optimizer<float>("adam", 0.1)->kind() == "Adam");
    CHECK(make_optimizer<float>("adamw", 0.1)->kind() == "AdamW");
    CHECK_THROWS_AS(make_optimizer<float>("rmsprop", 0.1), std::invalid_argument);
  }
  TEST_CASE("make_optimizer gives AdamW the weight decay asked for, 0 included") {
    // A zero gradient leaves only the decay: w ← w·(1 − lr·λ). 0 is no decay, not AdamW's default.
    for (const double decay : {0.0, 0.1}) {
      CAPTURE(decay);
      scalar_param s;
      s.grad.data()[0] = 0.0;
      make_optimizer<double>("adamw", 0.1, 0.0, decay)->step(s.refs());
      CHECK(s.p() == doctest::Approx(1.0 - 0.1 * decay).epsilon(1e-15));
    }
  }
}

TEST_SUITE("layers.lr_schedule") {
  TEST_CASE("step and cosine schedules match PyTorch's closed forms") {
    step_lr s{0.1, 10, 0.5};
    CHECK(s(0) == doctest::Approx(0.1));
    CHECK(s(9) == doctest::Approx(0.1));
    CHECK(s(10) == doctest::Approx(0.05));
    CHECK(s(25) == doctest::Approx(0.025));
    cosine_lr c{0.1, 100, 0.001};
    CHECK(c(0) == doctest::Approx(0.1));
    CHECK(c(50) == doctest::Approx(0.0505));
    CHECK(c(100) == doctest::Approx(0.001));
    CHECK(c(150) == doctest::Approx(0.001));
  }
}

// The one trainer: what it asks of any engine (steps, rates, evaluation, finish), and a
// user's own graph trained through it.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#include <nlohmann/json.hpp>

#include "layers/activation.hpp"
#include "layers/checkpoint/checkpoint.hpp"
#include "layers/flatten.hpp"
#include "layers/join.hpp"
#include "layers/linear.hpp"
#include "layers/lr_schedule.hpp"
#include "layers/presets.hpp"
#include "layers/trainer.hpp"
#include "tests/layers/tiny_fashion_mnist.hpp"

using namespace nerve;
using namespace nerve::layers;
using nerve::testing::tiny_fashion_mnist;

namespace {

/// What the trainer asked of an engine (it outlives the engine, which train() destroys).
struct engine_log {
  std::vector<double> rates;
  std::vector<std::uint64_t> steps;
  std::vector<std::int64_t> rows, eval_rows;
  int finished = 0;
  std::vector<double> losses;
  tensor first_batch, first_test_chunk;  // what the loader and the evaluation handed over first
};

/// Wraps the cpu engine and writes down what the trainer asked of it.
struct recording_engine : train_engine {
  std::unique_ptr<train_engine> inner;
  engine_log& log;
  explicit recording_engine(engine_log& l) : log(l) {}
  std::future<step_result> train_step(tensor x, targets y, std::size_t m, std::uint64_t step, double lr) override {
    log.rates.push_back(lr);
    log.steps.push_back(step);
    log.rows.push_back(x.batch());
    if (log.first_batch.empty()) log.first_batch = x.clone();
    auto r = inner->train_step(std::move(x), std::move(y), m, step, lr).get();
    log.losses.push_back(r.loss);
    std::promise<step_result> p;
    p.set_value(r);
    return p.get_future();
  }
  std::future<step_result> evaluate(tensor x, targets y) override {
    log.eval_rows.push_back(x.batch());
    if (log.first_test_chunk.empty()) log.first_test_chunk = x.clone();
    return inner->evaluate(std::move(x), std::move(y));
  }
  void finish() override {
    ++log.finished;
    inner->finish();
  }
  optimizer_state optimizer_state_of() override { return inner->optimizer_state_of(); }  // for checkpoints
};

/// The cpu engine behind `recording_engine`, for `train`'s last argument.
engine_factory recording(engine_log& log) {
  return [&log](actors::runtime& rt, graph& g, const train_options& o) {
    auto e = std::make_unique<recording_engine>(log);
    e->inner = make_network_engine(rt, g, o);
    return e;
  };
}

/// The cpu engine, but step `bad_step` reports `loss` (a diverged run, as a device or
/// pipeline engine would see it, with no layer actor to catch the gradient).
engine_factory reporting_loss_at(std::uint64_t bad_step, double loss) {
  struct engine : train_engine {
    std::unique_ptr<train_engine> inner;
    std::uint64_t bad;
    double loss;
    std::future<step_result> train_step(tensor x, targets y, std::size_t m, std::uint64_t step, double lr) override {
      auto r = inner->train_step(std::move(x), std::move(y), m, step, lr).get();
      if (step == bad) r.loss = loss;
      std::promise<step_result> p;
      p.set_value(r);
      return p.get_future();
    }
    std::future<step_result> evaluate(tensor x, targets y) override { return inner->evaluate(std::move(x), std::move(y)); }
    void finish() override { inner->finish(); }
  };
  return [=](actors::runtime& rt, graph& g, const train_options& o) {
    auto e = std::make_unique<engine>();
    e->inner = make_network_engine(rt, g, o);
    e->bad = bad_step;
    e->loss = loss;
    return e;
  };
}

/// The records of a `--metrics` file. Every line must be whole (the file ends in a newline)
/// and one JSON object with a `kind`.
std::vector<nlohmann::json> read_metrics(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE_FALSE(text.empty());
  CHECK(text.back() == '\n');
  std::vector<nlohmann::json> records;
  for (std::size_t from = 0, end = text.find('\n'); end != std::string::npos; from = end + 1, end = text.find('\n', from)) {
    auto j = nlohmann::json::parse(text.substr(from, end - from));
    REQUIRE(j.is_object());
    REQUIRE(j.contains("kind"));
    records.push_back(std::move(j));
  }
  return records;
}

std::vector<nlohmann::json> of_kind(const std::vector<nlohmann::json>& records, const std::string& kind) {
  std::vector<nlohmann::json> out;
  for (auto& r : records)
    if (r["kind"] == kind) out.push_back(r);
  return out;
}

/// A small residual network a user might wire: flatten, a skip connection, a custom width.
graph users_graph() {
  graph_builder b;
  b.input("image", shape{784});
  b.add("fc1", linear(784, 32), {"image"});
  b.add("act1", relu(), {"fc1"});
  b.add("fc2", linear(32, 32), {"act1"});
  b.add("skip", nerve::layers::add(), {"fc2", "act1"});
  b.add("head", linear(32, 10), {"skip"});
  return b.build(5);
}

}  // namespace

TEST_SUITE("layers.trainer") {
  TEST_CASE("the trainer asks any engine for every step at the schedule's rate, evaluates each epoch, finishes once") {
    tiny_fashion_mnist data(300, 1500);
    train_options o;
    o.model = "users";
    o.data = data.dir;
    o.epochs = 2;
    o.batch = 64;
    o.lr = 0.1;
    o.schedule = "cosine";
    auto g = users_graph();
    engine_log log;
    const engine_log* rec = &log;
    std::vector<epoch_stats> seen;
    auto report = train(g, o, {}, [&](const epoch_stats& e) { seen.push_back(e); },
                        [&](actors::runtime& rt, graph& gg, const train_options& oo) {
                          auto e = std::make_unique<recording_engine>(log);
                          e->inner = make_network_engine(rt, gg, oo);
                          return e;
                        });
    // 300 rows in batches of 64: 4 full batches and one of 44, twice.
    CHECK(report.steps == 10);
    CHECK(rec->rows == std::vector<std::int64_t>{64, 64, 64, 64, 44, 64, 64, 64, 64, 44});
    CHECK(rec->steps == std::vector<std::uint64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
    for (std::size_t t = 0; t < rec->rates.size(); ++t) CHECK(rec->rates[t] == cosine_lr{0.1, 10}(std::int64_t(t)));
    // The test set in chunks of evaluation_rows, every epoch.
    CHECK(rec->eval_rows == std::vector<std::int64_t>{1000, 500, 1000, 500});
    CHECK(rec->finished == 1);
    REQUIRE(seen.size() == 2);
    double first_epoch = 0;
    for (std::size_t t = 0; t < 5; ++t) first_epoch += rec->losses[t] * double(rec->rows[t]);
    CHECK(seen[0].train_loss == doctest::Approx(first_epoch / 300.0));
    CHECK(seen[0].steps == 5);
  }

  TEST_CASE("a user's own graph trains through the one trainer and saves what it trained") {
    tiny_fashion_mnist data(128, 10);
    train_options o;
    o.model = "users";
    o.data = data.dir;
    o.epochs = 1;
    o.batch = 32;
    o.micro_batches = 2;
    o.save = data.dir / "w.safetensors";
    auto g = users_graph();
    const float before = g.layer<linear>("fc2").parameters()[0].value->data()[0];
    auto report = train(g, o);
    CHECK(report.steps == 4);
    CHECK(report.parameters == g.parameter_count());
    CHECK(g.layer<linear>("fc2").parameters()[0].value->data()[0] != before);
    auto copy = users_graph();
    load_weights(copy, o.save);
    CHECK(copy.layer<linear>("fc2").parameters()[0].value->data()[0] == g.layer<linear>("fc2").parameters()[0].value->data()[0]);
  }

  TEST_CASE("a user's graph whose input does not fit the data is named as theirs, not as the default model") {
    tiny_fashion_mnist data(8, 4);
    train_options o;  // model: the default, mlp
    o.data = data.dir;
    graph_builder b;
    b.input("image", shape{1, 32, 32});
    b.add("flat", flatten(), {"image"});
    b.add("head", linear(1024, 10), {"flat"});
    auto g = b.build(5);
    CHECK_THROWS_WITH_AS(train(g, o), "your graph's input 'image' takes samples of [1, 32, 32] but the data has 784 features",
                         std::invalid_argument);
    // A preset is named by its model; a graph is that preset only when its nodes are.
    CHECK(is_preset(make_preset("mlp"), "mlp"));
    CHECK_FALSE(is_preset(make_preset("mlp"), "resmlp"));
    CHECK_FALSE(is_preset(users_graph(), "mlp"));
    CHECK_FALSE(is_preset(g, "no-such-model"));
  }

  TEST_CASE("an unknown device names the device kinds this program has registered") {
    CHECK_THROWS_WITH_AS(engine_for("tpu:1"), doctest::Contains("unknown --device 'tpu:1': this program has registered cpu only"),
                         std::invalid_argument);
    CHECK(engine_for("cpu"));
  }

  TEST_CASE("a device named before gpu::register_devices() says what to call, not that the build lacks it") {
    // layers_test links no nerve::gpu_layers: cuda is registered by nothing here.
    const auto kinds = device_kinds();
    REQUIRE(std::find(kinds.begin(), kinds.end(), "cuda") == kinds.end());
    CHECK_THROWS_WITH_AS(engine_for("cuda"),
                         "unknown --device 'cuda': this program has registered cpu only: cuda and standin are registered by "
                         "nerve::gpu::register_devices() (gpu/layers/train.hpp, target nerve::gpu_layers), which it must "
                         "call before it names a device",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(open_device(device_spec{"standin", -1, "standin"}, device_request{}),
                         doctest::Contains("open_device: 'standin': this program has registered cpu only: cuda and standin "
                                           "are registered by nerve::gpu::register_devices()"),
                         std::invalid_argument);
  }

  TEST_CASE("epochs and steps: the first limit reached ends the run, and the schedule spans that run") {
    tiny_fashion_mnist data(300, 10);
    train_options o;
    o.model = "users";
    o.data = data.dir;
    o.evaluate = false;
    o.batch = 100;  // 3 steps an epoch
    o.lr = 0.1;
    o.schedule = "cosine";
    SUBCASE("one epoch before six steps: three steps, cosine over three") {
      o.epochs = 1;
      o.steps = 6;
      auto g = users_graph();
      engine_log log;
      auto report = train(g, o, {}, {}, recording(log));
      CHECK(report.steps == 3);
      REQUIRE(log.rates.size() == 3);
      for (std::size_t t = 0; t < 3; ++t) CHECK(log.rates[t] == cosine_lr{0.1, 3}(std::int64_t(t)));
      CHECK(log.rates.back() > 0);
    }
    SUBCASE("four steps before five epochs: four steps, cosine over four") {
      o.epochs = 5;
      o.steps = 4;
      auto g = users_graph();
      engine_log log;
      auto report = train(g, o, {}, {}, recording(log));
      CHECK(report.steps == 4);
      REQUIRE(report.epochs.size() == 2);
      CHECK(report.epochs[1].steps == 1);
      for (std::size_t t = 0; t < log.rates.size(); ++t) CHECK(log.rates[t] == cosine_lr{0.1, 4}(std::int64_t(t)));
    }
    SUBCASE("a last batch too small for the engine is no step, and the schedule knows it") {
      o.batch = 128;  // 128, 128 and 44 rows; the engine takes 64 or more
      o.epochs = 2;
      auto g = users_graph();
      engine_log log;
      auto report = train(g, o, {}, {}, [&](actors::runtime& rt, graph& gg, const train_options& oo) {
        struct picky : recording_engine {
          using recording_engine::recording_engine;
          std::size_t min_rows() const override { return 64; }
        };
        auto e = std::make_unique<picky>(log);
        e->inner = make_network_engine(rt, gg, oo);
        return e;
      });
      CHECK(report.steps == 4);
      for (std::size_t t = 0; t < log.rates.size(); ++t) CHECK(log.rates[t] == cosine_lr{0.1, 4}(std::int64_t(t)));
    }
  }

  TEST_CASE("options out of range are refused, naming the option and the range") {
    tiny_fashion_mnist data(64, 10);
    train_options o;
    o.model = "users";
    o.data = data.dir;
    o.save = data.dir / "w.safetensors";
    auto refused = [&](const std::string& message) {
      auto g = users_graph();
      CHECK_THROWS_WITH_AS(train(g, o), doctest::Contains(message.c_str()), std::invalid_argument);
      CHECK_FALSE(std::filesystem::exists(o.save));
    };
    SUBCASE("epochs 0, even with steps (nerve-pipeline --epochs 0 --save wrote untrained weights)") {
      o.epochs = 0;
      o.steps = 5;
      refused("--epochs must be at least 1 (got 0)");
    }
    SUBCASE("steps 0") {
      o.steps = 0;
      refused("--steps must be at least 1 (got 0)");
    }
    SUBCASE("lr nan") {
      o.lr = std::nan("");
      refused("--lr must be a finite number above 0 (got nan)");
    }
    SUBCASE("lr inf") {
      o.lr = INFINITY;
      refused("--lr must be a finite number above 0 (got inf)");
    }
    SUBCASE("lr -1") {
      o.lr = -1;
      refused("--lr must be a finite number above 0 (got -1)");
    }
    SUBCASE("momentum -1") {
      o.momentum = -1;
      refused("--momentum must be in [0, 1) (got -1)");
    }
    SUBCASE("momentum 1") {
      o.momentum = 1;
      refused("--momentum must be in [0, 1) (got 1)");
    }
    SUBCASE("weight decay nan") {
      o.weight_decay = std::nan("");
      refused("--weight-decay must be a finite number, 0 or more (got nan)");
    }
    SUBCASE("10000 threads") {
      o.threads = 10000;
      refused("--threads must be between 1 and 256 (got 10000)");
    }
    SUBCASE("batch 0") {
      o.batch = 0;
      refused("--batch must be at least 1 (got 0)");
    }
    SUBCASE("an unknown schedule, before the data is read") {
      o.schedule = "linear";
      o.data = data.dir / "nowhere";
      refused("unknown --schedule 'linear' (none, step, cosine)");
    }
  }

  TEST_CASE("a non-finite loss stops the run, naming the step and the layer, unless allowed") {
    tiny_fashion_mnist data(128, 10);
    train_options o;
    o.model = "users";
    o.data = data.dir;
    o.evaluate = false;
    o.batch = 32;
    o.save = data.dir / "w.safetensors";
    auto g = users_graph();
    SUBCASE("stopped") {
      CHECK_THROWS_WITH_AS(train(g, o, {}, {}, reporting_loss_at(2, std::nan(""))),
                           "step 2 (epoch 1, batch 3): the loss is nan (on the output of layer 'head'): training "
                           "diverged (a lower --lr may help; --allow-nonfinite goes on regardless)",
                           std::runtime_error);
      CHECK_FALSE(std::filesystem::exists(o.save));
    }
    SUBCASE("allowed") {
      o.allow_nonfinite = true;
      CHECK(train(g, o, {}, {}, reporting_loss_at(2, INFINITY)).steps == 4);
      CHECK(std::filesystem::exists(o.save));
    }
  }

  TEST_CASE("a non-finite gradient stops the layer's optimizer step, naming the layer and the step, unless allowed") {
    tiny_fashion_mnist data(128, 10);
    train_options o;
    o.model = "users";
    o.data = data.dir;
    o.evaluate = false;
    o.batch = 32;
    auto g = users_graph();
    // From step 1 on, the gradient 'head' sends back to 'skip' is NaN: the loss stays
    // finite, and fc2 is the first layer with parameters to receive it.
    std::uint64_t backwards = 0;
    g.node("head").backward_hooks.push_back([&](const hook_context&, std::vector<tensor>& gi, const tensor&) {
      if (backwards++ >= 1) gi[0].data()[0] = std::nanf("");
    });
    const float before = g.layer<linear>("fc2").parameters()[0].value->data()[0];
    SUBCASE("stopped, the weights as they were") {
      CHECK_THROWS_WITH(train(g, o), doctest::Contains("layer 'fc2': step 1: the gradient of fc2.weight is not finite"));
      CHECK(std::isfinite(g.layer<linear>("fc2").parameters()[0].value->data()[0]));
      CHECK(g.layer<linear>("fc2").parameters()[0].value->data()[0] != before);  // step 0 did run
    }
    SUBCASE("allowed") {
      o.allow_nonfinite = true;
      CHECK(train(g, o).steps == 4);
      CHECK(std::isnan(g.layer<linear>("fc2").parameters()[0].value->data()[0]));
    }
  }

  TEST_CASE("--init refuses NaN or Inf weights, naming the tensor, unless allowed") {
    tiny_fashion_mnist data(64, 10);
    auto g = users_graph();
    g.layer<linear>("fc2").parameters()[1].value->data()[3] = std::nanf("");
    const auto init = data.dir / "nan.safetensors";
    save_weights(g, init, "users");
    train_options o;
    o.model = "users";
    o.data = data.dir;
    o.evaluate = false;
    o.init = init;
    auto fresh = users_graph();
    CHECK_THROWS_WITH(train(fresh, o), doctest::Contains("tensor 'fc2.bias' holds nan at element 3 of 32"));
    CHECK_THROWS_WITH(load_weights(fresh, init), doctest::Contains("tensor 'fc2.bias' holds nan"));
    o.allow_nonfinite = true;
    o.steps = 1;
    CHECK_NOTHROW(train(fresh, o));
  }

  TEST_CASE("a stop request ends the run between steps: figures so far, engine finished, trace and weights written") {
    tiny_fashion_mnist data(320, 10);
    train_options o;
    o.model = "users";
    o.data = data.dir;
    o.batch = 32;  // 10 steps an epoch
    o.epochs = 3;
    o.save = data.dir / "w.safetensors";
    o.trace = data.dir / "trace.json";
    std::atomic<bool> stop{false};
    o.stop = &stop;
    auto g = users_graph();
    engine_log log;
    std::vector<epoch_stats> seen;
    auto report = train(
        g, o,
        [&](const train_progress& p) {
          if (p.epoch == 2 && p.batch == 4) stop = true;  // as a signal handler would, between steps
        },
        [&](const epoch_stats& e) { seen.push_back(e); }, recording(log));
    CHECK(report.interrupted);
    CHECK(report.steps == 14);
    REQUIRE(report.epochs.size() == 2);
    CHECK_FALSE(report.epochs[0].interrupted);
    CHECK(report.epochs[1].interrupted);
    CHECK(report.epochs[1].steps == 4);
    CHECK(seen.size() == 2);
    CHECK(log.eval_rows.size() == 1);  // the first epoch only: no evaluation of a stopped one
    CHECK(log.finished == 1);
    CHECK(std::filesystem::exists(o.trace));
    CHECK(std::filesystem::exists(o.save));  // the weights of the last step taken
  }
}

TEST_SUITE("layers.trainer.metrics") {
  TEST_CASE("the metrics file has a run line, a line per step at the schedule's rate, and a line per epoch") {
    tiny_fashion_mnist data(300, 1500);
    train_options o;
    o.model = "users";
    o.data = data.dir;
    o.epochs = 2;
    o.batch = 64;  // 4 full batches and one of 44, twice
    o.lr = 0.1;
    o.schedule = "cosine";
    o.metrics = data.dir / "m.jsonl";
    std::ofstream(o.metrics) << "an older run's lines, replaced\n";
    auto g = users_graph();
    engine_log log;
    auto report = train(g, o, {}, {}, recording(log));
    const auto records = read_metrics(o.metrics);
    REQUIRE(records.size() == 1 + 10 + 2);
    const auto& run = records[0];
    CHECK(run["kind"] == "run");
    CHECK(run["format"] == "nerve-metrics-1");
    CHECK(run["total_steps"] == 10);
    CHECK(run["settings"]["schedule"] == "cosine");
    CHECK(run["settings"]["lr"] == 0.1);
    CHECK_FALSE(run.contains("resume"));
    // Steps and epochs in the order they happened: five steps, the first epoch, five more.
    CHECK(records[6]["kind"] == "epoch");
    CHECK(records[12]["kind"] == "epoch");
    const auto steps = of_kind(records, "step");
    REQUIRE(steps.size() == 10);
    for (std::size_t t = 0; t < steps.size(); ++t) {
      CAPTURE(t);
      CHECK(steps[t]["step"] == t);
      CHECK(steps[t]["epoch"] == (t < 5 ? 1 : 2));
      CHECK(steps[t]["batch"] == t % 5 + 1);
      // The exact doubles: the engine's rate and loss, the schedule's rate.
      CHECK(steps[t]["lr"].get<double>() == log.rates[t]);
      CHECK(steps[t]["lr"].get<double>() == cosine_lr{0.1, 10}(std::int64_t(t)));
      CHECK(steps[t]["loss"].get<double>() == log.losses[t]);
      CHECK(steps[t]["samples"] == log.rows[t]);
      const double acc = steps[t]["accuracy"];
      CHECK((acc >= 0 && acc <= 1));
      CHECK(steps[t]["samples_per_s"].get<double>() > 0);
    }
    const auto epochs = of_kind(records, "epoch");
    REQUIRE(epochs.size() == 2);
    for (std::size_t e = 0; e < 2; ++e) {
      CAPTURE(e);
      CHECK(epochs[e]["epoch"] == e + 1);
      CHECK(epochs[e]["step"] == 5 * (e + 1));
      CHECK(epochs[e]["steps"] == 5);
      CHECK(epochs[e]["train_loss"].get<double>() == report.epochs[e].train_loss);
      CHECK(epochs[e]["train_accuracy"].get<double>() == report.epochs[e].train_accuracy);
      CHECK(epochs[e]["test_loss"].get<double>() == report.epochs[e].test_loss);
      CHECK(epochs[e]["test_accuracy"].get<double>() == report.epochs[e].test_accuracy);
      CHECK(epochs[e]["interrupted"] == false);
    }
  }

  TEST_CASE("a stopped run's file ends with whole lines: the steps taken and the interrupted epoch") {
    tiny_fashion_mnist data(320, 10);
    train_options o;
    o.model = "users";
    o.data = data.dir;
    o.batch = 32;  // 10 steps an epoch
    o.epochs = 3;
    o.metrics = data.dir / "m.jsonl";
    std::atomic<bool> stop{false};
    o.stop = &stop;
    auto g = users_graph();
    auto report = train(g, o, [&](const train_progress& p) {
      if (p.epoch == 2 && p.batch == 4) stop = true;
    });
    REQUIRE(report.steps == 14);
    const auto records = read_metrics(o.metrics);
    CHECK(of_kind(records, "step").size() == 14);
    const auto epochs = of_kind(records, "epoch");
    REQUIRE(epochs.size() == 2);
    CHECK(records.back() == epochs[1]);
    CHECK(epochs[1]["interrupted"] == true);
    CHECK(epochs[1]["steps"] == 4);
    CHECK(epochs[1]["test_loss"].is_null());  // a stopped epoch is not evaluated
    CHECK(epochs[1]["test_accuracy"].is_null());
    CHECK(epochs[0]["test_accuracy"].is_number());
  }

  TEST_CASE("a diverged step is on the curve, its loss null, and the file stays JSON") {
    tiny_fashion_mnist data(128, 10);
    train_options o;
    o.model = "users";
    o.data = data.dir;
    o.evaluate = false;
    o.batch = 32;
    o.metrics = data.dir / "m.jsonl";
    auto g = users_graph();
    SUBCASE("stopped at the step") {
      CHECK_THROWS_WITH(train(g, o, {}, {}, reporting_loss_at(2, std::nan(""))), doctest::Contains("step 2"));
      const auto steps = of_kind(read_metrics(o.metrics), "step");
      REQUIRE(steps.size() == 3);
      CHECK(steps[2]["loss"].is_null());
    }
    SUBCASE("allowed") {
      o.allow_nonfinite = true;
      train(g, o, {}, {}, reporting_loss_at(1, INFINITY));
      const auto records = read_metrics(o.metrics);
      const auto steps = of_kind(records, "step");
      REQUIRE(steps.size() == 4);
      CHECK(steps[1]["loss"].is_null());
      CHECK(steps[2]["loss"].is_number());
      CHECK(of_kind(records, "epoch")[0]["train_loss"].is_null());  // the epoch's mean holds the inf
    }
  }

  TEST_CASE("--metrics is refused, before the run, where --save would be and beside the other outputs") {
    tiny_fashion_mnist data(64, 10);
    train_options o;
    o.model = "users";
    o.data = data.dir;
    SUBCASE("a directory") {
      o.metrics = data.dir;
      CHECK_THROWS_WITH_AS(check_options(o), doctest::Contains("is a directory, not a regular file"),
                           std::invalid_argument);
    }
    SUBCASE("a character device") {
      o.metrics = "/dev/null";
      CHECK_THROWS_WITH_AS(check_options(o), "'/dev/null' is a character device, not a regular file: refusing to replace it",
                           std::invalid_argument);
    }
    SUBCASE("the checkpoint's file") {
      o.checkpoint = data.dir / "ck.safetensors";
      o.metrics = data.dir / "." / "ck.safetensors";
      CHECK_THROWS_WITH_AS(check_options(o), doctest::Contains("is the file --checkpoint names: give each its own file"),
                           std::invalid_argument);
    }
    SUBCASE("the trace, through a symlink") {
      o.trace = data.dir / "t.json";
      std::filesystem::create_symlink("t.json", data.dir / "link.jsonl");
      o.metrics = data.dir / "link.jsonl";
      CHECK_THROWS_WITH_AS(check_options(o), doctest::Contains("is the file --trace names"), std::invalid_argument);
    }
    auto g = users_graph();
    CHECK_THROWS_AS(train(g, o), std::invalid_argument);
  }

  TEST_CASE("a preset's defaults follow the optimizer: SGD's rate for sgd, PyTorch's defaults for adam and adamw") {
    const auto sgd = preset_defaults("mlp");
    CHECK(sgd.optimizer == "sgd");
    CHECK(sgd.lr == 0.1);
    CHECK(sgd.momentum == 0.9);
    CHECK(sgd.weight_decay == 0.0);
    const auto adam = preset_defaults("mlp", "adam");
    CHECK(adam.optimizer == "adam");
    CHECK(adam.lr == 1e-3);  // not SGD's 0.1, at which Adam diverges (docs/layers.md)
    CHECK(adam.momentum == 0.0);
    CHECK(adam.weight_decay == 0.0);
    const auto adamw = preset_defaults("deep-mlp", "adamw");
    CHECK(adamw.optimizer == "adamw");
    CHECK(adamw.lr == 1e-3);
    CHECK(adamw.weight_decay == 0.01);
    CHECK(adamw.batch == preset_defaults("deep-mlp").batch);
    CHECK(preset_defaults("mlp", "rmsprop").lr == 0.1);  // the name is check_options' to refuse
  }

  TEST_CASE("--normalize: the batches and the test set are (x / 255 - mean) / std, and a checkpoint keeps it") {
    tiny_fashion_mnist data(64, 20);
    train_options o;
    o.model = "users";
    o.data = data.dir;
    o.batch = 16;
    o.steps = 1;
    o.shuffle = false;  // the first batch is the file's first 16 images
    o.normalize = data::normalization{0.25f, 0.5f};
    o.checkpoint = data.dir / "ck.safetensors";
    engine_log log;
    auto g = users_graph();
    train(g, o, {}, {}, recording(log));
    // The same float expression as torchvision's Normalize after ToTensor: bitwise.
    auto expect = [](const tensor& got, data::split which, const std::filesystem::path& dir) {
      const auto raw = data::load_fashion_mnist(dir, which);
      REQUIRE(got.batch() > 0);
      REQUIRE(std::size_t(got.size()) <= raw.pixels.size());
      std::size_t differ = 0;
      for (std::size_t i = 0; i < std::size_t(got.size()); ++i)
        differ += got.data()[i] != (float(raw.pixels[i]) / 255.0f - 0.25f) / 0.5f;
      CHECK(differ == 0);
    };
    expect(log.first_batch, data::split::train, data.dir);
    expect(log.first_test_chunk, data::split::test, data.dir);
    const auto resumed = resume_options(o.checkpoint);
    REQUIRE(resumed.normalize.has_value());
    CHECK(resumed.normalize->mean == 0.25f);
    CHECK(resumed.normalize->std == 0.5f);
    // Without it the checkpoint says none (as every checkpoint written before the option).
    o.normalize.reset();
    auto plain = users_graph();
    train(plain, o);
    CHECK_FALSE(resume_options(o.checkpoint).normalize.has_value());
    o.normalize = data::normalization{0.25f, 0.0f};
    CHECK_THROWS_WITH_AS(check_options(o), "--normalize MEAN,STD must be finite numbers with STD above 0 (got 0.25,0)",
                         std::invalid_argument);
  }

  TEST_CASE("an output in a directory that is not there is refused before the run, not after it") {
    // Found only when the run writes, at its end, a typo would cost the run's work.
    tiny_fashion_mnist data(64, 10);
    const auto missing = data.dir / "no-such-dir";
    for (auto field : {&train_options::save, &train_options::trace, &train_options::checkpoint, &train_options::metrics}) {
      train_options o;
      o.model = "users";
      o.data = data.dir;
      o.*field = missing / "out";
      const auto message = "'" + (missing / "out").string() + "': the directory '" + missing.string() + "' does not exist";
      CHECK_THROWS_WITH_AS(check_options(o), message.c_str(), std::invalid_argument);
      o.*field = data.dir / "train-images-idx3-ubyte" / "out";  // a file where the directory should be
      CHECK_THROWS_WITH_AS(check_options(o), doctest::Contains("train-images-idx3-ubyte' is a regular file, not a directory"),
                           std::invalid_argument);
      // The other ranks of a job write nothing: their machine need not have the directory.
      o.lead = false;
      CHECK_NOTHROW(check_options(o));
    }
    CHECK_FALSE(std::filesystem::exists(missing));
  }
}

TEST_SUITE("layers.trainer.resume") {
  /// The cpu engine, failing the step `fail_at` as a killed process would stop there.
  struct crashing_engine : train_engine {
    std::unique_ptr<train_engine> inner;
    std::int64_t fail_at;
    explicit crashing_engine(std::int64_t f) : fail_at(f) {}
    std::future<step_result> train_step(tensor x, targets y, std::size_t m, std::uint64_t step, double lr) override {
      if (std::int64_t(step) == fail_at) throw std::runtime_error("killed");
      return inner->train_step(std::move(x), std::move(y), m, step, lr);
    }
    std::future<step_result> evaluate(tensor x, targets y) override { return inner->evaluate(std::move(x), std::move(y)); }
    void finish() override { inner->finish(); }
    optimizer_state optimizer_state_of() override { return inner->optimizer_state_of(); }
    void load_optimizer_state(const optimizer_state& s) override { inner->load_optimizer_state(s); }
  };

  bool same_weights(graph& a, graph& b) {
    auto pa = a.parameters(), pb = b.parameters();
    for (std::size_t i = 0; i < pa.size(); ++i)
      if (std::memcmp(pa[i].value->data(), pb[i].value->data(), sizeof(float) * std::size_t(pa[i].value->size())) != 0)
        return false;
    return pa.size() == pb.size();
  }

  TEST_CASE("a run stopped anywhere and resumed from its checkpoint ends with the uninterrupted run's bits") {
    tiny_fashion_mnist data(200, 10);
    for (std::string opt : {"sgd", "adam"}) {
      CAPTURE(opt);
      train_options o;
      o.model = "users";
      o.data = data.dir;
      o.epochs = 3;
      o.batch = 48;  // 5 steps an epoch, the last of 8 rows
      o.micro_batches = 2;
      o.optimizer = opt;
      o.lr = opt == "sgd" ? 0.05 : 0.002;
      o.momentum = opt == "sgd" ? 0.9 : 0;
      o.schedule = "cosine";
      o.evaluate = true;
      auto whole = users_graph();
      auto want = train(whole, o);
      REQUIRE(want.steps == 15);

      // Stopped at step 7 (mid-epoch), at 10 (an epoch's end) and at 1; checkpoints every 3
      // steps and after each epoch, so some resumes replay steps done after the checkpoint.
      for (std::int64_t stop : {7, 10, 1}) {
        CAPTURE(stop);
        auto ck = o;
        ck.checkpoint = data.dir / ("ck-" + opt + ".safetensors");
        ck.checkpoint_every = 3;
        std::filesystem::remove(ck.checkpoint);
        auto g = users_graph();
        CHECK_THROWS_WITH(train(g, ck, {}, {},
                                [&](actors::runtime& rt, graph& gg, const train_options& oo) {
                                  auto e = std::make_unique<crashing_engine>(stop);
                                  e->inner = make_network_engine(rt, gg, oo);
                                  return e;
                                }),
                          "killed");
        if (!std::filesystem::exists(ck.checkpoint)) {  // stopped before the first checkpoint: start again
          CHECK(stop < 3);
          continue;
        }
        auto ro = resume_options(ck.checkpoint);
        CHECK(ro.optimizer == opt);
        CHECK(ro.batch == 48);
        auto resumed = users_graph();  // fresh weights: the checkpoint's replace them
        auto got = train(resumed, ro);
        CHECK(got.steps == 15);
        REQUIRE(got.epochs.size() == 3);
        CHECK(got.epochs[2].test_accuracy == want.epochs[2].test_accuracy);
        CHECK(got.epochs[2].train_loss == doctest::Approx(want.epochs[2].train_loss).epsilon(1e-12));
        CHECK(same_weights(resumed, whole));
      }
    }
  }

  TEST_CASE("a resumed run appends to its metrics file: a run line saying where it resumes, then the steps it takes") {
    tiny_fashion_mnist data(200, 10);
    train_options o;
    o.model = "users";
    o.data = data.dir;
    o.epochs = 3;
    o.batch = 48;  // 5 steps an epoch
    o.schedule = "cosine";
    o.evaluate = false;
    o.checkpoint = data.dir / "ck.safetensors";
    o.checkpoint_every = 3;
    o.metrics = data.dir / "m.jsonl";
    auto g = users_graph();
    CHECK_THROWS_WITH(train(g, o, {}, {},
                            [&](actors::runtime& rt, graph& gg, const train_options& oo) {
                              auto e = std::make_unique<crashing_engine>(7);
                              e->inner = make_network_engine(rt, gg, oo);
                              return e;
                            }),
                      "killed");
    const auto before = read_metrics(o.metrics);  // whole lines up to the failure
    CHECK(of_kind(before, "step").size() == 7);
    CHECK(of_kind(before, "epoch").size() == 1);

    auto ro = resume_options(o.checkpoint);  // the checkpoint of step 6
    CHECK(ro.metrics.empty());               // an output: given again, as --save and --trace are
    ro.metrics = o.metrics;
    auto resumed = users_graph();
    CHECK(train(resumed, ro).steps == 15);
    const auto records = read_metrics(o.metrics);
    REQUIRE(records.size() > before.size());
    for (std::size_t i = 0; i < before.size(); ++i) CHECK(records[i] == before[i]);  // appended, not replaced
    const auto& run = records[before.size()];
    CHECK(run["kind"] == "run");
    CHECK(run["resume"]["step"] == 6);
    CHECK(run["resume"]["epoch"] == 2);
    // The resumed run replays step 6 and goes on to 14: its own lines, at the schedule's rates.
    std::vector<std::int64_t> replayed;
    for (std::size_t i = before.size(); i < records.size(); ++i)
      if (records[i]["kind"] == "step") {
        replayed.push_back(records[i]["step"]);
        CHECK(records[i]["lr"].get<double>() == cosine_lr{0.1, 15}(records[i]["step"].get<std::int64_t>()));
      }
    CHECK(replayed == std::vector<std::int64_t>{6, 7, 8, 9, 10, 11, 12, 13, 14});
    const auto epochs = of_kind(records, "epoch");
    REQUIRE(epochs.size() == 3);
    CHECK(epochs[2]["epoch"] == 3);
    CHECK(epochs[2]["step"] == 15);

    // A fresh run given the same file starts it again.
    o.checkpoint.clear();
    o.steps = 2;
    auto fresh = users_graph();
    train(fresh, o);
    CHECK(read_metrics(o.metrics).size() == 1 + 2 + 1);
  }

  TEST_CASE("resuming from a weights-only file says what is missing") {
    tiny_fashion_mnist data(64, 10);
    auto g = users_graph();
    save_weights(g, data.dir / "w.safetensors", "users");
    CHECK_THROWS_WITH_AS(resume_options(data.dir / "w.safetensors"), doctest::Contains("no training state in it"),
                         std::invalid_argument);
  }
}

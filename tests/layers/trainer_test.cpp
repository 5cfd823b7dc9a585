// The one trainer: what it asks of any engine (steps, rates, evaluation, finish), and a
// user's own graph trained through it.
#include <doctest/doctest.h>

#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "layers/activation.hpp"
#include "layers/data/idx.hpp"
#include "layers/join.hpp"
#include "layers/linear.hpp"
#include "layers/lr_schedule.hpp"
#include "layers/trainer.hpp"

using namespace nerve;
using namespace nerve::layers;

namespace {

/// A Fashion-MNIST-shaped data directory with `train` and `test` random samples.
struct tiny_fashion_mnist {
  std::filesystem::path dir;
  tiny_fashion_mnist(std::size_t train, std::size_t test) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "nerve-trainer-XXXXXX").string();
    dir = ::mkdtemp(tmpl.data());
    std::mt19937 rng(1);
    write("train", train, rng);
    write("t10k", test, rng);
  }
  ~tiny_fashion_mnist() { std::filesystem::remove_all(dir); }
  void write(const std::string& prefix, std::size_t n, std::mt19937& rng) {
    std::vector<std::uint8_t> px(n * 28 * 28), lab(n);
    for (auto& p : px) p = static_cast<std::uint8_t>(rng() % 256);
    for (auto& l : lab) l = static_cast<std::uint8_t>(rng() % 10);
    std::vector<std::size_t> ishape{n, 28, 28}, lshape{n};
    put(prefix + "-images-idx3-ubyte", data::encode_idx<std::uint8_t>(ishape, px));
    put(prefix + "-labels-idx1-ubyte", data::encode_idx<std::uint8_t>(lshape, lab));
  }
  void put(const std::string& name, const std::vector<std::byte>& bytes) {
    std::ofstream(dir / name, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  }
};

/// What the trainer asked of an engine (it outlives the engine, which train() destroys).
struct engine_log {
  std::vector<double> rates;
  std::vector<std::uint64_t> steps;
  std::vector<std::int64_t> rows, eval_rows;
  int finished = 0;
  std::vector<double> losses;
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
    auto r = inner->train_step(std::move(x), std::move(y), m, step, lr).get();
    log.losses.push_back(r.loss);
    std::promise<step_result> p;
    p.set_value(r);
    return p.get_future();
  }
  std::future<step_result> evaluate(tensor x, targets y) override {
    log.eval_rows.push_back(x.batch());
    return inner->evaluate(std::move(x), std::move(y));
  }
  void finish() override {
    ++log.finished;
    inner->finish();
  }
};

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

  TEST_CASE("an unknown device names the engines this build has") {
    CHECK_THROWS_WITH_AS(engine_for("tpu:1"), doctest::Contains("unknown --device 'tpu:1' (this build has: cpu"),
                         std::invalid_argument);
    CHECK(engine_for("cpu"));
  }
}

// The apps on a trained model (issue #37): --init from a checkpoint, --evaluate and
// --predict on the engine, per-class figures in --json, --summary of every preset, and a
// finished run resumed to go further (or with nothing left to do).
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "layers/data/dataset.hpp"
#include "tests/apps/app_process.hpp"
#include "tests/layers/tiny_fashion_mnist.hpp"

namespace fs = std::filesystem;
using nerve::testing::run_app;
using nlohmann::json;

namespace {

const std::string train_app = NERVE_TRAIN_BIN, pipeline_app = NERVE_PIPELINE_BIN;

std::vector<std::string> cat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::string bytes_of(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

/// The app's one JSON object on stdout; fails the test (showing stderr) when it exited non-zero.
json json_of(const std::vector<std::string>& args) {
  const auto r = run_app(args);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  return json::parse(r.out);
}

/// Samples per class of the test split in `dir`.
std::vector<std::int64_t> class_sizes(const fs::path& dir) {
  std::vector<std::int64_t> n(10, 0);
  for (auto l : nerve::data::load_fashion_mnist(dir, nerve::data::split::test).labels) ++n[std::size_t(l)];
  return n;
}

}  // namespace

TEST_SUITE("apps.model") {
  TEST_CASE("nerve-train --init takes the weights out of a checkpoint") {
    nerve::testing::tiny_fashion_mnist data(256, 50);
    const auto dir = data.dir.string();
    const std::vector<std::string> base = {train_app, "--data", dir, "--model", "mlp", "--batch", "32", "--quiet"};
    REQUIRE(run_app(cat(base, {"--epochs", "1", "--checkpoint", dir + "/run.ck"})).exit_code == 0);
    const auto r = run_app(cat(base, {"--init", dir + "/run.ck", "--steps", "1", "--no-eval"}));
    INFO(r.err);
    CHECK(r.exit_code == 0);
  }

  TEST_CASE("nerve-train --evaluate gives bitwise the trained run's last evaluation, per class too") {
    nerve::testing::tiny_fashion_mnist data(256, 1300);
    const auto dir = data.dir.string();
    const auto trained = json_of({train_app, "--data", dir, "--model", "mlp", "--batch", "32", "--epochs", "2",
                                  "--save", dir + "/w.st", "--checkpoint", dir + "/run.ck", "--json", "--quiet"});
    const auto& last = trained["epochs"].back();
    const auto sizes = class_sizes(data.dir);
    REQUIRE(trained.contains("classes"));
    CHECK(trained["classes"]["samples"].get<std::vector<std::int64_t>>() == sizes);
    std::int64_t diagonal = 0;
    for (std::size_t t = 0; t < 10; ++t) {
      std::int64_t row = 0;
      for (auto c : trained["classes"]["confusion"][t]) row += c.get<std::int64_t>();
      CHECK(row == sizes[t]);  // each row: the samples of its true class
      diagonal += trained["classes"]["confusion"][t][t].get<std::int64_t>();
    }
    CHECK(double(diagonal) / 1300.0 == last["test_accuracy"].get<double>());
    for (const auto& weights : {dir + "/w.st", dir + "/run.ck"}) {
      CAPTURE(weights);
      const auto e = json_of({train_app, "--data", dir, "--model", "mlp", "--evaluate", "--init", weights, "--json"});
      CHECK(e["test_accuracy"] == last["test_accuracy"]);  // the JSON numbers, exactly
      CHECK(e["test_loss"] == last["test_loss"]);
      CHECK(e["samples"] == 1300);
      CHECK(e["classes"] == trained["classes"]);
    }
    // On a device's engine (the stand-in: the CPU playing a GPU), the same weights.
    const auto s = json_of({train_app, "--data", dir, "--model", "mlp", "--evaluate", "--init", dir + "/w.st",
                            "--device", "standin", "--json"});
    CHECK(s["device"] == "standin");
    CHECK(s["samples"] == 1300);
    CHECK(s["test_accuracy"].get<double>() == doctest::Approx(last["test_accuracy"].get<double>()).epsilon(0.01));
  }

  TEST_CASE("nerve-train --predict writes a row per test sample, as many right as the accuracy says") {
    nerve::testing::tiny_fashion_mnist data(256, 1100);
    const auto dir = data.dir.string();
    const auto trained = json_of({train_app, "--data", dir, "--model", "mlp", "--batch", "32", "--epochs", "1",
                                  "--save", dir + "/w.st", "--json", "--quiet"});
    const double accuracy = trained["epochs"].back()["test_accuracy"];
    const auto r = run_app({train_app, "--data", dir, "--model", "mlp", "--predict", dir + "/p.csv", "--init", dir + "/w.st"});
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    CHECK(r.out.find("predictions written to " + dir + "/p.csv") != std::string::npos);
    const auto labels = nerve::data::load_fashion_mnist(data.dir, nerve::data::split::test).labels;
    std::ifstream in(dir + "/p.csv");
    std::string line;
    REQUIRE(std::getline(in, line));
    CHECK(line == "index,predicted,p0,p1,p2,p3,p4,p5,p6,p7,p8,p9");
    std::size_t rows = 0;
    std::int64_t right = 0;
    while (std::getline(in, line)) {
      std::stringstream fields(line);
      std::string index, predicted;
      std::getline(fields, index, ',');
      std::getline(fields, predicted, ',');
      CHECK(std::stoul(index) == rows);
      right += std::stoi(predicted) == labels[rows];
      ++rows;
    }
    CHECK(rows == 1100);
    CHECK(right == std::llround(accuracy * 1100));
  }

  TEST_CASE("--evaluate and --predict refuse training options and a run without weights, naming the option") {
    nerve::testing::tiny_fashion_mnist data(64, 10);
    const auto dir = data.dir.string();
    const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
        {{train_app, "--evaluate"}, "nerve-train: --evaluate needs --init FILE"},
        {{train_app, "--predict", dir + "/p.csv"}, "nerve-train: --predict needs --init FILE"},
        {{train_app, "--evaluate", "--init", dir + "/w", "--epochs", "2"},
         "nerve-train: --epochs cannot be given with --evaluate: nothing is trained"},
        {{train_app, "--evaluate", "--init", dir + "/w", "--resume", dir + "/w"},
         "nerve-train: --resume cannot be given with --evaluate"},
        {{train_app, "--evaluate", "--init", dir + "/w", "--replicas", "2"},
         "nerve-train: --replicas cannot be given with --evaluate"},
        {{pipeline_app, "--evaluate", "--lr", "0.1", "--init", dir + "/w"},
         "nerve-pipeline: --lr cannot be given with --evaluate: nothing is trained"},
        {{pipeline_app, "--evaluate"}, "nerve-pipeline: --evaluate needs --init FILE"},
        {{train_app, "--predict", dir, "--init", dir + "/w"},
         "nerve-train: --predict '" + dir + "' is a directory, not a regular file"},
        {{train_app, "--predict", dir + "/w", "--init", dir + "/w"}, "nerve-train: --predict '" + dir + "/w' is the file --init names"},
    };
    for (const auto& [args, want] : cases) {
      CAPTURE(args);
      const auto r = run_app(cat(args, {"--data", dir}));
      CHECK(r.exit_code == 1);
      CHECK(r.err.rfind(want, 0) == 0);
      CHECK(r.out.empty());
    }
  }

  TEST_CASE("nerve-pipeline --evaluate on its stages gives the trained run's last evaluation") {
    nerve::testing::tiny_fashion_mnist data(256, 300);
    const auto dir = data.dir.string();
    const std::vector<std::string> cut = {pipeline_app, "--data", dir, "--model", "mlp", "--stages", "2",
                                          "--microbatches", "2"};
    const auto trained = json_of(cat(cut, {"--batch", "32", "--epochs", "1", "--save", dir + "/w.st", "--json", "--quiet"}));
    const auto e = json_of(cat(cut, {"--evaluate", "--init", dir + "/w.st", "--json"}));
    CHECK(e["test_accuracy"] == trained["epochs"].back()["test_accuracy"]);
    CHECK(e["test_loss"] == trained["epochs"].back()["test_loss"]);
    CHECK(e["classes"]["samples"].get<std::vector<std::int64_t>>() == class_sizes(data.dir));
  }

  TEST_CASE("--summary of every preset lists the hand-counted parameters, in both apps") {
    // Linear: out x in + out; Conv2d: out x in x k x k + out.
    const std::vector<std::pair<std::string, std::int64_t>> presets = {
        {"mlp", (784 * 256 + 256) + (256 * 10 + 10)},                                           // 203,530
        {"deep-mlp", (784 * 1024 + 1024) + 3 * (1024 * 1024 + 1024) + (1024 * 10 + 10)},        // 3,962,890
        {"lenet", (6 * 25 + 6) + (16 * 6 * 25 + 16) + (400 * 120 + 120) + (120 * 84 + 84) + (84 * 10 + 10)},  // 61,706
        {"resmlp", (784 * 256 + 256) + 4 * (256 * 256 + 256) + (256 * 10 + 10)},                // 466,698
    };
    for (const auto& [model, parameters] : presets) {
      CAPTURE(model);
      const auto t = json_of({train_app, "--model", model, "--summary", "--json"});
      CHECK(t["parameters"] == parameters);
      std::int64_t summed = 0;
      for (const auto& n : t["nodes"]) summed += n["parameters"].get<std::int64_t>();
      CHECK(summed == parameters);
      CHECK(t["nodes"][1]["place"] == "loop 0");
      const auto p = json_of({pipeline_app, "--model", model, "--stages", "2", "--summary", "--json"});
      CHECK(p["parameters"] == parameters);
      CHECK(p["nodes"][1]["place"] == "stage 0 (cpu)");
      CHECK(p["nodes"].back()["place"] == "stage 1 (cpu)");
    }
    // Text: a line per node and the totals.
    const auto r = run_app({train_app, "--model", "mlp", "--batch", "64", "--microbatches", "2", "--summary"});
    CHECK(r.exit_code == 0);
    CHECK(r.out.find("fc1    Linear  [256]      200,960") != std::string::npos);
    CHECK(r.out.find("stash/micro-batch of 32") != std::string::npos);
    CHECK(r.out.find("parameters 203,530") != std::string::npos);
  }

  TEST_CASE("the banner before training shows the model's totals") {
    nerve::testing::tiny_fashion_mnist data(64, 10);
    const auto r = run_app({train_app, "--data", data.dir.string(), "--steps", "1", "--batch", "32", "--quiet"});
    CHECK(r.exit_code == 0);
    CHECK(r.out.find("model: 203,530 parameters (795.0 KiB), stash ") != std::string::npos);
  }

  TEST_CASE("a finished run resumed with more --epochs or --steps ends with the bytes of one longer run") {
    nerve::testing::tiny_fashion_mnist data(600, 50);  // 19 steps an epoch at batch 32
    const auto dir = data.dir.string();
    const std::vector<std::string> base = {train_app, "--data", dir, "--model", "mlp", "--batch", "32",
                                           "--microbatches", "2", "--lr", "0.05", "--quiet"};
    REQUIRE(run_app(cat(base, {"--epochs", "3", "--save", dir + "/long.st"})).exit_code == 0);
    REQUIRE(run_app(cat(base, {"--epochs", "3", "--steps", "45", "--save", dir + "/long45.st"})).exit_code == 0);

    // 1 epoch, then raised to 3.
    REQUIRE(run_app(cat(base, {"--epochs", "1", "--checkpoint", dir + "/a.ck"})).exit_code == 0);
    auto r = run_app({train_app, "--resume", dir + "/a.ck", "--epochs", "3", "--save", dir + "/a.st", "--quiet"});
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    CHECK(bytes_of(dir + "/a.st") == bytes_of(dir + "/long.st"));

    // Cut by --steps 10 inside the first epoch, then raised to 45 steps and 3 epochs: the
    // extended run takes the batches the longer run took, in the same epochs.
    REQUIRE(run_app(cat(base, {"--epochs", "1", "--steps", "10", "--checkpoint", dir + "/b.ck"})).exit_code == 0);
    r = run_app({train_app, "--resume", dir + "/b.ck", "--epochs", "3", "--steps", "45", "--save", dir + "/b.st",
                 "--quiet"});
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    CHECK(bytes_of(dir + "/b.st") == bytes_of(dir + "/long45.st"));
  }

  TEST_CASE("nerve-pipeline: a finished run resumed with more --epochs ends with the bytes of one longer run") {
    nerve::testing::tiny_fashion_mnist data(300, 20);
    const auto dir = data.dir.string();
    const std::vector<std::string> base = {pipeline_app, "--data", dir, "--model", "mlp", "--stages", "2",
                                           "--microbatches", "2", "--batch", "32", "--quiet"};
    REQUIRE(run_app(cat(base, {"--epochs", "2", "--save", dir + "/long.st"})).exit_code == 0);
    REQUIRE(run_app(cat(base, {"--epochs", "1", "--checkpoint", dir + "/run.ck"})).exit_code == 0);
    auto r = run_app({pipeline_app, "--resume", dir + "/run.ck", "--quiet"});
    CHECK(r.exit_code == 0);
    CHECK(r.out.find("nerve-pipeline: the run in " + dir + "/run.ck has ended (1 epoch, 10 steps): nothing left to do") !=
          std::string::npos);
    r = run_app({pipeline_app, "--resume", dir + "/run.ck", "--epochs", "2", "--save", dir + "/ext.st", "--quiet"});
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    CHECK(bytes_of(dir + "/ext.st") == bytes_of(dir + "/long.st"));
  }

  TEST_CASE("resuming a run with nothing left says so, exits 0 and writes no second run to its files") {
    nerve::testing::tiny_fashion_mnist data(200, 20);
    const auto dir = data.dir.string();
    REQUIRE(run_app({train_app, "--data", dir, "--model", "mlp", "--batch", "32", "--epochs", "1", "--checkpoint",
                     dir + "/run.ck", "--metrics", dir + "/m.jsonl", "--quiet"})
                .exit_code == 0);
    const auto metrics = bytes_of(dir + "/m.jsonl"), checkpoint = bytes_of(dir + "/run.ck");
    const auto r = run_app({train_app, "--resume", dir + "/run.ck", "--metrics", dir + "/m.jsonl", "--quiet"});
    INFO(r.err);
    CHECK(r.exit_code == 0);
    CHECK(r.out.find("nerve-train: the run in " + dir + "/run.ck has ended (1 epoch, 7 steps): nothing left to do") !=
          std::string::npos);
    CHECK(r.out.find("metrics written") == std::string::npos);
    CHECK(bytes_of(dir + "/m.jsonl") == metrics);  // no second "run" record
    CHECK(bytes_of(dir + "/run.ck") == checkpoint);
    const auto j = json_of({train_app, "--resume", dir + "/run.ck", "--json"});
    CHECK(j.value("nothing_left", false));
    CHECK(j["steps"] == 7);
    CHECK(bytes_of(dir + "/run.ck") == checkpoint);
  }

  TEST_CASE("a resume may not shorten a run, nor stretch a schedule that spans its steps") {
    nerve::testing::tiny_fashion_mnist data(200, 20);
    const auto dir = data.dir.string();
    REQUIRE(run_app({train_app, "--data", dir, "--model", "mlp", "--batch", "32", "--epochs", "2", "--schedule",
                     "cosine", "--checkpoint", dir + "/run.ck", "--quiet"})
                .exit_code == 0);
    const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
        {{"--epochs", "1"}, "nerve-train: --epochs 1 is below the checkpoint's 2: a resumed run may be extended, not shortened"},
        {{"--steps", "5"}, "nerve-train: --steps 5 is below the checkpoint's limit (none: its epochs end it)"},
        {{"--epochs", "3"},
         "nerve-train: --epochs 3 would extend the run from 14 to 21 steps, but its --schedule cosine spans the 14 "
         "steps it was started for"},
        {{"--epochs", "0"}, "nerve-train: --epochs must be at least 1 (got 0)"},
        {{"--steps", "0"}, "nerve-train: --steps must be at least 1 (got 0)"},
    };
    for (const auto& [extra, want] : cases) {
      CAPTURE(extra);
      const auto r = run_app(cat({train_app, "--resume", dir + "/run.ck", "--quiet"}, extra));
      CHECK(r.exit_code == 1);
      CHECK(r.err.find(want) != std::string::npos);
    }
  }
}

// nerve-train and nerve-pipeline on .npy files this test writes: an augmented run stopped
// and resumed ends with the uninterrupted run's bits, the pipeline's stages end with
// nerve-train's bits, and the own-data options' refusals, word for word, in both apps.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "layers/data/npy.hpp"

#include <nlohmann/json.hpp>

namespace fs = std::filesystem;

namespace {

std::string own_data_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

/// What a run of nerve-train with `args` did: its exit status, its stderr and its stdout.
struct own_data_run {
  int status = -1;
  std::string err, out;
};

/// Runs the app `bin` with `args` to its end (stdout to `dir/stdout`, stderr to `dir/err`).
own_data_run run_own_data_app(std::string bin, const fs::path& dir, const std::vector<std::string>& args) {
  std::vector<std::string> copy = args;
  std::vector<char*> argv{bin.data()};
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  const fs::path err = dir / "err", out = dir / "stdout";
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(o, 1);
    ::dup2(e, 2);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) REQUIRE(errno == EINTR);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status), own_data_bytes(err), own_data_bytes(out)};
}

own_data_run run_nerve_train(const fs::path& dir, const std::vector<std::string>& args) {
  return run_own_data_app(NERVE_TRAIN_BIN, dir, args);
}

own_data_run run_nerve_pipeline(const fs::path& dir, const std::vector<std::string>& args) {
  return run_own_data_app(NERVE_PIPELINE_BIN, dir, args);
}

/// A folder of .npy files: `n` images of 1×8×8 floats in three classes (a bright square in
/// one of three places, plus noise), inputs and labels as np.save writes them.
struct own_data_folder {
  fs::path dir;
  own_data_folder() {
    std::string tmpl = (fs::temp_directory_path() / "nerve-own-data-XXXXXX").string();
    dir = ::mkdtemp(tmpl.data());
    write("train", 96, 1);
    write("test", 32, 2);
  }
  ~own_data_folder() { fs::remove_all(dir); }
  own_data_folder(const own_data_folder&) = delete;
  own_data_folder& operator=(const own_data_folder&) = delete;
  void write(const std::string& name, std::size_t n, unsigned seed) const {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> noise(0.0f, 0.3f);
    std::vector<float> x(n * 64);
    std::vector<std::int64_t> y(n);
    for (std::size_t i = 0; i < n; ++i) {
      y[i] = std::int64_t(rng() % 3);
      for (std::size_t k = 0; k < 64; ++k) x[i * 64 + k] = noise(rng);
      const std::size_t r0 = 1 + 2 * std::size_t(y[i]);
      for (std::size_t r = r0; r < r0 + 2; ++r)
        for (std::size_t c = 2; c < 6; ++c) x[i * 64 + r * 8 + c] += 1.0f;
    }
    const std::vector<std::size_t> xs{n, 1, 8, 8}, ys{n};
    nerve::data::save_npy<float>(dir / (name + "_x.npy"), xs, x);
    nerve::data::save_npy<std::int64_t>(dir / (name + "_y.npy"), ys, y);
  }
  std::string pair(const std::string& name) const {
    return (dir / (name + "_x.npy")).string() + "," + (dir / (name + "_y.npy")).string();
  }
};


/// `first` (an app's run stopped at step 8 with a checkpoint at `dir`/ck) resumed to step
/// 12 by the same app, and again from a copy of the checkpoint with the data files moved
/// elsewhere and named anew: both save `want`'s bytes. The files are put back after.
template <class Run>
void check_resume_ends_with(const fs::path& dir, Run run, const std::vector<std::string>& first, const std::string& want) {
  const auto stopped = run(dir, first);
  REQUIRE_MESSAGE(stopped.status == 0, stopped.err);
  fs::copy_file(dir / "ck", dir / "ck-moved");
  const auto rest = run(dir, {"--resume", (dir / "ck").string(), "--steps", "12", "--save", (dir / "out").string(), "--quiet"});
  REQUIRE_MESSAGE(rest.status == 0, rest.err);
  CHECK(own_data_bytes(dir / "out") == want);
  fs::create_directory(dir / "moved");
  for (const char* f : {"train_x.npy", "train_y.npy", "test_x.npy", "test_y.npy"}) fs::rename(dir / f, dir / "moved" / f);
  const auto moved = run(
      dir, {"--resume", (dir / "ck-moved").string(), "--steps", "12", "--save", (dir / "out-moved").string(),
            "--train-data", (dir / "moved/train_x.npy").string() + "," + (dir / "moved/train_y.npy").string(),
            "--test-data", (dir / "moved/test_x.npy").string() + "," + (dir / "moved/test_y.npy").string(), "--quiet"});
  REQUIRE_MESSAGE(moved.status == 0, moved.err);
  CHECK(own_data_bytes(dir / "out-moved") == want);
  for (const char* f : {"train_x.npy", "train_y.npy", "test_x.npy", "test_y.npy"}) fs::rename(dir / "moved" / f, dir / f);
}
}  // namespace

TEST_SUITE("train.own_data") {
  TEST_CASE("an augmented run on .npy files stopped mid-epoch and resumed ends with the uninterrupted run's bits") {
    own_data_folder data;
    const fs::path dir = data.dir;
    // 6 steps an epoch, two epochs: the stop falls inside the second, after an evaluation.
    const std::vector<std::string> run = {"--train-data", data.pair("train"), "--test-data", data.pair("test"),
                                          "--model", "mlp", "--epochs", "2", "--batch", "16", "--lr", "0.05",
                                          "--momentum", "0.9", "--augment", "crop=2,flip", "--seed", "3", "--quiet"};
    auto with = [&](std::vector<std::string> extra) {
      auto a = run;
      a.insert(a.end(), extra.begin(), extra.end());
      return a;
    };
    const auto whole = run_nerve_train(dir, with({"--save", (dir / "want").string()}));
    REQUIRE_MESSAGE(whole.status == 0, whole.err);
    const std::string want = own_data_bytes(dir / "want");
    REQUIRE(!want.empty());

    // Stopped at step 8 and resumed; then from a copy with the files moved elsewhere and
    // given again beside --resume: both runs end the same.
    check_resume_ends_with(dir, run_nerve_train, with({"--steps", "8", "--checkpoint", (dir / "ck").string()}), want);

    // The augmentation is at work: without it the weights differ.
    std::vector<std::string> plain = run;
    plain.erase(plain.begin() + 14, plain.begin() + 16);  // "--augment", "crop=2,flip"
    REQUIRE(plain.size() == run.size() - 2);
    const auto unaugmented = run_nerve_train(dir, [&] {
      auto a = plain;
      a.insert(a.end(), {"--save", (dir / "plain").string()});
      return a;
    }());
    REQUIRE_MESSAGE(unaugmented.status == 0, unaugmented.err);
    CHECK(own_data_bytes(dir / "plain") != want);
  }

  TEST_CASE("--evaluate on --test-data gives the trained run's last test figures, the classes the weights'") {
    own_data_folder data;
    const fs::path dir = data.dir;
    const auto trained = run_nerve_train(dir, {"--train-data", data.pair("train"), "--test-data", data.pair("test"),
                                               "--epochs", "2", "--batch", "16", "--augment", "flip", "--json",
                                               "--save", (dir / "w").string()});
    REQUIRE_MESSAGE(trained.status == 0, trained.err);
    const auto t = nlohmann::json::parse(trained.out);
    const auto evaluated = run_nerve_train(
        dir, {"--evaluate", "--init", (dir / "w").string(), "--test-data", data.pair("test"), "--json"});
    REQUIRE_MESSAGE(evaluated.status == 0, evaluated.err);
    const auto e = nlohmann::json::parse(evaluated.out);
    CHECK(e["test_accuracy"] == t["epochs"].back()["test_accuracy"]);
    CHECK(e["test_loss"] == t["epochs"].back()["test_loss"]);
    CHECK(e["samples"] == 32);
    CHECK(e["classes"]["samples"].size() == 3);
    // A test set whose labels stop short of the weights' last class is still evaluated in
    // their three classes; one whose labels go past them is refused.
    const std::vector<std::size_t> xs{2, 1, 8, 8}, ys{2};
    const std::vector<float> x(128, 0.0f);
    const std::vector<std::int64_t> low = {0, 1}, high = {0, 3};
    nerve::data::save_npy<float>(dir / "two_x.npy", xs, x);
    nerve::data::save_npy<std::int64_t>(dir / "low_y.npy", ys, low);
    nerve::data::save_npy<std::int64_t>(dir / "high_y.npy", ys, high);
    const auto short_of = run_nerve_train(dir, {"--evaluate", "--init", (dir / "w").string(), "--test-data",
                                                (dir / "two_x.npy").string() + "," + (dir / "low_y.npy").string(), "--json"});
    REQUIRE_MESSAGE(short_of.status == 0, short_of.err);
    CHECK(nlohmann::json::parse(short_of.out)["classes"]["samples"].size() == 3);
    const auto past = run_nerve_train(dir, {"--evaluate", "--init", (dir / "w").string(), "--test-data",
                                            (dir / "two_x.npy").string() + "," + (dir / "high_y.npy").string()});
    CHECK(past.status == 1);
    CHECK(past.err == "nerve-train: " + (dir / "high_y.npy").string() +
                          ": at byte 136: label 3 of sample 1 is out of range for 3 classes\n");
    const auto with_train = run_nerve_train(
        dir, {"--evaluate", "--init", (dir / "w").string(), "--train-data", data.pair("train")});
    CHECK(with_train.err ==
          "nerve-train: --train-data cannot be given with --evaluate: nothing is trained (--test-data names the data to "
          "evaluate on)\n");
  }

  TEST_CASE("nerve-train refuses own data it cannot use, naming the option or the file") {
    own_data_folder data;
    const fs::path dir = data.dir;
    const std::string train = data.pair("train"), test = data.pair("test");
    auto refusal = [&](const std::vector<std::string>& args) {
      auto r = run_nerve_train(dir, args);
      CHECK(r.status == 1);
      return r.err;
    };
    CHECK(refusal({"--data", dir.string(), "--train-data", train, "--test-data", test}) ==
          "nerve-train: --data cannot be given with --train-data: --data names Fashion-MNIST's directory, "
          "--train-data and --test-data your own .npy files\n");
    CHECK(refusal({"--test-data", test}) ==
          "nerve-train: --test-data needs --train-data: the run would train on Fashion-MNIST and test on your data\n");
    CHECK(refusal({"--train-data", train}) ==
          "nerve-train: --train-data needs --test-data INPUTS.npy,LABELS.npy to evaluate on (or --no-eval)\n");
    CHECK(refusal({"--train-data", (dir / "train_x.npy").string(), "--no-eval"}) ==
          "nerve-train: --train-data '" + (dir / "train_x.npy").string() + "': give two files, INPUTS.npy,LABELS.npy\n");
    CHECK(refusal({"--train-data", (dir / "none.npy").string() + "," + (dir / "train_y.npy").string(), "--no-eval"}) ==
          "nerve-train: --train-data: '" + (dir / "none.npy").string() + "' does not exist\n");
    CHECK(refusal({"--train-data", train, "--test-data", test, "--augment", "crop=4,mirror"}) ==
          "nerve-train: --augment 'crop=4,mirror': unknown 'mirror' (crop=N: a random crop after zero padding by N; "
          "flip: a random horizontal flip)\n");
    CHECK(refusal({"--train-data", train, "--test-data", test, "--augment", "crop=9"}) ==
          "nerve-train: --augment crop=9: the padding must be at most 8, the smaller side of the data's samples of "
          "[1, 8, 8]\n");
    CHECK(refusal({"--train-data", train, "--test-data", test, "--model", "lenet"}) ==
          "nerve-train: model 'lenet' takes samples of [1, 28, 28] but the data's are [1, 8, 8] (mlp, deep-mlp and "
          "resmlp take samples of any shape)\n");
    SUBCASE("samples that are no images cannot be augmented") {
      const std::vector<std::size_t> xs{4, 5}, ys{4};
      const std::vector<float> x(20, 0.5f);
      const std::vector<std::int64_t> y = {0, 1, 0, 1};
      nerve::data::save_npy<float>(dir / "flat_x.npy", xs, x);
      nerve::data::save_npy<std::int64_t>(dir / "flat_y.npy", ys, y);
      const std::string flat = (dir / "flat_x.npy").string() + "," + (dir / "flat_y.npy").string();
      CHECK(refusal({"--train-data", flat, "--no-eval", "--augment", "flip"}) ==
            "nerve-train: --augment flip crops and flips images, samples of C×H×W; the data's are [5]\n");
    }
    SUBCASE("a test label beyond the training data's classes names the file and the sample") {
      const std::vector<std::size_t> xs{2, 1, 8, 8}, ys{2};
      const std::vector<float> x(128, 0.0f);
      const std::vector<std::int64_t> y = {1, 3};
      nerve::data::save_npy<float>(dir / "odd_x.npy", xs, x);
      nerve::data::save_npy<std::int64_t>(dir / "odd_y.npy", ys, y);
      const std::string odd = (dir / "odd_x.npy").string() + "," + (dir / "odd_y.npy").string();
      CHECK(refusal({"--train-data", train, "--test-data", odd}) ==
            "nerve-train: " + (dir / "odd_y.npy").string() + ": at byte 136: label 3 of sample 1 is out of range for 3 classes\n");
    }
    SUBCASE("--augment beside --resume") {
      REQUIRE(run_nerve_train(dir, {"--train-data", train, "--test-data", test, "--steps", "1", "--batch", "16",
                                    "--checkpoint", (dir / "ck").string(), "--quiet"})
                  .status == 0);
      CHECK(refusal({"--resume", (dir / "ck").string(), "--augment", "flip"}) ==
            "nerve-train: --augment cannot be given with --resume: the run goes on with the settings its checkpoint holds\n");
    }
  }

  TEST_CASE("nerve-pipeline on .npy files takes the data's shape and ends with nerve-train's bits, resumed too") {
    own_data_folder data;
    const fs::path dir = data.dir;
    // Samples of [1, 8, 8] in 3 classes: not Fashion-MNIST's [1, 28, 28] in 10. Two epochs of
    // 6 steps, each batch in 4 micro-batches: nerve-train accumulates them on one network,
    // nerve-pipeline runs them through 2 stages; the weights are the same bits.
    const std::vector<std::string> run = {"--train-data", data.pair("train"), "--test-data", data.pair("test"),
                                          "--model", "mlp", "--epochs", "2", "--batch", "16", "--microbatches", "4",
                                          "--lr", "0.05", "--momentum", "0.9", "--augment", "crop=2,flip", "--seed",
                                          "3", "--quiet"};
    auto with = [&](std::vector<std::string> extra) {
      auto a = run;
      a.insert(a.end(), extra.begin(), extra.end());
      return a;
    };
    const auto train = run_nerve_train(dir, with({"--save", (dir / "train.st").string(), "--json"}));
    REQUIRE_MESSAGE(train.status == 0, train.err);
    const std::string want = own_data_bytes(dir / "train.st");
    REQUIRE(!want.empty());
    const auto piped = run_nerve_pipeline(dir, with({"--stages", "2", "--save", (dir / "pipe.st").string(), "--json"}));
    REQUIRE_MESSAGE(piped.status == 0, piped.err);
    CHECK(own_data_bytes(dir / "pipe.st") == want);
    const auto t = nlohmann::json::parse(train.out), p = nlohmann::json::parse(piped.out);
    REQUIRE(p["epochs"].size() == 2);
    REQUIRE(t["epochs"].size() == 2);
    // The same predictions; the reported losses may differ in their last bits, as a
    // pipelined step's loss may (docs/pipeline.md, "Why the weights are the same bits").
    for (std::size_t e = 0; e < 2; ++e) {
      CAPTURE(e);
      CHECK(p["epochs"][e]["test_accuracy"] == t["epochs"][e]["test_accuracy"]);
      CHECK(p["epochs"][e]["train_accuracy"] == t["epochs"][e]["train_accuracy"]);
      CHECK(p["epochs"][e]["test_loss"].get<double>() ==
            doctest::Approx(t["epochs"][e]["test_loss"].get<double>()).epsilon(1e-6));
      CHECK(p["epochs"][e]["train_loss"].get<double>() ==
            doctest::Approx(t["epochs"][e]["train_loss"].get<double>()).epsilon(1e-6));
    }

    // The banner names the data's shape and classes, as nerve-train's does.
    const auto shown = run_nerve_pipeline(dir, with({"--stages", "2", "--steps", "1"}));
    REQUIRE_MESSAGE(shown.status == 0, shown.err);
    CHECK(shown.out.find("data: " + (dir / "train_x.npy").string() +
                         ", 96 samples of [1, 8, 8] in 3 classes, augmented: crop=2,flip\n") != std::string::npos);

    // Stopped inside the second epoch and resumed (the checkpoint keeps the files and the
    // augmentation), then again from a copy with the files moved and named anew.
    check_resume_ends_with(dir, run_nerve_pipeline,
                           with({"--stages", "2", "--steps", "8", "--checkpoint", (dir / "ck").string()}), want);

    // --evaluate on its stages, on --test-data: the trained run's last test figures.
    const auto evaluated = run_nerve_pipeline(dir, {"--evaluate", "--init", (dir / "pipe.st").string(), "--model", "mlp",
                                                    "--stages", "2", "--test-data", data.pair("test"), "--json"});
    REQUIRE_MESSAGE(evaluated.status == 0, evaluated.err);
    const auto e = nlohmann::json::parse(evaluated.out);
    CHECK(e["test_loss"] == p["epochs"].back()["test_loss"]);
    CHECK(e["test_accuracy"] == p["epochs"].back()["test_accuracy"]);
    CHECK(e["samples"] == 32);
    CHECK(e["classes"]["samples"].size() == 3);
  }

  TEST_CASE("nerve-pipeline refuses own data as nerve-train does, word for word") {
    own_data_folder data;
    const fs::path dir = data.dir;
    const std::string train = data.pair("train"), test = data.pair("test");
    // Each refusal of nerve-pipeline is nerve-train's, under the pipeline's name.
    auto both = [&](const std::vector<std::string>& args, const std::string& want) {
      CAPTURE(want);
      const auto t = run_nerve_train(dir, args), p = run_nerve_pipeline(dir, args);
      CHECK(t.status == 1);
      CHECK(p.status == 1);
      CHECK(t.err == "nerve-train: " + want + "\n");
      CHECK(p.err == "nerve-pipeline: " + want + "\n");
    };
    both({"--data", dir.string(), "--train-data", train, "--test-data", test},
         "--data cannot be given with --train-data: --data names Fashion-MNIST's directory, --train-data and "
         "--test-data your own .npy files");
    both({"--data", dir.string(), "--test-data", test},
         "--data cannot be given with --test-data: --data names Fashion-MNIST's directory, --train-data and "
         "--test-data your own .npy files");
    both({"--test-data", test},
         "--test-data needs --train-data: the run would train on Fashion-MNIST and test on your data");
    both({"--train-data", train}, "--train-data needs --test-data INPUTS.npy,LABELS.npy to evaluate on (or --no-eval)");
    both({"--train-data", (dir / "train_x.npy").string(), "--no-eval"},
         "--train-data '" + (dir / "train_x.npy").string() + "': give two files, INPUTS.npy,LABELS.npy");
    both({"--train-data", (dir / "none.npy").string() + "," + (dir / "train_y.npy").string(), "--no-eval"},
         "--train-data: '" + (dir / "none.npy").string() + "' does not exist");
    both({"--train-data", train, "--test-data", (dir / "test_x.npy").string() + "," + dir.string()},
         "--test-data: '" + dir.string() + "' is not a regular file");
    both({"--train-data", train, "--test-data", test, "--augment", "crop=4,mirror"},
         "--augment 'crop=4,mirror': unknown 'mirror' (crop=N: a random crop after zero padding by N; flip: a random "
         "horizontal flip)");
    both({"--train-data", train, "--test-data", test, "--augment", "crop=9"},
         "--augment crop=9: the padding must be at most 8, the smaller side of the data's samples of [1, 8, 8]");
    both({"--train-data", train, "--test-data", test, "--model", "lenet"},
         "model 'lenet' takes samples of [1, 28, 28] but the data's are [1, 8, 8] (mlp, deep-mlp and resmlp take "
         "samples of any shape)");
    both({"--evaluate", "--init", (dir / "w").string(), "--train-data", train},
         "--train-data cannot be given with --evaluate: nothing is trained (--test-data names the data to evaluate on)");
    both({"--predict", (dir / "p.csv").string(), "--init", (dir / "w").string(), "--augment", "flip"},
         "--augment cannot be given with --predict: nothing is trained (--test-data names the data to evaluate on)");
    both({"--evaluate", "--init", (dir / "w").string(), "--data", dir.string(), "--test-data", test},
         "--data cannot be given with --test-data: --data names Fashion-MNIST's directory, --test-data your own .npy "
         "files");
    // Beside --resume: the checkpoint's augmentation holds; a Fashion-MNIST run takes no files.
    REQUIRE(run_nerve_pipeline(dir, {"--train-data", train, "--test-data", test, "--steps", "1", "--batch", "16",
                                     "--checkpoint", (dir / "ck").string(), "--quiet"})
                .status == 0);
    const auto augment = run_nerve_pipeline(dir, {"--resume", (dir / "ck").string(), "--augment", "flip"});
    CHECK(augment.status == 1);
    CHECK(augment.err == "nerve-pipeline: --augment cannot be given with --resume: the run goes on with the settings "
                         "its checkpoint holds\n");
  }
}

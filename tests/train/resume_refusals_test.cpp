// nerve-train and nerve-pipeline resumed from checkpoints that are damaged or forged (a
// field of the training state rewritten, a NaN put into a weight) or written by the other
// app: each is refused before a step, in one line naming the checkpoint and the field,
// never run with the value wrapped, nor crashed.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "layers/checkpoint/checkpoint.hpp"
#include "tests/layers/tiny_fashion_mnist.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct outcome {
  int status = 0;  ///< the exit status, or -signal when a signal ended it
  std::string err;
};

/// Runs `bin` with `args`, stdout to /dev/null, stderr into a file read back at its end.
outcome run(const std::string& bin, const std::vector<std::string>& args, const fs::path& scratch) {
  const fs::path err_file = scratch / "stderr.txt";
  std::vector<std::string> copy = args;
  std::vector<char*> argv{const_cast<char*>(bin.c_str())};
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    const int err = ::open(err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(null, 1);
    ::dup2(err, 2);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) REQUIRE(errno == EINTR);
  std::ifstream in(err_file);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status), {std::istreambuf_iterator<char>(in), {}}};
}

constexpr const char* state_key = "nerve.train_state";

/// Writes `to`: the checkpoint `from` with its training state changed by `edit`.
void forge(const fs::path& from, const fs::path& to, const std::function<void(json&)>& edit) {
  auto d = nerve::checkpoint::load_checkpoint(from);
  auto state = json::parse(d.metadata.at(state_key));
  edit(state);
  d.metadata[state_key] = state.dump();
  nerve::checkpoint::save_checkpoint(to, d);
}

/// The app's own settings (a JSON text inside the settings), edited as JSON.
std::function<void(json&)> app_setting(const std::string& field, json value) {
  return [=](json& state) {
    const auto text = state["settings"]["app"].get<std::string>();
    auto app = text.empty() ? json::object() : json::parse(text);
    app[field] = value;
    state["settings"]["app"] = app.dump();
  };
}

const std::string train_bin = NERVE_TRAIN_BIN, pipeline_bin = NERVE_PIPELINE_BIN;

struct forged_case {
  std::string what;
  std::function<void(json&)> edit;
  std::string message;  ///< what stderr must say
};

/// Resumes `bin` from `base` forged as each case says: status 1 and the case's message,
/// nothing written to --save.
void check_refused(const std::string& bin, const fs::path& base, const std::vector<forged_case>& cases,
                   const fs::path& dir) {
  for (const auto& c : cases) {
    CAPTURE(c.what);
    const fs::path ck = dir / "forged.safetensors", out = dir / "forged-out.safetensors";
    fs::remove(out);
    forge(base, ck, c.edit);
    const auto r = run(bin, {"--resume", ck.string(), "--save", out.string(), "--quiet"}, dir);
    CAPTURE(r.err);
    CHECK(r.status == 1);
    CHECK(r.err.find(c.message) != std::string::npos);
    CHECK(r.err.find("json.exception") == std::string::npos);
    CHECK_FALSE(fs::exists(out));
  }
}

}  // namespace

TEST_SUITE("train.resume.refusals") {
  // Every checkpoint here is one epoch's of a run of one epoch, its settings then told it
  // has two: the checkpoint an uninterrupted two-epoch run writes after its first epoch
  // (with no learning-rate schedule the settings differ in nothing else), so a resume of
  // the unforged one trains a whole epoch.
  TEST_CASE("nerve-train refuses restored settings and a position out of range, naming the checkpoint and the field") {
    nerve::testing::tiny_fashion_mnist data(200, 20);
    const fs::path dir = data.dir, first = dir / "epoch1.safetensors", base = dir / "base.safetensors";
    for (std::string opt : {"sgd", "adam"}) {
      CAPTURE(opt);
      REQUIRE(run(train_bin, {"--data", dir.string(), "--model", "mlp", "--epochs", "1", "--batch", "32",
                              "--optimizer", opt, "--checkpoint", first.string(), "--quiet"}, dir).status == 0);
      forge(first, base, [](json& s) { s["settings"]["epochs"] = 2; });
      // The unforged checkpoint resumes (a copy: a resumed run writes its checkpoint on):
      // what is refused below is the forged field alone.
      fs::copy_file(base, dir / "ok.safetensors", fs::copy_options::overwrite_existing);
      const auto ok = run(train_bin, {"--resume", (dir / "ok.safetensors").string(), "--quiet"}, dir);
      CAPTURE(ok.err);
      REQUIRE(ok.status == 0);
      std::vector<forged_case> cases = {
          // Read as unsigned, -1 became 2^64-1: the seed the command line refuses.
          {"seed -1", [](json& s) { s["settings"]["seed"] = -1; },
           "the checkpoint's setting 'seed' is -1, not a whole number from 0 to 2^64-1"},
          // Read as unsigned, -256 became 1.8e19 and the run took no step.
          {"batch -256", [](json& s) { s["settings"]["batch"] = -256; },
           "the checkpoint's setting 'batch' is -256, not a whole number"},
          {"epochs 2.5", [](json& s) { s["settings"]["epochs"] = 2.5; },
           "the checkpoint's setting 'epochs' is 2.5, not a whole number"},
          {"threads 2^32 + 1", [](json& s) { s["settings"]["threads"] = 4294967297ull; },
           "the checkpoint's setting 'threads' is 4294967297, not a whole number"},
          {"lr 0", [](json& s) { s["settings"]["lr"] = 0; },
           "the checkpoint's setting 'lr' is refused: --lr must be a finite number above 0 (got 0)"},
          {"momentum as text", [](json& s) { s["settings"]["momentum"] = "0.9"; },
           "the checkpoint's setting 'momentum' is \"0.9\", not a number"},
          {"app settings not JSON", [](json& s) { s["settings"]["app"] = "{\"replicas\": "; },
           "the checkpoint's setting 'app' is not JSON"},
          {"replicas 0", app_setting("replicas", 0),
           "the checkpoint's setting 'replicas' is 0, not a whole number from 1 to 256"},
          // Step -1 ran 8 steps past the run's end; 1e300 overflowed the conversion.
          {"step -1", [](json& s) { s["position"]["step"] = -1; },
           "the checkpoint's position 'step' is -1, not a whole number from 0 to 2^63-1"},
          {"step 1e300", [](json& s) { s["position"]["step"] = 1e300; },
           "the checkpoint's position 'step' is 1e+300, not a whole number"},
          {"step 3 after a whole epoch of 7", [](json& s) { s["position"]["step"] = 3; },
           "the checkpoint's position 'step' is 3 but the finished epochs' 7 steps and this epoch's 0 make 7"},
          {"epoch 5 of 2", [](json& s) { s["position"]["epoch"] = 5; },
           "the checkpoint's position 'epoch' is 5, past the run's 2 epochs"},
          {"batch 99 of 7", [](json& s) { s["position"]["batch"] = 99; },
           "the checkpoint's position 'batch' is 99, past the 7 batches of an epoch"},
          // seen -5 and correct 1 reported an accuracy of -20%; correct above seen, 120%.
          {"seen -5", [](json& s) { s["position"]["seen"] = -5; },
           "the checkpoint's position 'seen' is -5, not a whole number from 0"},
          {"correct above seen", [](json& s) {
             s["position"]["batch"] = 1, s["position"]["epoch_steps"] = 1, s["position"]["step"] = 8;
             s["position"]["seen"] = 5, s["position"]["correct"] = 6;
           },
           "the checkpoint's position 'correct' is 6, more than the 5 samples seen"},
          {"a layer's steps -1", [](json& s) { s["optimizer_counters"]["fc1.steps"] = -1; },
           "the checkpoint's optimizer counter 'fc1.steps' is -1, not a whole number from 0 to 2^63-1"},
          {"a layer's steps past the position", [](json& s) { s["optimizer_counters"]["fc2.steps"] = 1000; },
           "the checkpoint's optimizer counter 'fc2.steps' is 1000, not between 0 and the position's step 7"},
      };
      if (opt == "adam")  // a bad Adam step counter was reported as a divergence of the run
        cases.push_back({"Adam's step -3", [](json& s) { s["optimizer_counters"]["fc1.weight.step"] = -3; },
                         "the checkpoint's optimizer counter 'fc1.weight.step' is -3"});
      check_refused(train_bin, base, cases, dir);
    }
    // One replica's threads cut its products: another count would end another run.
    const auto r = run(train_bin, {"--resume", base.string(), "--threads", "3", "--quiet"}, dir);
    CHECK(r.status == 1);
    CHECK(r.err.find("--threads 3 cannot replace the checkpoint's 1 for one replica") != std::string::npos);
  }

  TEST_CASE("a NaN in a checkpoint's weights is refused on resume as --init refuses it, naming the tensor") {
    nerve::testing::tiny_fashion_mnist data(200, 20);
    const fs::path dir = data.dir, first = dir / "epoch1.safetensors", base = dir / "base.safetensors";
    REQUIRE(run(train_bin, {"--data", dir.string(), "--model", "mlp", "--epochs", "1", "--batch", "32", "--checkpoint",
                            first.string(), "--quiet"}, dir).status == 0);
    forge(first, base, [](json& s) { s["settings"]["epochs"] = 2; });
    // One NaN in fc1.weight: behind the ReLU its unit is 0, the loss stays finite, and
    // the run used to end with status 0 and the NaN in --save.
    auto poison = [&](const fs::path& to, const std::string& tensor) {
      auto d = nerve::checkpoint::load_checkpoint(base);
      auto t = d.at(tensor);
      t.floats[3] = std::numeric_limits<float>::quiet_NaN();
      d.add(tensor, t.shape, t.floats);
      nerve::checkpoint::save_checkpoint(to, d);
    };
    const fs::path ck = dir / "nan.safetensors", out = dir / "out.safetensors";
    for (const std::string tensor : {"fc1.weight", "optimizer.fc2.bias.momentum_buffer"}) {
      CAPTURE(tensor);
      poison(ck, tensor);
      const auto r = run(train_bin, {"--resume", ck.string(), "--save", out.string(), "--quiet"}, dir);
      CAPTURE(r.err);
      CHECK(r.status == 1);
      CHECK(r.err.find("tensor '" + tensor + "' holds nan at element 3") != std::string::npos);
      CHECK_FALSE(fs::exists(out));
    }
    // A run that allows non-finite values (--allow-nonfinite, kept in its settings) loads them.
    forge(ck, ck, [](json& s) { s["settings"]["allow_nonfinite"] = true; });
    CHECK(run(train_bin, {"--resume", ck.string(), "--save", out.string(), "--quiet"}, dir).status == 0);
  }

  TEST_CASE("nerve-pipeline refuses app settings out of range, naming the checkpoint and the field, and does not crash") {
    nerve::testing::tiny_fashion_mnist data(160, 20);
    const fs::path dir = data.dir, first = dir / "epoch1.safetensors", base = dir / "base.safetensors";
    REQUIRE(run(pipeline_bin, {"--data", dir.string(), "--model", "mlp", "--stages", "2", "--microbatches", "2",
                               "--batch", "32", "--epochs", "1", "--schedule", "emergent", "--checkpoint",
                               first.string(), "--quiet"}, dir).status == 0);
    forge(first, base, [](json& s) { s["settings"]["epochs"] = 2; });
    fs::copy_file(base, dir / "ok.safetensors");
    REQUIRE(run(pipeline_bin, {"--resume", (dir / "ok.safetensors").string(), "--quiet"}, dir).status == 0);
    check_refused(pipeline_bin, base,
                  {
                      // Zero replicas made no graph to cut: SIGSEGV in partition_at.
                      {"replicas 0", app_setting("replicas", 0),
                       "the checkpoint's setting 'replicas' is 0, not a whole number from 1 to 256"},
                      {"replicas 1000", app_setting("replicas", 1000),
                       "the checkpoint's setting 'replicas' is 1000, not a whole number from 1 to 256"},
                      // Read as unsigned, -5 credits became 4294967291.
                      {"credits -5", app_setting("credits", -5),
                       "the checkpoint's setting 'credits' is -5, not a whole number from 0 to 4294967295"},
                      {"cut as a number", app_setting("cut", 3), "the checkpoint's setting 'cut' is 3, not text"},
                      {"a cut at no layer", app_setting("cut", "fc9"), "the checkpoint's setting 'cut' is refused"},
                      {"a plan that is no schedule", app_setting("plan", "stages banana"),
                       "the checkpoint's setting 'plan' is refused"},
                      {"app settings not JSON", [](json& s) { s["settings"]["app"] = "[1, "; },
                       "the checkpoint's setting 'app' is not JSON"},
                      {"seed -1", [](json& s) { s["settings"]["seed"] = -1; },
                       "the checkpoint's setting 'seed' is -1, not a whole number from 0 to 2^64-1"},
                      {"threads 0", [](json& s) { s["settings"]["threads"] = 0; },
                       "the checkpoint's setting 'threads' is refused: --threads must be between 1 and 256"},
                      {"step -1", [](json& s) { s["position"]["step"] = -1; },
                       "the checkpoint's position 'step' is -1"},
                  },
                  dir);
  }

  TEST_CASE("each app refuses to resume the other's checkpoint, naming the app that wrote it") {
    nerve::testing::tiny_fashion_mnist data(160, 20);
    const fs::path dir = data.dir, by_pipeline = dir / "pipeline.safetensors", by_train = dir / "train.safetensors";
    REQUIRE(run(pipeline_bin, {"--data", dir.string(), "--model", "mlp", "--stages", "2", "--microbatches", "4",
                               "--batch", "32", "--epochs", "1", "--checkpoint", by_pipeline.string(), "--quiet"}, dir)
                .status == 0);
    REQUIRE(run(train_bin, {"--data", dir.string(), "--model", "mlp", "--batch", "32", "--epochs", "1", "--checkpoint",
                            by_train.string(), "--quiet"}, dir).status == 0);
    const fs::path out = dir / "out.safetensors";
    // nerve-train went on without the pipeline's schedule, micro-batches and cut, status 0.
    auto r = run(train_bin, {"--resume", by_pipeline.string(), "--save", out.string(), "--quiet"}, dir);
    CHECK(r.status == 1);
    CHECK(r.err.find("--resume " + by_pipeline.string() + ": a checkpoint of nerve-pipeline, not of nerve-train: "
                     "resume it with nerve-pipeline") != std::string::npos);
    CHECK_FALSE(fs::exists(out));
    fs::remove(out);
    r = run(pipeline_bin, {"--resume", by_train.string(), "--save", out.string(), "--quiet"}, dir);
    CHECK(r.status == 1);
    CHECK(r.err.find("--resume " + by_train.string() + ": a checkpoint of nerve-train, not of nerve-pipeline: "
                     "resume it with nerve-train") != std::string::npos);
    CHECK_FALSE(fs::exists(out));
    // A checkpoint written before the apps named themselves: a schedule marks the pipeline's.
    forge(by_pipeline, by_pipeline, [](json& s) {
      auto app = json::parse(s["settings"]["app"].get<std::string>());
      app.erase("app");
      s["settings"]["app"] = app.dump();
    });
    r = run(train_bin, {"--resume", by_pipeline.string(), "--quiet"}, dir);
    CHECK(r.status == 1);
    CHECK(r.err.find("a checkpoint of nerve-pipeline, not of nerve-train") != std::string::npos);
  }
}

// nerve-train and nerve-pipeline run as a user runs them: refused options, warnings, and
// Ctrl-C or SIGTERM in the middle of a run.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iterator>
#include <map>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "layers/data/idx.hpp"
#include "tests/apps/app_process.hpp"

#include <nlohmann/json.hpp>

namespace fs = std::filesystem;
using namespace nerve;

namespace {

/// A Fashion-MNIST-shaped data directory of random samples.
struct tiny_fashion_mnist {
  fs::path dir;
  tiny_fashion_mnist(std::size_t train, std::size_t test) {
    std::string tmpl = (fs::temp_directory_path() / "nerve-apps-XXXXXX").string();
    dir = ::mkdtemp(tmpl.data());
    std::mt19937 rng(1);
    write("train", train, rng);
    write("t10k", test, rng);
  }
  ~tiny_fashion_mnist() { fs::remove_all(dir); }
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

using run_result = nerve::testing::app_result;

/// Runs `args` (the program first), as tests/apps/app_process.hpp does.
run_result run(const std::vector<std::string>& args,
               const std::function<void(pid_t, const std::string&)>& on_stderr = {}) {
  return nerve::testing::run_app(args, on_stderr);
}

const std::string train_bin = NERVE_TRAIN_BIN, pipeline_bin = NERVE_PIPELINE_BIN;

}  // namespace

TEST_SUITE("apps.command_line") {
  TEST_CASE("nerve-train refuses a value out of range, naming the option and the range, before any work") {
    const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
        {{"--lr", "nan"}, "--lr must be a finite number above 0 (got nan)"},
        {{"--lr", "-1"}, "--lr must be a finite number above 0 (got -1)"},
        {{"--lr", "inf"}, "--lr must be a finite number above 0 (got inf)"},
        {{"--batch", "0"}, "--batch must be at least 1 (got 0)"},
        {{"--momentum", "-1"}, "--momentum must be in [0, 1) (got -1)"},
        {{"--weight-decay", "nan"}, "--weight-decay must be a finite number, 0 or more (got nan)"},
        {{"--epochs", "0"}, "--epochs must be at least 1 (got 0)"},
        {{"--epochs", "0", "--steps", "5"}, "--epochs must be at least 1 (got 0)"},
        {{"--steps", "0"}, "--steps must be at least 1 (got 0)"},
        {{"--threads", "10000"},
         "--threads must be between 1 and 256 (got 10000): each is an event loop with its own thread and memory"},
        {{"--save", "/dev/null"}, "'/dev/null' is a character device, not a regular file: refusing to replace it"},
        {{"--replicas", "0"}, "--replicas must be between 1 and 256 (got 0): each replica is a group of layer actors"},
        {{"--replicas", "3", "--batch", "2"}, "--batch 2 cannot split into 3 replicas x 1 micro-batches"},
        // -1 is neither "no limit" nor 2^64-1 (CLI11 2.1 reads it so for an unsigned option).
        {{"--steps", "-1"}, "--steps must be at least 1 (got -1)"},
        {{"--seed", "-1"}, "--seed: '-1' is not a whole number from 0 to 2^64-1"},
        {{"--seed", "1e3"}, "--seed: '1e3' is not a whole number from 0 to 2^64-1"},
        {{"--microbatches", "-1"}, "--microbatches: '-1' is not a whole number from 0 to 2^64-1"},
        {{"--threads", "-1"}, "--threads: '-1' is not a whole number from 0 to 2^32-1"},
        {{"--bogus"}, "The following argument was not expected: --bogus"},
        // More than a long long holds: CLI11 2.1 would saturate it to 2^63-1 and run with that.
        {{"--batch", "99999999999999999999"}, "--batch: '99999999999999999999' is not a whole number from -2^63 to 2^63-1"},
        {{"--epochs", "2.5"}, "--epochs: '2.5' is not a whole number from -2^31 to 2^31-1"},
        {{"--normalize", "0.286,0"}, "--normalize MEAN,STD must be finite numbers with STD above 0 (got 0.286,0)"},
        {{"--normalize", "0.286,x"}, "--normalize: 'x' is not a finite number from -1000 to 1000"},
        {{"--early-stop", "0"}, "--early-stop must be at least 1 evaluation without improvement (got 0)"},
        {{"--early-stop", "2", "--no-eval"},
         "--early-stop watches the test loss after each epoch: it cannot be given with --no-eval"},
        {{"--save-best", "best.st", "--no-eval"},
         "--save-best keeps the weights of the best evaluation: it cannot be given with --no-eval"},
        {{"--lr-find", "--save", "w.st"},
         "--save cannot be given with --lr-find: the range test sets the rate of every step and its weights are "
         "those of a run driven to diverge"},
        {{"--lr-find", "--lr-find-steps", "1"}, "--lr-find-steps must be at least 2 (got 1)"},
        {{"--lr-find", "--lr-find-range", "1,0.1"},
         "--lr-find: the highest rate must be a finite number above the lowest 1 (got 0.1)"},
        {{"--lr-find-steps", "5"}, "--lr-find-steps is an option of --lr-find, which was not given"},
    };
    for (const auto& [options, message] : cases) {
      CAPTURE(message);
      std::vector<std::string> args{train_bin, "--data", "/nonexistent"};
      args.insert(args.end(), options.begin(), options.end());
      auto r = run(args);
      CHECK(r.exit_code == 1);
      CHECK(r.err == "nerve-train: " + message + "\n");
      CHECK(r.out.empty());
    }
  }

  TEST_CASE("nerve-pipeline refuses a value out of range in a line a person can read") {
    const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
        {{"--stages", "0"}, "--stages must be between 1 and 256 (got 0)"},
        {{"--stages", "-1"}, "--stages must be between 1 and 256 (got -1)"},
        {{"--microbatches", "0"}, "--microbatches must be at least 1 (got 0)"},
        {{"--chunks", "0"}, "--chunks must be between 1 and 256 (got 0)"},
        {{"--threads", "10000"}, "--threads must be between 1 and 256 (got 10000): one event loop each"},
        {{"--stages", "16", "--replicas", "32"}, "--stages x --replicas must be at most 256 (got 16 x 32)"},
        {{"--lr", "nan"}, "--lr must be a finite number above 0 (got nan)"},
        {{"--momentum", "1"}, "--momentum must be in [0, 1) (got 1)"},
        {{"--epochs", "0", "--save", "w.safetensors"}, "--epochs must be at least 1 (got 0)"},
        {{"--batch", "-3"}, "--batch must be at least 1 (got -3)"},
        {{"--steps", "-1"}, "--steps must be at least 1 (got -1)"},
        {{"--seed", "-1"}, "--seed: '-1' is not a whole number from 0 to 2^64-1"},
        {{"--credits", "99999999999999999999"}, "--credits: '99999999999999999999' is not a whole number from -2^63 to 2^63-1"},
    };
    for (const auto& [options, message] : cases) {
      CAPTURE(message);
      std::vector<std::string> args{pipeline_bin, "--data", "/nonexistent"};
      args.insert(args.end(), options.begin(), options.end());
      auto r = run(args);
      CHECK(r.exit_code == 1);
      CHECK(r.err.starts_with("nerve-pipeline: " + message));
      CHECK(r.err.size() < 200);
      CHECK(r.out.empty());
    }
    CHECK_FALSE(fs::exists("w.safetensors"));
  }

#ifdef NERVE_BENCH_BIN
  TEST_CASE("nerve-bench refuses a value out of range before it runs anything") {
    // Unchecked, -1 wraps around to a count that never ends, a negative warm-up or minimum
    // time reads as none, and a list item becomes CPU 4294967295.
    const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
        {{"messaging", "--count", "-1"}, "--count: '-1' is not a whole number from 1 to 10000000000"},
        {{"messaging", "--threads", "0"}, "--threads: '0' is not a whole number from 1 to 256"},
        {{"messaging", "--scale", "0"}, "--scale: '0' is not a finite number from 0.001 to 1000"},
        {{"train", "--batches", "32,-1"}, "--batches: '-1' is not a whole number from 1 to 65536"},
        {{"train", "--cpus", "-1"}, "--cpus: '-1' is not a whole number from 0 to 1023"},
        {{"train", "--min-seconds", "-1"}, "--min-seconds: '-1' is not a finite number from 0 to 3600 s"},
        {{"train", "--only", "peak,nope"}, "--only: nope not in {peak,shapes,steps,epoch,branches,user-layer}"},
        {{"pipeline", "--warmup", "-1"}, "--warmup: '-1' is not a whole number from 0 to 1000"},
        {{"pipeline", "--stages", "0"}, "--stages: '0' is not a whole number from 1 to 256"},
    };
    for (const auto& [options, message] : cases) {
      CAPTURE(message);
      std::vector<std::string> args{NERVE_BENCH_BIN};
      args.insert(args.end(), options.begin(), options.end());
      auto r = run(args);
      CHECK(r.exit_code == 1);
      CHECK(r.err == "nerve-bench: " + message + "\n");
      CHECK(r.out.empty());
    }
  }

  TEST_CASE("nerve-bench messaging caps --inflight at a mailbox's capacity and never hangs") {
    // Above 1024 the fan's source found a worker's mailbox full, failed, and the bench
    // waited for its last round forever; the chain failed "mailbox is full" or hung. Every
    // run here is bounded by timeout(1): a hang fails the case with status 124.
    const std::string bench = NERVE_BENCH_BIN, timeout = "/usr/bin/timeout", limit = "60";
    const std::string too_many = "--inflight: '1025' is not a whole number from 1 to 1024 (a mailbox's capacity)";
    for (const std::string workload : {"fan", "chain"}) {
      CAPTURE(workload);
      auto refused = run({timeout, limit, bench, "messaging", "-w", workload, "--inflight", "1025", "-r", "1"});
      CHECK(refused.exit_code == 1);
      CHECK(refused.err == "nerve-bench: " + too_many + "\n");
      auto at_cap = run({timeout, limit, bench, "messaging", "-w", workload, "--inflight", "1024", "--count", "16384",
                         "-r", "1", "-t", "2", "--quiet"});
      CHECK(at_cap.exit_code == 0);
      CHECK(at_cap.err.empty());
    }
    // A run that cannot finish in time is stopped at --timeout, naming the workload.
    auto slow = run({timeout, limit, bench, "messaging", "-w", "chain", "--inflight", "1", "--count", "10000000000",
                     "--timeout", "1", "-r", "1", "-t", "1", "--quiet"});
    CHECK(slow.exit_code == 1);
    CHECK(slow.err == "nerve-bench: error: chain inflight=1 threads=1: not finished within --timeout 1 s "
                      "(count 10000000000); the run was stopped\n");
  }

  TEST_CASE("nerve-bench messaging refuses a 'many' count that cannot fit, before spawning") {
    // A count accepted up to 10^10 spawned until memory ran out, and the runtime crashed in
    // its destructor. Under ulimit -v, in a shell, so that what fails fails small.
    const std::string bench = NERVE_BENCH_BIN;
    SUBCASE("more than the machine's memory") {
      auto r = run({"/bin/sh", "-c", "ulimit -v 8000000 && exec /usr/bin/timeout 60 " + bench +
                                         " messaging -w many --count 10000000000 -r 1 -t 1 --quiet"});
      CHECK(r.exit_code == 1);
      CHECK(r.err.starts_with("nerve-bench: error: --count 10000000000: 'many' needs at least "));
      CHECK(r.err.find(" for 10000000000 actors (") != std::string::npos);
      CHECK(r.err.find(", more than this machine's memory (") != std::string::npos);
      CHECK(r.out.empty());
    }
    SUBCASE("more than the address space ulimit -v leaves") {
      // 5 million actors need more than the 1.9 GiB allowed, less than the machine has.
      auto r = run({"/bin/sh", "-c", "ulimit -v 2000000 && exec /usr/bin/timeout 60 " + bench +
                                         " messaging -w many --count 5000000 -r 1 -t 1 --quiet"});
      CHECK(r.exit_code == 1);
      CHECK(r.err.starts_with("nerve-bench: error: --count 5000000: 'many' needs at least "));
      CHECK(r.err.find(", more than the address space left under ulimit -v (") != std::string::npos);
      CHECK(r.out.empty());
    }
    SUBCASE("a count that fits runs") {
      auto r = run({"/bin/sh", "-c", "ulimit -v 2000000 && exec /usr/bin/timeout 60 " + bench +
                                         " messaging -w many --count 20000 -r 1 -t 1 --quiet"});
      CHECK(r.exit_code == 0);
      CHECK(r.err.empty());
    }
  }
#endif

  TEST_CASE("nerve-pipeline names an empty --schedule-file") {
    tiny_fashion_mnist data(1, 1);
    const auto file = data.dir / "empty.schedule";
    std::ofstream{file};
    auto r = run({pipeline_bin, "--schedule-file", file.string()});
    CHECK(r.exit_code == 1);
    CHECK(r.err == "nerve-pipeline: --schedule-file '" + file.string() + "': the file is empty\n");
  }

  TEST_CASE("nerve-pipeline warns of options its schedule ignores") {
    SUBCASE("--chunks with 1f1b") {
      auto r = run({pipeline_bin, "--schedule", "1f1b", "--chunks", "3", "--print-schedule"});
      CHECK(r.exit_code == 0);
      CHECK(r.err == "nerve-pipeline: warning: --chunks is ignored by --schedule 1f1b (interleaved only)\n");
    }
    SUBCASE("--credits with gpipe") {
      auto r = run({pipeline_bin, "--schedule", "gpipe", "--credits", "2", "--print-schedule"});
      CHECK(r.exit_code == 0);
      CHECK(r.err == "nerve-pipeline: warning: --credits is ignored by --schedule gpipe (emergent only)\n");
    }
    SUBCASE("neither with interleaved and emergent") {
      CHECK(run({pipeline_bin, "--schedule", "interleaved", "--stages", "2", "--chunks", "2", "--print-schedule"}).err.empty());
      CHECK(run({pipeline_bin, "--schedule", "emergent", "--credits", "2", "--print-schedule"}).err.empty());
    }
  }

  TEST_CASE("Ctrl-C or SIGTERM mid-run: the trace so far, the figures marked interrupted, the weights, 128 + signal") {
    tiny_fashion_mnist data(64, 10);
    const auto trace = data.dir / "trace.json", save = data.dir / "w.safetensors";
    // A run far longer than any test: only the signal ends it.
    const std::vector<std::string> common{"--model", "mlp", "--data", data.dir.string(), "--batch", "16", "--epochs",
                                          "1000000", "--no-eval", "--trace", trace.string(), "--save", save.string()};
    bool sent = false;
    auto stop_with = [&](int sig) {
      return [&sent, sig](pid_t pid, const std::string& err) {
        // The first progress line: the run is under way.
        if (!sent && err.find("epoch 1:") != std::string::npos) sent = ::kill(pid, sig) == 0;
      };
    };
    run_result r;
    int expected = 0;
    std::string app;
    SUBCASE("nerve-train, SIGINT") {
      std::vector<std::string> args{train_bin, "--json"};
      args.insert(args.end(), common.begin(), common.end());
      r = run(args, stop_with(SIGINT));
      expected = 130;
      app = "nerve-train";
      auto j = nlohmann::json::parse(r.out);
      CHECK(j["interrupted"] == true);
      REQUIRE(!j["epochs"].empty());
      CHECK(j["epochs"].back()["interrupted"] == true);
      CHECK(j["steps"].get<long long>() >= 1);
    }
    SUBCASE("nerve-pipeline, SIGTERM") {
      std::vector<std::string> args{pipeline_bin, "--stages", "2", "--microbatches", "2"};
      args.insert(args.end(), common.begin(), common.end());
      r = run(args, stop_with(SIGTERM));
      expected = 143;
      app = "nerve-pipeline";
      CHECK(r.out.find("samples/s over") != std::string::npos);  // the stage table and figures
    }
    CAPTURE(r.err);
    CHECK(sent);
    CHECK(r.exit_code == expected);
    CHECK(r.err.find(app + ": interrupted by " + (expected == 130 ? "SIGINT" : "SIGTERM")) != std::string::npos);
    REQUIRE(fs::exists(trace));
    std::ifstream in(trace);
    auto j = nlohmann::json::parse(in);
    CHECK(j["traceEvents"].size() > 0);
    CHECK(fs::exists(save));  // the weights of the last step taken
    CHECK(r.err.find("the weights of its last step were written to " + save.string()) != std::string::npos);
  }

  TEST_CASE("nerve-train --lr-find prints rate against loss, suggests a rate and writes a step line per rate") {
    tiny_fashion_mnist data(64, 10);
    const auto metrics = data.dir / "lr.jsonl";
    auto r = run({train_bin, "--model", "mlp", "--data", data.dir.string(), "--batch", "16", "--lr-find",
                  "--lr-find-steps", "6", "--lr-find-range", "0.001,0.1", "--metrics", metrics.string(), "--json",
                  "--quiet"});
    CAPTURE(r.err);
    REQUIRE(r.exit_code == 0);
    auto j = nlohmann::json::parse(r.out);
    const auto& f = j["lr_find"];
    REQUIRE(f["lr"].size() >= 1);
    REQUIRE(f["lr"].size() <= 6);
    CHECK(f["lr"][0].get<double>() == 0.001);
    CHECK(f["suggested_lr"].get<double>() > 0);
    CHECK(f["suggestion"] == "a tenth of the rate at the lowest loss");
    // The curves file: a step line per rate, with the rate and the loss the table shows.
    std::ifstream in(metrics);
    std::vector<double> rates;
    for (std::string line; std::getline(in, line);) {
      auto rec = nlohmann::json::parse(line);
      if (rec["kind"] == "step") rates.push_back(rec["lr"].get<double>());
    }
    REQUIRE(rates.size() == f["lr"].size());
    for (std::size_t t = 0; t < rates.size(); ++t) CHECK(rates[t] == f["lr"][t].get<double>());
    // Without --json: a table and the suggestion in words.
    auto text = run({train_bin, "--model", "mlp", "--data", data.dir.string(), "--batch", "16", "--lr-find",
                     "--lr-find-steps", "3", "--quiet"});
    CHECK(text.exit_code == 0);
    CHECK(text.out.find("suggested lr ") != std::string::npos);
    CHECK(text.out.find(": a tenth of the rate at the lowest loss (") != std::string::npos);
  }
}

namespace {

/// The tensors of a safetensors file (fp32), by name.
std::map<std::string, std::vector<float>> read_safetensors(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, '\0');
  in.read(header.data(), std::streamsize(n));
  const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::map<std::string, std::vector<float>> out;
  const auto j = nlohmann::json::parse(header);
  for (auto& [name, t] : j.items()) {
    if (name == "__metadata__") continue;
    const auto b = t.at("data_offsets")[0].get<std::size_t>(), e = t.at("data_offsets")[1].get<std::size_t>();
    std::vector<float> v((e - b) / sizeof(float));
    std::memcpy(v.data(), data.data() + b, e - b);
    out[name] = std::move(v);
  }
  return out;
}

}  // namespace

TEST_SUITE("apps.replicas") {
  // Replicas on the stand-in device against the same replicas on the CPU, as a user runs
  // them (--save). The device all-reduce sums in the CPU's member order, but the
  // stand-in's products sum in another order than OpenBLAS, so not bitwise. The bound:
  // a product of length k is within 2·(k+2)·u·Σ|aᵢbᵢ| (u = 2⁻²⁴); mlp's longest is k = 784
  // (fc1's forward, and its weight gradient over a micro-batch's rows, ≤ 32 here), so each
  // op is within 1,572·u ≈ 9.4e-5 of its magnitude, and a step's ≈ 8 dependent ops (two
  // Linear layers × 3 products, softmax, ReLU) within ≈ 7.5e-4. SGD with momentum 0.9 sums
  // at most 10 gradients, so after 3 steps at lr 0.05 a weight is within 3·0.05·10·7.5e-4
  // ≈ 1.1e-3 of max|grad| of the CPU's; mlp's gradients here are smaller than its largest
  // weights, so 2e-3 of each tensor's largest entry bounds it (with the R − 1 = 1 addition
  // of the all-reduce, u, far below). Both runs must have moved the weights.
  TEST_CASE("nerve-train --device standin --replicas 2 and nerve-pipeline --devices standin,standin --replicas 2 write the CPU replicas' weights") {
    tiny_fashion_mnist data(192, 64);
    const auto dir = data.dir;
    struct variant {
      std::vector<std::string> device, cpu;
    };
    const std::vector<std::string> common{"--model", "mlp", "--steps", "3", "--batch", "64", "--lr", "0.05",
                                          "--momentum", "0.9", "--no-eval", "--data", dir.string(), "--quiet"};
    for (auto v : {variant{{train_bin, "--device", "standin", "--replicas", "2"}, {train_bin, "--replicas", "2"}},
                   variant{{pipeline_bin, "--stages", "2", "--devices", "standin,standin", "--replicas", "2"},
                           {pipeline_bin, "--stages", "2", "--replicas", "2"}}}) {
      CAPTURE(v.device[0]);
      std::map<std::string, std::map<std::string, std::vector<float>>> w;
      for (auto* args : {&v.device, &v.cpu}) {
        auto a = *args;
        a.insert(a.end(), common.begin(), common.end());
        const auto file = (dir / (args == &v.device ? "device.safetensors" : "cpu.safetensors")).string();
        a.insert(a.end(), {"--save", file});
        const auto r = run(a);
        INFO(r.err);
        REQUIRE(r.exit_code == 0);
        w[args == &v.device ? "device" : "cpu"] = read_safetensors(file);
      }
      const auto& d = w["device"];
      const auto& c = w["cpu"];
      REQUIRE(d.size() == c.size());
      REQUIRE(c.size() == 4);  // fc1 and fc2, weight and bias
      double worst_ratio = 0;
      for (auto& [name, cv] : c) {
        CAPTURE(name);
        REQUIRE(d.count(name) == 1);
        const auto& dv = d.at(name);
        REQUIRE(dv.size() == cv.size());
        double largest = 0, worst = 0;
        for (std::size_t k = 0; k < cv.size(); ++k) {
          largest = std::max(largest, double(std::abs(cv[k])));
          worst = std::max(worst, double(std::abs(cv[k] - dv[k])));
        }
        CHECK(worst <= 2e-3 * largest);
        worst_ratio = std::max(worst_ratio, worst / (2e-3 * largest));
      }
      MESSAGE(v.device[0] << ": largest |cpu − standin| / bound = " << worst_ratio);
    }
  }

  TEST_CASE("nerve-pipeline --devices standin,standin evaluates on the stand-in's streams, as one stand-in stage does") {
    tiny_fashion_mnist data(128, 96);
    const auto dir = data.dir;
    const std::vector<std::string> common{"--model", "mlp", "--epochs", "2", "--batch", "32", "--microbatches", "2",
                                          "--lr", "0.05", "--data", dir.string(), "--json", "--quiet"};
    std::map<std::string, nlohmann::json> got;
    for (const std::string stages : {"1", "2"}) {
      std::vector<std::string> a{pipeline_bin, "--stages", stages, "--devices", stages == "1" ? "standin" : "standin,standin"};
      a.insert(a.end(), common.begin(), common.end());
      const auto trace = (dir / ("trace-" + stages + ".json")).string();
      a.insert(a.end(), {"--trace", trace});
      const auto r = run(a);
      INFO(r.err);
      REQUIRE(r.exit_code == 0);
      got[stages] = nlohmann::json::parse(r.out);
      // The evaluation's forwards ran on the stand-in's streams: more gpu spans than the
      // training steps alone make (the same run with --no-eval).
      auto count_gpu = [](const std::string& file) {
        std::ifstream in(file);
        const auto j = nlohmann::json::parse(in);  // kept: a range over a temporary's member would dangle
        std::size_t n = 0;
        for (const auto& e : j.at("traceEvents")) n += e.value("cat", "") == "gpu";
        return n;
      };
      auto b = a;
      b.back() = (dir / ("trace-noeval-" + stages + ".json")).string();
      b.push_back("--no-eval");
      const auto r2 = run(b);
      REQUIRE(r2.exit_code == 0);
      CHECK(count_gpu(trace) > count_gpu(b[b.size() - 2]));
    }
    const auto& one = got["1"].at("epochs");
    const auto& two = got["2"].at("epochs");
    REQUIRE(one.size() == 2);
    REQUIRE(two.size() == 2);
    for (std::size_t e = 0; e < 2; ++e) {
      CAPTURE(e);
      CHECK(two[e].at("test_accuracy").get<double>() == one[e].at("test_accuracy").get<double>());
      CHECK(two[e].at("test_loss").get<double>() == one[e].at("test_loss").get<double>());
    }
  }

  TEST_CASE("nerve-pipeline with --replicas takes one device per stage, for every replica") {
    // --devices names one device per stage for every replica: nothing to refuse there; a
    // device stage across ranks with replicas is refused by the engine (apps/common).
    tiny_fashion_mnist data(64, 16);
    const auto r = run({pipeline_bin, "--stages", "2", "--devices", "standin", "--replicas", "2", "--steps", "1",
                        "--data", data.dir.string(), "--quiet"});
    CHECK(r.exit_code != 0);
    CHECK(r.err.find("--devices names 1 devices for 2 stages") != std::string::npos);
  }
}

namespace {

std::string file_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

}  // namespace

TEST_SUITE("apps.run_files") {
  TEST_CASE("nerve-train and nerve-pipeline refuse --init and --metrics naming one file, and leave the weights whole") {
    tiny_fashion_mnist data(64, 10);
    const auto w = (data.dir / "w.safetensors").string();
    const std::vector<std::string> common{"--model", "mlp", "--data", data.dir.string(), "--batch", "32", "--steps", "1",
                                          "--no-eval", "--quiet"};
    auto with = [&](std::vector<std::string> args, const std::vector<std::string>& more) {
      args.insert(args.end(), common.begin(), common.end());
      args.insert(args.end(), more.begin(), more.end());
      return args;
    };
    REQUIRE(run(with({train_bin}, {"--save", w})).exit_code == 0);
    const auto weights = file_text(w);
    for (const auto& app : {train_bin, pipeline_bin}) {
      CAPTURE(app);
      auto args = app == train_bin ? with({app}, {"--init", w, "--metrics", w}) : with({app, "--stages", "2"}, {"--init", w, "--metrics", w});
      const auto r = run(args);
      CAPTURE(r.err);
      CHECK(r.exit_code == 1);
      CHECK(r.err.find("--metrics '" + w + "' is the file --init names: give each its own file") != std::string::npos);
      CHECK(file_text(w) == weights);
    }
  }

  TEST_CASE("a second run given the checkpoint or the metrics of a run under way is refused, naming the first's PID") {
    tiny_fashion_mnist data(64, 10);
    const auto ck = (data.dir / "ck.safetensors").string(), m = (data.dir / "m.jsonl").string();
    const std::vector<std::string> common{"--model", "mlp", "--data", data.dir.string(), "--batch", "16", "--no-eval"};
    // A run far longer than any test: only the signal ends it.
    std::vector<std::string> first{train_bin, "--epochs", "1000000", "--checkpoint", ck, "--metrics", m};
    first.insert(first.end(), common.begin(), common.end());
    run_result same_checkpoint, same_metrics;
    pid_t first_pid = 0;
    run(first, [&](pid_t pid, const std::string& err) {
      // The first progress line: the run is under way, its files held.
      if (first_pid != 0 || err.find("epoch 1:") == std::string::npos) return;
      first_pid = pid;
      std::vector<std::string> second{train_bin, "--steps", "1", "--quiet", "--checkpoint", ck};
      second.insert(second.end(), common.begin(), common.end());
      same_checkpoint = run(second);
      std::vector<std::string> third{pipeline_bin, "--stages", "2", "--steps", "1", "--quiet", "--metrics", m};
      third.insert(third.end(), common.begin(), common.end());
      same_metrics = run(third);
      ::kill(pid, SIGTERM);
    });
    REQUIRE(first_pid != 0);
    const auto pid = std::to_string(first_pid);
    CAPTURE(same_checkpoint.err);
    CAPTURE(same_metrics.err);
    CHECK(same_checkpoint.exit_code == 1);
    CHECK(same_checkpoint.err.find("nerve-train: --checkpoint '" + ck + "' is in use by another run (PID " + pid + ", lock file '") !=
          std::string::npos);
    CHECK(same_metrics.exit_code == 1);
    CHECK(same_metrics.err.find("nerve-pipeline: --metrics '" + m + "' is in use by another run (PID " + pid + ", lock file '") !=
          std::string::npos);
    // The curves are the first run's alone: one run line.
    const auto text = file_text(m);
    std::size_t runs = 0;
    for (std::size_t at = text.find("{\"kind\":\"run\""); at != std::string::npos; at = text.find("{\"kind\":\"run\"", at + 1)) ++runs;
    CHECK(runs == 1);
  }
}

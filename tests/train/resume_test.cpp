// nerve-train killed with SIGKILL at random points (some inside a checkpoint write),
// resumed from its checkpoint until done, with the same or another --threads and --data:
// the final weights are bitwise those of one uninterrupted run.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/layers/tiny_fashion_mnist.hpp"

namespace fs = std::filesystem;

namespace {

/// Starts `bin` (nerve-train by default) with `args`, output to /dev/null; returns its pid.
pid_t start(const std::vector<std::string>& args, std::string bin = NERVE_TRAIN_BIN) {
  std::vector<char*> argv;
  argv.push_back(bin.data());
  std::vector<std::string> copy = args;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::dup2(null, 2);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

/// Waits for `pid`; returns its exit status, or -signal when a signal ended it.
int wait_for(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) REQUIRE(errno == EINTR);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

std::string bytes_of(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

/// Temporary files a killed writer left beside `target` (`.<name>.tmp-…`).
int leftovers(const fs::path& target) {
  int n = 0;
  const std::string prefix = "." + target.filename().string() + ".tmp-";
  for (auto& e : fs::directory_iterator(target.parent_path()))
    if (e.path().filename().string().rfind(prefix, 0) == 0) ++n;
  return n;
}

/// Blocks until the `nth` file whose name starts with `prefix` is created in `dir` (as
/// inotify reports it), or `pid` exits; true when the file came first.
bool wait_for_create(int fd, const std::string& prefix, int nth, pid_t pid) {
  alignas(inotify_event) char buf[4096];
  int seen = 0;
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, 50);  // a bounded wait, so that a finished child is noticed
    if (r == 0) {
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) return false;  // reaped: the caller must not wait again
      continue;
    }
    const ssize_t len = ::read(fd, buf, sizeof buf);
    for (char* at = buf; len > 0 && at < buf + len;) {
      auto* ev = reinterpret_cast<inotify_event*>(at);
      if (ev->len > 0 && std::string(ev->name).rfind(prefix, 0) == 0 && ++seen == nth) return true;
      at += sizeof(inotify_event) + ev->len;
    }
  }
}

}  // namespace

TEST_SUITE("train.resume") {
  TEST_CASE("killed at random points 20 times and resumed, a run ends with the uninterrupted run's bits") {
    nerve::testing::tiny_fashion_mnist data(600, 100);
    const fs::path dir = data.dir;
    // 19 steps an epoch (the last of 24 rows), two epochs with an evaluation between them,
    // momentum and a cosine schedule: every piece of state a resume must bring back.
    const std::vector<std::string> run = {"--data", dir.string(), "--model", "mlp",     "--epochs", "2",
                                          "--batch", "32",        "--lr",    "0.05",    "--schedule", "cosine",
                                          "--microbatches", "2",  "--quiet"};
    auto with = [&](std::vector<std::string> extra) {
      auto a = run;
      a.insert(a.end(), extra.begin(), extra.end());
      return a;
    };
    const auto t0 = std::chrono::steady_clock::now();
    REQUIRE(wait_for(start(with({"--save", (dir / "want").string()}))) == 0);
    const auto whole_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
    const std::string want = bytes_of(dir / "want");
    REQUIRE(!want.empty());

    std::mt19937 rng(2026);
    int killed = 0, in_write = 0, resumes = 0;
    for (int i = 0; i < 20; ++i) {
      CAPTURE(i);
      const fs::path ck = dir / ("ck" + std::to_string(i)), out = dir / ("out" + std::to_string(i));
      const int watch = ::inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
      REQUIRE(watch >= 0);
      REQUIRE(::inotify_add_watch(watch, dir.c_str(), IN_CREATE) >= 0);
      const pid_t pid = start(with({"--checkpoint", ck.string(), "--checkpoint-every", "1", "--save", out.string()}));
      bool reaped = false;
      if (i % 2 == 0) {
        // A random moment of the run (checkpoints write every step, so some land in one).
        std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<long>(0, 2 * whole_ms)(rng)));
      } else {
        // The moment the k-th checkpoint's temporary file appears: inside a write.
        const int k = std::uniform_int_distribution<int>(1, 36)(rng);
        reaped = !wait_for_create(watch, "." + ck.filename().string() + ".tmp-", k, pid);
      }
      ::close(watch);
      if (!reaped) {
        ::kill(pid, SIGKILL);
        const int rc = wait_for(pid);
        if (rc == -SIGKILL) ++killed;
        else REQUIRE(rc == 0);  // it finished before the kill
      }
      if (leftovers(ck) > 0) ++in_write;
      // Resume until it runs to its end: from the checkpoint when there is one, else afresh.
      const bool have = fs::exists(ck);
      if (have) ++resumes;
      REQUIRE(wait_for(start(have ? std::vector<std::string>{"--resume", ck.string(), "--save", out.string(), "--quiet"}
                                  : with({"--checkpoint", ck.string(), "--save", out.string()}))) == 0);
      CHECK(bytes_of(out) == want);
      CHECK(leftovers(ck) == 0);  // the killed writer's temporary, removed by the run after it
    }
    MESSAGE(killed << " runs killed, " << in_write << " of them inside a checkpoint write, " << resumes
                   << " resumed from a checkpoint");
    CHECK(killed >= 10);
    CHECK(in_write >= 1);
    CHECK(resumes >= 10);
  }

  TEST_CASE("nerve-pipeline killed inside a checkpoint write resumes to the same bits, for every schedule and replicas") {
    nerve::testing::tiny_fashion_mnist data(320, 40);
    const fs::path dir = data.dir;
    struct variant {
      std::string name;
      std::vector<std::string> args;
    };
    const std::vector<variant> variants = {
        {"gpipe", {"--schedule", "gpipe"}},
        {"1f1b", {"--schedule", "1f1b"}},
        {"interleaved", {"--schedule", "interleaved", "--chunks", "2"}},
        {"zb-h1 x2 replicas", {"--schedule", "zb-h1", "--replicas", "2"}},
        {"emergent", {"--schedule", "emergent"}},
        {"1f1b, the second stage on the GPU stand-in", {"--schedule", "1f1b", "--devices", "cpu,standin"}},
    };
    std::mt19937 rng(7);
    int resumed = 0;
    for (const auto& v : variants) {
      CAPTURE(v.name);
      std::vector<std::string> run = {"--data", dir.string(), "--model", "deep-mlp", "--stages", "2",
                                      "--microbatches", "4", "--batch", "32", "--epochs", "2", "--quiet"};
      run.insert(run.end(), v.args.begin(), v.args.end());
      auto with = [&](std::vector<std::string> extra) {
        auto a = run;
        a.insert(a.end(), extra.begin(), extra.end());
        return a;
      };
      const fs::path want = dir / "want", ck = dir / "ck", out = dir / "out";
      fs::remove(ck);
      REQUIRE(wait_for(start(with({"--save", want.string()}), NERVE_PIPELINE_BIN)) == 0);
      const int watch = ::inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
      REQUIRE(watch >= 0);
      REQUIRE(::inotify_add_watch(watch, dir.c_str(), IN_CREATE) >= 0);
      const pid_t pid = start(with({"--checkpoint", ck.string(), "--checkpoint-every", "1", "--save", out.string()}),
                              NERVE_PIPELINE_BIN);
      // 10 steps an epoch: somewhere in the second epoch, after the evaluation between them.
      const int k = std::uniform_int_distribution<int>(12, 18)(rng);
      const bool in_time = wait_for_create(watch, "." + ck.filename().string() + ".tmp-", k, pid);
      ::close(watch);
      REQUIRE(in_time);
      ::kill(pid, SIGKILL);
      REQUIRE(wait_for(pid) == -SIGKILL);
      REQUIRE(fs::exists(ck));
      ++resumed;
      REQUIRE(wait_for(start({"--resume", ck.string(), "--save", out.string(), "--quiet"}, NERVE_PIPELINE_BIN)) == 0);
      CHECK(bytes_of(out) == bytes_of(want));
    }
    CHECK(resumed == 6);
  }

  TEST_CASE("a run resumed with another --threads and another --data directory ends with the uninterrupted run's bits") {
    // The machine a run moves to may have other cores and keep the data elsewhere: the
    // path and the loops of stages and replicas change nothing of the arithmetic. (One
    // replica of nerve-train cuts its products by its threads: that change is refused,
    // resume_refusals_test.cpp.)
    nerve::testing::tiny_fashion_mnist data(320, 40);
    const fs::path dir = data.dir, moved = dir / "moved";
    fs::create_directory(moved);
    for (const char* name : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                             "t10k-labels-idx1-ubyte"})
      fs::copy_file(dir / name, moved / name);
    struct variant {
      std::string name, bin;
      std::vector<std::string> args;
      std::string threads_before, threads_after;
    };
    const std::vector<std::string> train = {"--model", "mlp", "--batch", "32", "--lr", "0.05", "--schedule", "cosine",
                                            "--microbatches", "2"};
    const std::vector<std::string> pipeline = {"--model", "deep-mlp", "--stages", "2", "--microbatches", "4",
                                               "--batch", "32"};
    auto plus = [](std::vector<std::string> a, const std::vector<std::string>& b) {
      a.insert(a.end(), b.begin(), b.end());
      return a;
    };
    const std::vector<variant> variants = {
        {"nerve-train, 3 loops, resumed on 3", NERVE_TRAIN_BIN, train, "3", "3"},
        {"nerve-train --replicas 2, 2 loops, resumed on 1", NERVE_TRAIN_BIN, plus(train, {"--replicas", "2"}), "2", "1"},
        {"nerve-pipeline, 2 loops, resumed on 1", NERVE_PIPELINE_BIN, pipeline, "2", "1"},
        {"nerve-pipeline --replicas 2, 4 loops, resumed on 3", NERVE_PIPELINE_BIN,
         plus(pipeline, {"--replicas", "2", "--schedule", "zb-h1"}), "4", "3"},
    };
    std::mt19937 rng(13);
    for (const auto& v : variants) {
      CAPTURE(v.name);
      const auto run = plus(v.args, {"--data", dir.string(), "--epochs", "2", "--threads", v.threads_before, "--quiet"});
      const fs::path want = dir / "want", ck = dir / "ck", out = dir / "out";
      fs::remove(ck);
      fs::remove(out);
      REQUIRE(wait_for(start(plus(run, {"--save", want.string()}), v.bin)) == 0);
      const int watch = ::inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
      REQUIRE(watch >= 0);
      REQUIRE(::inotify_add_watch(watch, dir.c_str(), IN_CREATE) >= 0);
      const pid_t pid = start(plus(run, {"--checkpoint", ck.string(), "--checkpoint-every", "1"}), v.bin);
      // 10 steps an epoch, a checkpoint after each: stopped in either epoch.
      const int k = std::uniform_int_distribution<int>(3, 17)(rng);
      const bool in_time = wait_for_create(watch, "." + ck.filename().string() + ".tmp-", k, pid);
      ::close(watch);
      REQUIRE(in_time);
      ::kill(pid, SIGKILL);
      REQUIRE(wait_for(pid) == -SIGKILL);
      REQUIRE(fs::exists(ck));
      REQUIRE(wait_for(start({"--resume", ck.string(), "--threads", v.threads_after, "--data", moved.string(), "--save",
                              out.string(), "--quiet"},
                             v.bin)) == 0);
      CHECK(bytes_of(out) == bytes_of(want));
    }
  }
}

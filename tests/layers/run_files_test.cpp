// The files of a training run, kept apart and whole (issue 34, "Nothing lost"): no two
// options on one file, one run per checkpoint and metrics file, no orphaned temporaries
// of killed writers, no metrics line torn by a full disk and continued by the next run.
#include <doctest/doctest.h>

#include "tests/layers/file_size_limit.hpp"

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "layers/linear.hpp"
#include "layers/trainer.hpp"
#include "tests/layers/tiny_fashion_mnist.hpp"
#include "tests/layers/common.hpp"

namespace fs = std::filesystem;
using namespace nerve;
using namespace nerve::layers;
using nerve::testing::tiny_fashion_mnist;

namespace {

graph small_net() {
  graph_builder b;
  b.input("image", shape{784});
  b.add("fc", linear(784, 10), {"image"});
  return b.build(3);
}

using nerve::layers::testing::contents;

using nerve::layers::testing::put;

/// The names in `dir`, sorted.
std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

/// A run of two steps of `small_net` on `data`.
train_options short_run(const tiny_fashion_mnist& data) {
  train_options o;
  o.model = "small";
  o.data = data.dir;
  o.batch = 32;
  o.epochs = 2;  // room for a resumed run's steps
  o.steps = 2;
  o.evaluate = false;
  return o;
}

/// Every line of a metrics file parses as a JSON object with a `kind`, and the file ends
/// with a newline; the records, in order.
std::vector<nlohmann::json> whole_lines(const fs::path& path) {
  const auto text = contents(path);
  REQUIRE_FALSE(text.empty());
  CHECK(text.back() == '\n');
  std::vector<nlohmann::json> records;
  for (std::size_t from = 0, end = text.find('\n'); end != std::string::npos; from = end + 1, end = text.find('\n', from)) {
    const auto line = text.substr(from, end - from);
    CAPTURE(line);
    auto j = nlohmann::json::parse(line, nullptr, false);
    REQUIRE_FALSE(j.is_discarded());
    REQUIRE(j.contains("kind"));
    records.push_back(std::move(j));
  }
  return records;
}

/// The PID of a process that has exited and been reaped: no process has it (until the
/// kernel hands it out again, which takes a full turn of the PID space).
pid_t dead_pid() {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) ::_exit(0);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return pid;
}

using test::file_size_limit;

}  // namespace

TEST_SUITE("layers.run_files") {
  TEST_CASE("two options naming one file are refused before anything is written, compared as files, not names") {
    tiny_fashion_mnist data(64, 10);
    const auto d = data.dir;
    auto o = short_run(data);
    auto g = small_net();
    save_weights(g, d / "w.st", "small");
    const auto weights = contents(d / "w.st");
    std::string message;
    fs::path kept;  // the file that must come through untouched
    SUBCASE("--init and --metrics (the metrics would truncate the weights)") {
      o.init = d / "w.st";
      o.metrics = d / "w.st";
      message = "--metrics '" + (d / "w.st").string() + "' is the file --init names: give each its own file";
      kept = d / "w.st";
    }
    SUBCASE("--metrics a hard link of the checkpoint") {
      fs::create_hard_link(d / "w.st", d / "link.jsonl");
      o.checkpoint = d / "w.st";
      o.metrics = d / "link.jsonl";
      message = "--metrics '" + (d / "link.jsonl").string() + "' is the file --checkpoint names: give each its own file (--checkpoint '" +
                (d / "w.st").string() + "' is the same file by another name)";
      kept = d / "w.st";
    }
    SUBCASE("--trace and --checkpoint, a file not there yet") {
      o.checkpoint = d / "out";
      o.trace = d / "out";
      message = "--trace '" + (d / "out").string() + "' is the file --checkpoint names: give each its own file";
    }
    SUBCASE("--save and --checkpoint, one through a symlink") {
      fs::create_symlink("w.st", d / "alias.st");
      o.save = d / "alias.st";
      o.checkpoint = d / "w.st";
      message = "--checkpoint '" + (d / "w.st").string() + "' is the file --save names: give each its own file (--save '" +
                (d / "alias.st").string() + "' is the same file by another name)";
      kept = d / "w.st";
    }
    SUBCASE("--save and --trace, one new name written two ways") {
      o.save = d / "new.st";
      o.trace = d / "." / "new.st";
      message = "--trace '" + (d / "." / "new.st").string() + "' is the file --save names";
    }
    SUBCASE("--resume and --save (the weights would replace the training state)") {
      o.resume = d / "w.st";
      o.save = d / "w.st";
      message = "--save '" + (d / "w.st").string() + "' is the file --resume names: give each its own file";
      kept = d / "w.st";
    }
    CAPTURE(message);
    CHECK_THROWS_WITH_AS(check_options(o), doctest::Contains(message.c_str()), std::invalid_argument);
    CHECK_THROWS_WITH_AS(train(g, o), doctest::Contains(message.c_str()), std::invalid_argument);
    if (!kept.empty()) CHECK(contents(kept) == weights);
    CHECK_FALSE(fs::exists(d / "out"));
    CHECK_FALSE(fs::exists(d / "new.st"));
  }

  TEST_CASE("what may share a file still does: a resumed run's checkpoint, two inputs, other ranks") {
    tiny_fashion_mnist data(64, 10);
    auto o = short_run(data);
    o.resume = data.dir / "ck.st";
    o.checkpoint = data.dir / "ck.st";  // where resume_options puts it
    CHECK_NOTHROW(check_options(o));
    o.resume.clear();
    o.checkpoint.clear();
    o.init = data.dir / "w.st";
    o.metrics = data.dir / "w.st";
    o.lead = false;  // the other ranks of a job write nothing
    CHECK_NOTHROW(check_options(o));
  }

  TEST_CASE("a second run given the checkpoint or the metrics of a run under way is refused, naming its PID") {
    tiny_fashion_mnist data(96, 10);
    const auto d = data.dir;
    auto o = short_run(data);
    o.checkpoint = d / "ck.st";
    o.metrics = d / "m.jsonl";
    std::string same_checkpoint, same_metrics;
    bool asked = false;
    auto g = small_net();
    // The second runs start from inside the first, between its steps: it holds its files.
    train(g, o, [&](const train_progress&) {
      if (asked) return;
      asked = true;
      auto second = o;
      second.metrics = d / "other.jsonl";
      try {
        auto g2 = small_net();
        train(g2, second);
      } catch (const std::invalid_argument& e) {
        same_checkpoint = e.what();
      }
      auto third = o;
      third.checkpoint = d / "other.st";
      try {
        auto g3 = small_net();
        train(g3, third);
      } catch (const std::invalid_argument& e) {
        same_metrics = e.what();
      }
    });
    REQUIRE(asked);
    const auto pid = std::to_string(::getpid());
    CHECK(same_checkpoint == "--checkpoint '" + (d / "ck.st").string() + "' is in use by another run (PID " + pid +
                                 ", lock file '" + (d / ".ck.st.lock").string() +
                                 "'): give each run its own file, or wait for that one to end");
    CHECK(same_metrics == "--metrics '" + (d / "m.jsonl").string() + "' is in use by another run (PID " + pid +
                              ", lock file '" + (d / ".m.jsonl.lock").string() +
                              "'): give each run its own file, or wait for that one to end");
    // Nothing of theirs was written: the first run's curves are its own.
    CHECK_FALSE(fs::exists(d / "other.jsonl"));
    CHECK_FALSE(fs::exists(d / "other.st"));
    const auto records = whole_lines(o.metrics);
    CHECK(std::count_if(records.begin(), records.end(), [](auto& r) { return r["kind"] == "run"; }) == 1);
    // A run that ended lets go, and one that died (its PID in the file, no lock) does too.
    CHECK_FALSE(fs::exists(d / ".ck.st.lock"));
    put(d / ".ck.st.lock", std::to_string(dead_pid()) + "\n");
    auto again = small_net();
    CHECK(train(again, o).steps == 2);
    CHECK_FALSE(fs::exists(d / ".ck.st.lock"));
  }

  TEST_CASE("a killed writer's temporaries beside the outputs are removed when a run starts; a live one's are kept") {
    tiny_fashion_mnist data(64, 10);
    const auto d = data.dir;
    auto o = short_run(data);
    o.checkpoint = d / "ck.st";
    o.save = d / "w.st";
    o.trace = d / "t.json";
    const auto dead = std::to_string(dead_pid()), live = std::to_string(::getppid());
    const std::vector<std::string> orphans{".ck.st.tmp-" + dead + "-0-123456",  // atomic_file's
                                           ".ck.st.tmp-" + dead + "-7",         // the trace writer's
                                           ".w.st.tmp-" + dead + "-1-2", ".t.json.tmp-" + dead + "-0"};
    const std::vector<std::string> others{".ck.st.tmp-" + live + "-0-1",  // its writer is alive
                                          ".ck.st.tmp-" + dead,           // not a temporary's name
                                          ".ck.st.tmp-x" + dead + "-0-1", ".other.st.tmp-" + dead + "-0-1",
                                          "ck.st.tmp-" + dead + "-0-1"};
    for (auto& n : orphans) put(d / n, std::string(4096, 'w'));
    for (auto& n : others) put(d / n, "keep");
    auto g = small_net();
    train(g, o);
    const auto names = names_in(d);
    for (auto& n : orphans) {
      CAPTURE(n);
      CHECK(std::find(names.begin(), names.end(), n) == names.end());
    }
    for (auto& n : others) {
      CAPTURE(n);
      CHECK(contents(d / n) == "keep");
    }
    CHECK(fs::exists(o.checkpoint));
  }

  TEST_CASE("a metrics line cut short by a full disk is cut back off: the file ends with its last whole line") {
    tiny_fashion_mnist data(96, 10);
    auto o = short_run(data);
    o.checkpoint = data.dir / "ck.st";
    o.metrics = data.dir / "m.jsonl";
    auto g = small_net();
    train(g, o);
    const auto before = contents(o.metrics);
    REQUIRE(before.back() == '\n');
    auto resumed = resume_options(o.checkpoint);
    resumed.metrics = o.metrics;
    resumed.steps = 3;
    auto g2 = small_net();
    {
      // Room for 10 bytes of the resumed run's first line.
      file_size_limit full(before.size() + 10);
      CHECK_THROWS_WITH(train(g2, resumed), doctest::Contains(("--metrics " + o.metrics.string() + ": cannot write").c_str()));
    }
    CHECK(contents(o.metrics) == before);
  }

  TEST_CASE("a resumed run starts its lines on a line of their own after a torn one") {
    tiny_fashion_mnist data(96, 10);
    auto o = short_run(data);
    o.checkpoint = data.dir / "ck.st";
    o.metrics = data.dir / "m.jsonl";
    auto g = small_net();
    train(g, o);
    const auto before = whole_lines(o.metrics);
    // What a full disk left of a line, never finished.
    std::ofstream(o.metrics, std::ios::binary | std::ios::app) << R"({"kind":"step","step":2,"ep)";
    auto resumed = resume_options(o.checkpoint);
    resumed.metrics = o.metrics;
    resumed.steps = 3;
    auto g2 = small_net();
    CHECK(train(g2, resumed).steps == 3);
    const auto after = whole_lines(o.metrics);
    REQUIRE(after.size() > before.size());
    for (std::size_t i = 0; i < before.size(); ++i) CHECK(after[i] == before[i]);
    CHECK(after[before.size()]["kind"] == "run");
    CHECK(after[before.size()]["resume"]["step"] == 2);
  }
}

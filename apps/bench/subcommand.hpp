#pragma once
/// \file
/// How `nerve-bench` finds its subcommands.
///
/// Each subcommand lives in its own source file and registers itself with a static
/// `subcommand_registration`; `main.cpp` adds every registered one to the CLI11 app.
/// Adding a benchmark (`train`, `pipeline`, `gpu`) means adding one `.cpp` to
/// `apps/bench/CMakeLists.txt`; `main.cpp` does not change.
///
/// ```
///   namespace {
///   void add_train(CLI::App& app) {
///     auto* sub = app.add_subcommand("train", "Training throughput");
///     sub->add_option("--steps", steps, "Timed steps")
///         ->transform(nerve::apps::whole_in(1, 1000));  // apps/common/options.hpp
///     sub->callback([] { ... throw std::runtime_error("why") on failure ... });
///   }
///   const nerve::bench::subcommand_registration reg{"train", &add_train};
///   }  // namespace
/// ```

#include <functional>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace nerve::bench {

/// Adds one subcommand (its options and its callback) to `app`. A refused option and a
/// callback that throws both end the program with one line on stderr and status 1.
using add_subcommand_fn = void (*)(CLI::App& app);

struct subcommand_entry {
  std::string name;
  add_subcommand_fn add;
};

/// Every registered subcommand, in registration order (static initialisation: main only).
std::vector<subcommand_entry>& subcommands();

/// Registers a subcommand at static-initialisation time.
struct subcommand_registration {
  subcommand_registration(std::string name, add_subcommand_fn add) {
    subcommands().push_back({std::move(name), add});
  }
};

}  // namespace nerve::bench

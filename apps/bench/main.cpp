// nerve-bench: benchmarks of the nerve runtime. The subcommands register themselves
// (see subcommand.hpp); this file only builds the command line and runs it.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>

#include <CLI/CLI.hpp>

#include "apps/bench/subcommand.hpp"
#include "apps/common/options.hpp"

namespace nerve::bench {
std::vector<subcommand_entry>& subcommands() {
  static std::vector<subcommand_entry> all;
  return all;
}
}  // namespace nerve::bench

int main(int argc, char** argv) {
  CLI::App app{"Benchmarks of the nerve actor runtime. Results go to stdout (text or --json), progress to stderr."};
  app.require_subcommand(1);
  auto& subs = nerve::bench::subcommands();
  std::sort(subs.begin(), subs.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  for (auto& s : subs) s.add(app);
  // nerve-bench, nerve-bench-mpi or nerve-bench-caf: they share this file.
  const std::string name = std::filesystem::path(argc > 0 ? argv[0] : "nerve-bench").filename().string();
  try {
    if (const int status = nerve::apps::parse_command_line(app, argc, argv, name.c_str()); status >= 0) return status;
  } catch (const std::exception& e) {  // a benchmark that failed
    std::fprintf(stderr, "%s: error: %s\n", name.c_str(), e.what());
    return 1;
  }
  return 0;
}

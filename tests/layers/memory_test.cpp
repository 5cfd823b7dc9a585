// The training heap policy (layers/memory.hpp): a repeated step reuses the pages of the
// step before instead of faulting in fresh ones. Counts page faults, never times anything.
#include <doctest/doctest.h>

#include <sys/resource.h>

#include <random>
#include <utility>
#include <vector>

#include "actors/runtime.hpp"
#include "layers/executor.hpp"
#include "layers/gemm.hpp"
#include "layers/network.hpp"
#include "layers/presets.hpp"
#include "tests/layers/common.hpp"

using namespace nerve;
using namespace nerve::layers;

namespace {

// Minor page faults so far, of the calling thread or of the whole process.
long minor_faults(int who) {
  rusage r{};
  getrusage(who, &r);
  return r.ru_minflt;
}

tensor random_batch(std::int64_t n, std::uint64_t seed) {
  tensor t(n, shape{784});
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  for (std::int64_t i = 0; i < t.size(); ++i) t.data()[i] = u(rng);
  return t;
}

using nerve::layers::testing::random_labels;

}  // namespace

// The sanitizers bring their own allocators (ASan's quarantine hands out fresh memory on
// purpose), so the count means something only in a plain build.
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
TEST_SUITE("layers.memory") {
  TEST_CASE("repeated deep-mlp steps at batch 256 fault in no fresh pages") {
    // deep-mlp at batch 256 frees 1 MiB activations and gradients and 3 MiB GEMM panels every
    // step; with glibc's defaults the direct executor's thread faulted ~1,400 pages per step.
    set_gemm_threads(1);
    auto g = make_preset("deep-mlp", 5);
    direct_executor ex(g);
    cross_entropy criterion;
    sgd opt(sgd_options{0.01, 0.9, 0.0, 0.0, false});
    // Batches made ahead, as nerve-bench train and a prefetching loader do: they sit on
    // top of the heap and are freed one per step.
    auto run = [&](int steps) {
      std::vector<std::pair<tensor, targets>> in;
      for (int k = 0; k < steps; ++k) in.emplace_back(random_batch(256, 10 + k), random_labels(256, 20 + k));
      const long before = minor_faults(RUSAGE_THREAD);
      for (auto& [x, y] : in) ex.train_step(std::move(x), y, criterion, opt);
      return (minor_faults(RUSAGE_THREAD) - before) / steps;
    };
    run(8);  // the first steps grow the heap to the step's high-water mark
    const long per_step = run(8);
    MESSAGE("direct: ", per_step, " faults per step");
    // A step allocates over 4,000 pages of tensors, and glibc's default policy faulted
    // ~1,400 of them in again each step. Stray faults are allowed: the kernel's own reclaim
    // of idle pages, which some machines run, brings a few dozen a step.
    CHECK(per_step < 256);
  }

  TEST_CASE("the same steps run as actors fault in no fresh pages either") {
    set_gemm_threads(1);
    auto g = make_preset("deep-mlp", 5);
    actors::runtime rt({.loops = 1});
    network net(rt, g, std::make_shared<cross_entropy>(),
                [] { return std::make_unique<sgd>(sgd_options{0.01, 0.9, 0.0, 0.0, false}); });
    // The layers run on the loop's thread: count the whole process's faults.
    auto run = [&](int steps) {
      std::vector<std::pair<tensor, targets>> in;
      for (int k = 0; k < steps; ++k) in.emplace_back(random_batch(256, 10 + k), random_labels(256, 20 + k));
      const long before = minor_faults(RUSAGE_SELF);
      for (auto& [x, y] : in) net.train_step(std::move(x), std::move(y)).get();
      return (minor_faults(RUSAGE_SELF) - before) / steps;
    };
    run(8);
    const long per_step = run(8);
    MESSAGE("actors: ", per_step, " faults per step");
    CHECK(per_step < 256);  // as above
  }
}
#endif

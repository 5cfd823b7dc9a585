#pragma once
// Helpers shared by the actor tests.
#include <cstdlib>
#include <cstring>
#include <future>

namespace nerve::test {

/// 1 normally; smaller under sanitizers (scripts/test sets NERVE_TEST_SCALE=sanitize),
/// where the big randomized workloads run 10x smaller.
inline double scale() {
  const char* s = std::getenv("NERVE_TEST_SCALE");
  return (s && std::strcmp(s, "sanitize") == 0) ? 0.1 : 1.0;
}

/// A one-shot event a test can wait on (no sleeping).
struct event {
  std::promise<void> p;
  std::shared_future<void> f = p.get_future().share();
  void set() { p.set_value(); }
  void wait() const { f.wait(); }
};

}  // namespace nerve::test

// The user layer of apps/bench/user_layer.hpp built with the compiler's defaults (no AVX on
// x86-64: apps/bench/CMakeLists.txt), as a user's own project is.
#define NERVE_BENCH_USER_LAYER_NS default_build
#include "apps/bench/user_layer.hpp"

namespace nerve::bench {
std::unique_ptr<layers::layer> make_user_swish_default(user_layer_clock& clock) {
  return std::make_unique<default_build::user_swish>(clock);
}
}  // namespace nerve::bench

// The user layer of apps/bench/user_layer.hpp built with nerve's own flags (-march=${NERVE_ARCH}).
#define NERVE_BENCH_USER_LAYER_NS native_build
#include "apps/bench/user_layer.hpp"

namespace nerve::bench {
std::unique_ptr<layers::layer> make_user_swish_native(user_layer_clock& clock) {
  return std::make_unique<native_build::user_swish>(clock);
}
}  // namespace nerve::bench

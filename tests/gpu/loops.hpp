#pragma once
// Event loops for the gpu tests: an io_context per thread, as the runtime has.
#include "gpu/loop_thread.hpp"

namespace nerve::gpu::test {

/// One io_context run by one thread until `stop()` (or destruction).
using gpu::loop_thread;

}  // namespace nerve::gpu::test

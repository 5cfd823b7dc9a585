#pragma once
/// \file
/// The CPU stand-in backend: fake streams (a worker thread per stream running
/// enqueued host functions in order), fake events, host memory, and the
/// plain-loop kernels. It drives the same completion path as a GPU, so the
/// completion logic is tested where there is no GPU (and under TSan).

#include "gpu/detail/backend.hpp"

#include <memory>

namespace nerve::gpu::detail {

std::unique_ptr<backend> make_standin_backend();

}  // namespace nerve::gpu::detail

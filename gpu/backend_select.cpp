// The one place that knows whether CUDA was built (NERVE_HAS_CUDA, set by gpu/CMakeLists.txt).
#include "gpu/detail/backend.hpp"
#include "gpu/device.hpp"
#include "gpu/standin/standin_backend.hpp"
#include "gpu/status.hpp"

#if NERVE_HAS_CUDA
#include "gpu/cuda/cuda_backend.hpp"
#endif

#include <string>

namespace nerve::gpu::detail {

int cuda_device_count() noexcept {
#if NERVE_HAS_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

std::unique_ptr<backend> make_backend(backend_kind kind, int ordinal) {
  if (kind == backend_kind::standin) return make_standin_backend();
#if NERVE_HAS_CUDA
  if (ordinal < 0 || ordinal >= cuda::device_count())
    throw error(errc::no_device, "no CUDA device " + std::to_string(ordinal) + " (" +
                                     std::to_string(cuda::device_count()) + " visible)");
  return cuda::make_backend(ordinal);
#else
  throw error(errc::no_device, "nerve was built without CUDA: no CUDA device " + std::to_string(ordinal));
#endif
}

std::string cuda_error_text(int code) {
#if NERVE_HAS_CUDA
  return cuda::error_text(code);
#else
  return "CUDA error " + std::to_string(code);
#endif
}

std::string cublas_status_text(int code) {
#if NERVE_HAS_CUDA
  return cuda::cublas_text(code);
#else
  return "cuBLAS status " + std::to_string(code);
#endif
}

}  // namespace nerve::gpu::detail

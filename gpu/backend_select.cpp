// The one place that knows whether CUDA was built (NERVE_HAS_CUDA, set by gpu/CMakeLists.txt).
// With CUDA, the backend lives in a module (gpu/detail/cuda_module.hpp says what crosses
// the boundary): nothing here links cudart or cuBLAS, and the module is opened the first
// time anyone asks about a CUDA device, so a CPU-only run never maps the CUDA libraries.
#include "gpu/detail/backend.hpp"
#include "gpu/device.hpp"
#include "gpu/standin/standin_backend.hpp"
#include "gpu/status.hpp"

#if NERVE_HAS_CUDA
#include "gpu/detail/cuda_module.hpp"
#include "gpu/detail/module.hpp"

#include <dlfcn.h>
#endif

#include <string>

namespace nerve::gpu::detail {

#if NERVE_HAS_CUDA
namespace {

void throw_error(std::error_code code, const char* call, const char* file, int line) {
  throw error(code, call ? std::string(call) : std::string(), file, line);
}

const cuda_module_host host_table{&cuda_category, &cublas_category, &throw_error};

struct cuda_module {
  const cuda_module_api* api = nullptr;  ///< nullptr when it could not be loaded
  std::string error;                     ///< then why: the path and dlerror()
};

cuda_module load_cuda_module() {
  cuda_module m;
  const opened_module mod = open_module(cuda_module_file, cuda_module_env);
  if (!mod.handle) {
    m.error = "the CUDA backend could not be loaded: " + mod.error;
    return m;
  }
  // dlsym hands back an object pointer; POSIX guarantees it converts to the function's.
  auto entry = reinterpret_cast<cuda_module_entry_fn>(dlsym(mod.handle, cuda_module_entry));
  if (!entry) {
    const char* why = dlerror();
    m.error = "the CUDA backend could not be loaded: " + mod.path + " has no " + cuda_module_entry + " (" +
              (why ? why : "dlsym failed") + ")";
    return m;
  }
  m.api = entry(cuda_module_abi, &host_table);
  if (!m.api)
    m.error = "the CUDA backend could not be loaded: " + mod.path + " was built from other sources (interface " +
              std::to_string(cuda_module_abi) + " expected); rebuild it with this program";
  return m;
}

/// Loaded once, by the first caller (a thread-safe static); never unloaded.
const cuda_module& cuda() {
  static const cuda_module m = load_cuda_module();
  return m;
}

}  // namespace
#endif

int cuda_device_count() noexcept {
#if NERVE_HAS_CUDA
  try {
    const auto& m = cuda();
    return m.api ? m.api->device_count() : 0;
  } catch (...) {  // out of memory while loading: no device is the honest answer
    return 0;
  }
#else
  return 0;
#endif
}

std::unique_ptr<backend> make_backend(backend_kind kind, int ordinal) {
  if (kind == backend_kind::standin) return make_standin_backend();
#if NERVE_HAS_CUDA
  const auto& m = cuda();
  if (!m.api) throw error(errc::no_device, "no CUDA device " + std::to_string(ordinal) + ": " + m.error);
  const int n = m.api->device_count();
  if (ordinal < 0 || ordinal >= n)
    throw error(errc::no_device, "no CUDA device " + std::to_string(ordinal) + " (" + std::to_string(n) + " visible)");
  return m.api->make_backend(ordinal);
#else
  throw error(errc::no_device, "nerve was built without CUDA: no CUDA device " + std::to_string(ordinal));
#endif
}

// A code of cuda_category or cublas_category comes from the module, so it is loaded by
// then; asking here loads it otherwise (a code made by hand), or says only the number.
std::string cuda_error_text(int code) {
#if NERVE_HAS_CUDA
  if (const auto& m = cuda(); m.api) return m.api->error_text(code);
#endif
  return "CUDA error " + std::to_string(code);
}

std::string cublas_status_text(int code) {
#if NERVE_HAS_CUDA
  if (const auto& m = cuda(); m.api) return m.api->cublas_text(code);
#endif
  return "cuBLAS status " + std::to_string(code);
}

}  // namespace nerve::gpu::detail

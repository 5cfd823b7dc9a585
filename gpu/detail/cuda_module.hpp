#pragma once
/// \file
/// The CUDA backend as a loadable module (ggml's backend registry): everything
/// that needs cudart or cuBLAS (gpu/cuda/, gpu/kernels/*.cu) is built into
/// `libnerve_gpu_cuda.so`, which `backend_select.cpp` opens with `dlopen` the
/// first time a CUDA device is asked for. A CPU-only run never maps it, nor the
/// CUDA libraries it needs. Internal to nerve::gpu; no CUDA types here.
///
/// What crosses the boundary, and why: the module keeps no state of nerve_gpu.
/// The error categories and `gpu::error` belong to the program (an
/// `std::error_code`'s category is compared by address, so a second copy in the
/// module would make its codes unequal to the program's); the program lends them
/// in `cuda_module_host`. The module links nothing of nerve (it is linked with
/// `--no-undefined`), so no executable needs to export symbols (`-rdynamic`),
/// and the same module serves every binary of a build. The backend table
/// (`detail::backend`) is a C++ class: program and module are built by the same
/// compiler from the same headers, which `cuda_module_abi` stands for.

#include "gpu/detail/backend.hpp"

#include <memory>
#include <string>
#include <system_error>

namespace nerve::gpu::detail {

/// Bump whenever this header or `backend.hpp` changes shape: a module built from
/// other sources is refused (`errc::no_device`, naming both numbers).
inline constexpr int cuda_module_abi = 4;

/// The module's file name; it is looked for next to the program (module_path.hpp).
inline constexpr const char* cuda_module_file = "libnerve_gpu_cuda.so";
/// An absolute path here wins over the search (for a module elsewhere).
inline constexpr const char* cuda_module_env = "NERVE_GPU_MODULE";
/// The one `extern "C"` symbol the module exports: a `cuda_module_entry_fn`.
inline constexpr const char* cuda_module_entry = "nerve_gpu_cuda_module";

/// What the program lends the module: the state it owns. Valid for the process.
struct cuda_module_host {
  const std::error_category& (*cuda_category)() noexcept;
  const std::error_category& (*cublas_category)() noexcept;
  /// Throws `gpu::error(code, call, file, line)`; never returns.
  void (*throw_error)(std::error_code code, const char* call, const char* file, int line);
};

/// What the module gives: the backend factory and the texts of its statuses.
/// Valid for the process (the module is never unloaded: its backends' code is in it).
struct cuda_module_api {
  int abi;
  /// CUDA devices visible (0 when the driver finds none). Never throws.
  int (*device_count)() noexcept;
  /// Opens CUDA device `ordinal` (in range); throws `gpu::error` through the host.
  std::unique_ptr<backend> (*make_backend)(int ordinal);
  /// "cudaErrorX: description".
  std::string (*error_text)(int code);
  /// "CUBLAS_STATUS_X: description".
  std::string (*cublas_text)(int code);
};

/// The entry point: nullptr when `abi` is not the module's own.
using cuda_module_entry_fn = const cuda_module_api* (*)(int abi, const cuda_module_host* host);

}  // namespace nerve::gpu::detail

#pragma once
/// \file
/// Finds and opens a module (a shared object loaded with `dlopen`) that is built
/// beside the program: the CUDA backend (cuda_module.hpp), `nerve-bench conv`'s
/// cuDNN side. Internal to nerve::gpu and its apps. Thread-safe.

#include <string>

namespace nerve::gpu::detail {

/// What `open_module` found.
struct opened_module {
  void* handle = nullptr;  ///< from dlopen; never closed (code in it may run until exit)
  std::string path;        ///< the file opened (or tried last)
  std::string error;       ///< why it could not be opened: the paths tried and dlerror()
};

/// Opens `file` with RTLD_NOW | RTLD_LOCAL from the first place it exists, in order:
/// `$env_var` when set (that path only); else the folder of the binary holding
/// nerve::gpu (the executable, via /proc/self/exe, or libnerve_gpu if shared), then
/// `../lib/` from there (build/bin -> build/lib), then the loader's search path
/// (LD_LIBRARY_PATH, ld.so.cache). A module that exists but fails to load (a missing
/// libcublas) is an error, not a reason to look further.
opened_module open_module(const std::string& file, const char* env_var);

}  // namespace nerve::gpu::detail

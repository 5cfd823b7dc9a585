#include "gpu/detail/module.hpp"

#include <dlfcn.h>
#include <link.h>

#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <vector>

namespace nerve::gpu::detail {
namespace {

/// The folder of the object this function is linked into: the executable when
/// nerve::gpu is a static library (its link_map has no name), else libnerve_gpu.so.
std::filesystem::path own_folder() {
  Dl_info info{};
  link_map* map = nullptr;
  std::error_code ec;
  if (dladdr1(reinterpret_cast<const void*>(&own_folder), &info, reinterpret_cast<void**>(&map),
              RTLD_DL_LINKMAP) != 0 &&
      map && map->l_name && map->l_name[0] == '/') {
    auto p = std::filesystem::canonical(map->l_name, ec);
    if (!ec) return p.parent_path();
  }
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::filesystem::path() : exe.parent_path();
}

/// Where `file` is looked for, in order (module.hpp).
std::vector<std::string> module_candidates(const std::string& file, const char* env_var) {
  if (const char* p = env_var ? std::getenv(env_var) : nullptr; p && *p) return {p};
  std::vector<std::string> out;
  if (const auto dir = own_folder(); !dir.empty()) {
    out.push_back((dir / file).string());
    out.push_back((dir.parent_path() / "lib" / file).string());
  }
  out.push_back(file);  // no slash: dlopen searches LD_LIBRARY_PATH, RUNPATH and ld.so.cache
  return out;
}

}  // namespace

opened_module open_module(const std::string& file, const char* env_var) {
  const auto candidates = module_candidates(file, env_var);
  opened_module m;
  std::string tried;
  for (const auto& c : candidates) {
    const bool searched = c.find('/') == std::string::npos;
    std::error_code ec;
    if (!searched && !std::filesystem::exists(c, ec)) {
      tried += (tried.empty() ? "" : ", ") + c;
      continue;
    }
    m.path = c;
    m.handle = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (m.handle) return m;
    const char* why = dlerror();
    if (searched) {
      m.error = file + " not found (looked for " + (tried.empty() ? std::string("it") : tried) +
                ", then on the library search path: " + (why ? why : "dlopen failed") + ")" +
                (env_var ? std::string("; set ") + env_var + " to its path" : std::string());
    } else {
      m.error = "cannot load " + c + ": " + (why ? why : "dlopen failed");
    }
    return m;
  }
  // Only an override that does not exist gets here.
  m.path = candidates.front();
  m.error = m.path + " (from " + std::string(env_var ? env_var : "the override") + ") does not exist";
  return m;
}

}  // namespace nerve::gpu::detail

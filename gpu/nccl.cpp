#include "gpu/nccl.hpp"

#include "gpu/detail/module.hpp"
#include "gpu/detail/nccl_module.hpp"
#include "gpu/status.hpp"

#include <dlfcn.h>

namespace nerve::gpu {

namespace {

struct nccl_table {
  decltype(&nerve_nccl_init_all) init_all = nullptr;
  decltype(&nerve_nccl_unique_id) unique_id = nullptr;
  decltype(&nerve_nccl_init_rank) init_rank = nullptr;
  decltype(&nerve_nccl_all_reduce_sum) all_reduce_sum = nullptr;
  decltype(&nerve_nccl_destroy) destroy = nullptr;
  std::string error;  ///< why NCCL cannot be used; empty when it can
};

template <class F>
void bind(void* h, const char* name, F& f, std::string& error) {
  f = reinterpret_cast<F>(dlsym(h, name));
  if (!f && error.empty()) error = std::string("NCCL module has no ") + name;
}

/// Opened once, by the first caller; never unloaded.
const nccl_table& table() {
  static const nccl_table loaded = [] {
    nccl_table t;
    if (!NERVE_HAS_NCCL) {
      t.error = "NCCL was not built (no nccl.h and libnccl beside the CUDA toolkit)";
      return t;
    }
    const auto mod = detail::open_module(detail::nccl_module_file, detail::nccl_module_env);
    if (!mod.handle) {
      t.error = "NCCL could not be loaded: " + mod.error;
      return t;
    }
    bind(mod.handle, "nerve_nccl_init_all", t.init_all, t.error);
    bind(mod.handle, "nerve_nccl_unique_id", t.unique_id, t.error);
    bind(mod.handle, "nerve_nccl_init_rank", t.init_rank, t.error);
    bind(mod.handle, "nerve_nccl_all_reduce_sum", t.all_reduce_sum, t.error);
    bind(mod.handle, "nerve_nccl_destroy", t.destroy, t.error);
    return t;
  }();
  return loaded;
}

const nccl_table& checked() {
  const auto& t = table();
  if (!t.error.empty()) throw error(errc::not_supported, t.error);
  return t;
}

void check(int rc, const char* err) {
  if (rc != 0) throw error(errc::invalid_argument, std::string("NCCL: ") + err);
}

}  // namespace

bool nccl_comms::available(std::string* why) {
  const auto& t = table();
  if (why) *why = t.error;
  return t.error.empty();
}

std::string nccl_comms::unique_id() {
  const auto& t = checked();
  std::string id(detail::nccl_id_bytes, '\0');
  char err[256] = {};
  check(t.unique_id(id.data(), err, sizeof err), err);
  return id;
}

nccl_comms::nccl_comms(const std::vector<device*>& devices) {
  const auto& t = checked();
  std::vector<int> ordinals;
  for (auto* d : devices) {
    if (d->kind() != backend_kind::cuda) throw error(errc::not_supported, "NCCL: " + d->name() + " is not a CUDA device");
    ordinals.push_back(d->ordinal());
  }
  comms_.assign(devices.size(), nullptr);
  char err[256] = {};
  check(t.init_all(int(ordinals.size()), ordinals.data(), comms_.data(), err, sizeof err), err);
}

nccl_comms::nccl_comms(device& dev, int nranks, int rank, const std::string& id) {
  const auto& t = checked();
  if (dev.kind() != backend_kind::cuda) throw error(errc::not_supported, "NCCL: " + dev.name() + " is not a CUDA device");
  if (id.size() != detail::nccl_id_bytes) throw error(errc::invalid_argument, "NCCL: an id of " + std::to_string(id.size()) + " bytes");
  comms_.assign(1, nullptr);
  char err[256] = {};
  check(t.init_rank(&comms_[0], nranks, id.data(), rank, dev.ordinal(), err, sizeof err), err);
}

nccl_comms::~nccl_comms() {
  if (!comms_.empty()) table().destroy(int(comms_.size()), comms_.data());
}

void nccl_comms::all_reduce_sum(const std::vector<stream>& streams,
                                const std::vector<std::vector<std::pair<float*, std::size_t>>>& buffers) {
  const auto& t = checked();
  if (streams.size() != comms_.size() || buffers.size() != comms_.size())
    throw error(errc::invalid_argument, "NCCL: " + std::to_string(streams.size()) + " streams and " +
                                            std::to_string(buffers.size()) + " buffer lists for " +
                                            std::to_string(comms_.size()) + " communicators");
  const std::size_t nb = buffers.empty() ? 0 : buffers[0].size();
  std::vector<void*> native;
  std::vector<float*> ptrs;
  std::vector<std::size_t> counts;
  for (auto& [p, n] : buffers.empty() ? std::vector<std::pair<float*, std::size_t>>{} : buffers[0]) counts.push_back(n);
  for (std::size_t c = 0; c < comms_.size(); ++c) {
    native.push_back(streams[c].native_handle());
    if (buffers[c].size() != nb) throw error(errc::invalid_argument, "NCCL: buffer lists of different lengths");
    for (std::size_t b = 0; b < nb; ++b) {
      if (buffers[c][b].second != counts[b]) throw error(errc::invalid_argument, "NCCL: buffers of different sizes");
      ptrs.push_back(buffers[c][b].first);
    }
  }
  char err[256] = {};
  check(t.all_reduce_sum(int(comms_.size()), comms_.data(), native.data(), int(nb), ptrs.data(), counts.data(), err,
                         sizeof err),
        err);
}

}  // namespace nerve::gpu

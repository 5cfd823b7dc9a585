#include "gpu/layers/train.hpp"

#include "actors/runtime.hpp"
#include "gpu/device.hpp"
#include "gpu/layers/device_backend.hpp"
#include "gpu/nccl.hpp"
#include "layers/devices.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <initializer_list>
#include <stdexcept>
#include <string>

namespace nerve::gpu {

namespace {

/// This process's place among the ranks on its machine, and how many there are, as the
/// launcher says (Open MPI's or MPICH's variables; 0 of 1 without them).
int env_int(std::initializer_list<const char*> names, int otherwise) noexcept {
  for (auto* n : names)
    if (const char* v = std::getenv(n)) return std::atoi(v);
  return otherwise;
}

/// The CUDA device of this rank when none is named: its local rank's, modulo the devices
/// it sees. Replicas across ranks sum with NCCL where it is built, which refuses two ranks
/// on one GPU: with more ranks on this machine than GPUs, say so before starting.
int cuda_ordinal_of_rank(bool replicas_across_ranks) {
  const int count = device::cuda_device_count();
  const int local = env_int({"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"}, 0);
  const int here = env_int({"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}, 1);
  if (count == 0) return 0;  // opening it says there is none
  if (replicas_across_ranks && here > count && nccl_comms::available())
    throw std::invalid_argument(std::to_string(here) + " ranks on this machine share its " + std::to_string(count) +
                                " CUDA device(s): replicas across ranks sum with NCCL, which takes one GPU per rank "
                                "(start at most " + std::to_string(count) + " ranks per machine)");
  return local % count;
}

/// A `gpu::device` behind the registry's handle: backends are `device_backend`s on it.
class opened_device final : public layers::device_handle {
 public:
  explicit opened_device(const device_options& d) : dev_(d) {}
  std::string name() const override { return dev_.name(); }
  std::shared_ptr<layers::backend> make_backend(layers::graph& g, const std::vector<std::size_t>& nodes,
                                                const layers::optimizer_settings& o, std::size_t max_batch) override {
    device_backend_options so;
    so.make_optimizer = [o] { return layers::make_optimizer<float>(o.name, o.lr, o.momentum, o.weight_decay, o.nesterov, o.beta2); };
    so.max_batch = max_batch;
    so.nodes = nodes;
    return std::make_shared<device_backend>(dev_, g, so);
  }
  void trace_metadata(nlohmann::json& extra) const override {
    extra["device"] = {{"name", dev_.name()}, {"ordinal", dev_.ordinal()}};
  }

 private:
  device dev_;
};

std::unique_ptr<layers::device_handle> open(backend_kind kind, const layers::device_spec& spec,
                                            const layers::device_request& r) {
  device_options d;
  d.backend = kind;
  d.ordinal = spec.ordinal >= 0 ? spec.ordinal
                                : kind == backend_kind::cuda && r.ranked ? cuda_ordinal_of_rank(r.replicas_across_ranks)
                                                                         : 0;
  if (r.rt) {
    // --trace: every wait is a span on the stream's track, with arrows from the enqueuing
    // handler to it and from it to the completion's run.
    if (r.rt->trace().enabled()) d.recorder = &r.rt->trace();
    // The runtime's synchronize waits for the completions in flight too.
    d.counter = {[rt = r.rt] { rt->begin_work(); }, [rt = r.rt] { rt->end_work(); }};
  }
  return std::make_unique<opened_device>(d);
}

}  // namespace

void register_devices() {
  layers::register_device("cuda", [](const layers::device_spec& s, const layers::device_request& r) {
    return open(backend_kind::cuda, s, r);
  });
  layers::register_device("standin", [](const layers::device_spec& s, const layers::device_request& r) {
    return open(backend_kind::standin, s, r);
  });
}

}  // namespace nerve::gpu

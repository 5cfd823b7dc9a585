#include "gpu/layers/train.hpp"

#include "gpu/device.hpp"
#include "gpu/layers/device_backend.hpp"
#include "layers/network.hpp"
#include "layers/trainer.hpp"

#include "actors/runtime.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <future>
#include <stdexcept>

namespace nerve::gpu {

bool parse_device(const std::string& spec, int& backend, int& ordinal) {
  ordinal = 0;
  if (spec == "cpu") return false;
  if (spec == "standin") {
    backend = int(backend_kind::standin);
    return true;
  }
  if (spec == "cuda" || spec.rfind("cuda:", 0) == 0) {
    backend = int(backend_kind::cuda);
    if (spec.size() > 5) {
      std::size_t used = 0;
      try {
        ordinal = std::stoi(spec.substr(5), &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != spec.size() - 5 || ordinal < 0)
        throw std::invalid_argument("--device '" + spec + "': expected cuda:N with N a device number");
    }
    return true;
  }
  throw std::invalid_argument("unknown --device '" + spec + "' (cpu, cuda, cuda:N, standin)");
}

namespace {

/// The layer actors of a `network`, their kernels on one stream of a device.
class device_engine : public layers::train_engine {
 public:
  device_engine(actors::runtime& rt, layers::graph& g, const layers::train_options& o, device_options d)
      : rt_(rt), dev_(with_runtime(d, rt)),
        backend_(std::make_shared<device_backend>(
            dev_, g,
            device_backend_options{.optimizer = {o.optimizer, o.lr, o.momentum, o.weight_decay, o.nesterov},
                                   .max_batch = std::max(o.batch, layers::evaluation_rows)})),
        net_(rt, g, std::make_shared<layers::cross_entropy>(), {}, layers::network_options{.backend = backend_}) {}

  std::future<layers::step_result> train_step(layers::tensor x, layers::targets y, std::size_t micro_batches,
                                              std::uint64_t step, double lr) override {
    return net_.train_step(std::move(x), std::move(y), micro_batches, step, lr);
  }
  std::future<layers::step_result> evaluate(layers::tensor x, layers::targets y) override {
    return net_.evaluate(std::move(x), std::move(y));
  }
  std::size_t steps_in_flight() const override { return net_.steps_in_flight(); }
  void finish() override {
    rt_.synchronize();  // the completions are counted work (with_runtime)
    backend_->download();
  }
  layers::optimizer_state optimizer_state_of() override { return backend_->save_optimizer_state(); }
  void load_optimizer_state(const layers::optimizer_state& state) override { backend_->load_optimizer_state(state); }
  void sync_weights() override { backend_->download(); }
  void trace_metadata(nlohmann::json& extra) const override {
    extra["device"] = {{"name", dev_.name()}, {"ordinal", dev_.ordinal()}};
  }

 private:
  static device_options with_runtime(device_options d, actors::runtime& rt) {
    // --trace: every wait is a span on the stream's track, with arrows from the enqueuing
    // handler to it and from it to the completion's run.
    if (rt.trace().enabled()) d.recorder = &rt.trace();
    // The runtime's synchronize waits for the completions in flight too.
    d.counter = {[&rt] { rt.begin_work(); }, [&rt] { rt.end_work(); }};
    return d;
  }

  actors::runtime& rt_;
  device dev_;  // destroyed last: the backend waits for its stream
  std::shared_ptr<device_backend> backend_;
  layers::network net_;
};

}  // namespace

void register_engines() {
  auto make = [](actors::runtime& rt, layers::graph& g, const layers::train_options& o) -> std::unique_ptr<layers::train_engine> {
    int backend = 0, ordinal = 0;
    if (!parse_device(o.device, backend, ordinal)) return layers::make_network_engine(rt, g, o);
    device_options d;
    d.backend = backend_kind(backend);
    d.ordinal = ordinal;
    return std::make_unique<device_engine>(rt, g, o, d);
  };
  layers::register_engine("cuda", make);
  layers::register_engine("standin", make);
}

}  // namespace nerve::gpu

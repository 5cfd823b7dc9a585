// The trainer's engines for a graph run as one `network` of layer actors: their kernels
// the CPU's, or a device's named by `train_options::device` (layers/devices.hpp); and
// what every engine does by default. The trainer itself is in layers/trainer.cpp.
#include <algorithm>
#include <future>
#include <memory>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "actors/runtime.hpp"
#include "layers/devices.hpp"
#include "layers/layer_actor.hpp"
#include "layers/network.hpp"
#include "layers/trainer.hpp"

namespace nerve::layers {

namespace {

/// The graph's layer actors as a `network`: their kernels the CPU's (`cpu`), or a device
/// backend's on one stream (any other `train_options::device`).
class network_engine : public train_engine {
 public:
  network_engine(actors::runtime& rt, graph& g, const train_options& o, std::unique_ptr<device_handle> dev)
      : rt_(rt),
        dev_(std::move(dev)),
        backend_(dev_ ? dev_->make_backend(g, {}, optimizer_settings_of(o), std::max(o.batch, evaluation_rows))
                      : nullptr),
        net_(rt, g, std::make_shared<cross_entropy>(), dev_ ? optimizer_factory{} : make_optimizer_factory(o),
             network_options{.spread = o.spread, .backend = backend_, .stall_timeout_s = o.stall_timeout}) {
    if (o.allow_nonfinite && !dev_)
      for (auto& a : net_.layer_actors()) rt.send(a, allow_nonfinite_gradients{});
  }
  std::future<step_result> train_step(tensor x, targets y, std::size_t micro_batches, std::uint64_t step,
                                      double lr) override {
    return net_.train_step(std::move(x), std::move(y), micro_batches, step, lr);
  }
  std::future<step_result> evaluate(tensor x, targets y) override { return net_.evaluate(std::move(x), std::move(y)); }
  std::future<tensor> predict(tensor x) override { return net_.predict(std::move(x)); }
  std::size_t steps_in_flight() const override { return net_.steps_in_flight(); }
  void finish() override {
    rt_.synchronize();  // a device's completions are counted work (`device_request::rt`)
    if (backend_) backend_->download();
  }
  optimizer_state optimizer_state_of() override { return net_.optimizer_state_of(); }
  void load_optimizer_state(const optimizer_state& state) override { net_.load_optimizer_state(state); }
  void sync_weights() override {
    if (backend_) backend_->download();
  }
  void trace_metadata(nlohmann::json& extra) const override {
    if (dev_) dev_->trace_metadata(extra);
  }

 private:
  actors::runtime& rt_;
  std::unique_ptr<device_handle> dev_;  // destroyed last: the backend waits for its stream
  std::shared_ptr<backend> backend_;    // null: the CPU
  network net_;
};

}  // namespace

optimizer_settings optimizer_settings_of(const train_options& o) {
  return {o.optimizer, o.lr, o.momentum, o.weight_decay, o.nesterov, o.beta2};
}

std::unique_ptr<train_engine> make_network_engine(actors::runtime& rt, graph& g, const train_options& o) {
  return std::make_unique<network_engine>(rt, g, o, nullptr);
}

engine_factory engine_for(const std::string& device) {
  const auto spec = parse_device(device);
  if (spec.cpu()) return make_network_engine;
  return [spec](actors::runtime& rt, graph& g, const train_options& o) -> std::unique_ptr<train_engine> {
    return std::make_unique<network_engine>(rt, g, o, open_device(spec, device_request{.rt = &rt}));
  };
}

optimizer_state train_engine::optimizer_state_of() {
  throw std::invalid_argument("--checkpoint: this engine cannot save its optimizer state");
}
void train_engine::load_optimizer_state(const optimizer_state&) {
  throw std::invalid_argument("--resume: this engine cannot restore an optimizer state");
}

}  // namespace nerve::layers

#include "gpu/layers/train.hpp"

#include "gpu/device.hpp"
#include "gpu/layers/device_network.hpp"
#include "layers/trainer.hpp"

#include "actors/runtime.hpp"

#include <boost/asio/post.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <future>
#include <span>
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

/// A graph on one stream of a device, driven by the trainer.
class device_engine : public layers::train_engine {
 public:
  device_engine(actors::runtime& rt, layers::graph& g, const layers::train_options& o, device_options d)
      : g_(g), rt_(rt), dev_(with_recorder(d, rt)),
        net_(dev_, g, device_optimizer{o.optimizer, o.lr, o.momentum, o.weight_decay, o.nesterov},
             rt.loop(0).get_executor(),
             device_network_options{.max_batch = std::max(o.batch, layers::evaluation_rows), .slots = 2}) {}

  std::future<layers::step_result> train_step(layers::tensor x, layers::targets y, std::size_t micro_batches,
                                              std::uint64_t step, double lr) override {
    auto& rec = rt_.trace();
    const auto start = rec.enabled() ? rec.now() : 0;
    // The batch is copied into a pinned slot before this returns: x and y may go.
    auto done = net_.train_step(host(x), y.labels, micro_batches, lr);
    return std::async(std::launch::deferred, [done = std::move(done), &rec, start, step]() mutable {
      const auto r = done.get();
      if (rec.enabled()) rec.span(0, "step", "step", start, rec.now(), -1, nullptr, -1, -1, std::int64_t(step));
      return layers::step_result{r.loss, r.correct, r.samples};
    });
  }
  std::future<layers::step_result> evaluate(layers::tensor x, layers::targets y) override {
    auto done = net_.evaluate(host(x), y.labels);
    return std::async(std::launch::deferred, [done = std::move(done)]() mutable {
      const auto r = done.get();
      return layers::step_result{r.loss, r.correct, r.samples};
    });
  }
  void finish() override {
    net_.download(g_);
    // The last completion handler records its run after it set the step's future: wait
    // for the loop to pass it before anyone reads the records.
    std::promise<void> passed;
    boost::asio::post(rt_.loop(0), [&passed] { passed.set_value(); });
    passed.get_future().wait();
  }
  layers::optimizer_state optimizer_state_of() override { return net_.optimizer_state(); }
  void load_optimizer_state(const layers::optimizer_state& state) override { net_.load_optimizer_state(state); }
  void sync_weights() override { net_.download(g_); }
  void trace_metadata(nlohmann::json& extra) const override {
    extra["device"] = {{"name", dev_.name()}, {"ordinal", dev_.ordinal()}};
  }

 private:
  static device_options with_recorder(device_options d, actors::runtime& rt) {
    // --trace: every step's work is a span on its stream's track, with arrows from the
    // trainer's step slice to the span and from the span to the completion's run.
    if (rt.trace().enabled()) d.recorder = &rt.trace();
    return d;
  }
  static std::span<const float> host(const layers::tensor& x) {
    return {x.data(), static_cast<std::size_t>(x.size())};
  }

  layers::graph& g_;
  actors::runtime& rt_;
  device dev_;           // destroyed after the network, which waits for its stream
  device_network net_;
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

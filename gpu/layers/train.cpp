#include "gpu/layers/train.hpp"

#include "gpu/device.hpp"
#include "gpu/loop_thread.hpp"
#include "gpu/layers/device_network.hpp"
#include "layers/data/batcher.hpp"
#include "layers/data/dataset.hpp"
#include "layers/lr_schedule.hpp"
#include "layers/presets.hpp"

#include "actors/recorder.hpp"

#include <boost/asio/post.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <future>
#include <optional>
#include <stdexcept>
#include <thread>

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

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}


}  // namespace

layers::train_report train(const layers::train_options& o, const std::string& spec,
                           const std::function<void(const layers::train_progress&)>& on_progress,
                           const std::function<void(const layers::epoch_stats&)>& on_epoch) {
  int backend = 0, ordinal = 0;
  if (!parse_device(spec, backend, ordinal)) return layers::train(o, on_progress, on_epoch);
  if (o.batch == 0) throw std::invalid_argument("--batch must be at least 1");
  if (o.micro_batches == 0 || o.micro_batches > o.batch)
    throw std::invalid_argument("--microbatches must be between 1 and the batch size");
  if (o.epochs <= 0 && o.steps < 0) throw std::invalid_argument("--epochs must be at least 1");

  auto g = layers::make_preset(o.model, o.seed);
  if (!o.init.empty()) layers::load_weights(g, o.init);
  const auto train_set = data::load_fashion_mnist(o.data, data::split::train);
  std::optional<data::dataset> test_set;
  if (o.evaluate) test_set = data::load_fashion_mnist(o.data, data::split::test);
  const std::size_t features = train_set.features();
  if (std::size_t(g.nodes()[g.inputs()[0]].output_shape.numel()) != features)
    throw std::invalid_argument("model '" + o.model + "' takes samples of " +
                                g.nodes()[g.inputs()[0]].output_shape.to_string() + " but the data has " +
                                std::to_string(features) + " features");

  // --trace: the device records every step's work as a span on its stream's track, with
  // arrows from the trainer (track 0, inside the step's slice) to the span and from the
  // span to the completion handler's run on the network's loop.
  actors::recorder rec;
  rec.enable(!o.trace.empty());
  device_options dopt;
  dopt.backend = backend_kind(backend);
  dopt.ordinal = ordinal;
  if (!o.trace.empty()) dopt.recorder = &rec;
  // Destroyed in reverse: the network (waits for its stream), the device (its
  // completion thread stops: nothing posts to the loop any more), then the loop.
  loop_thread loop;
  device dev(dopt);
  const std::size_t eval_chunk = 1000;
  device_optimizer opt{o.optimizer, o.lr, o.momentum, o.weight_decay, o.nesterov};
  device_network net(dev, g, opt, loop.executor(),
                     device_network_options{.max_batch = std::max(o.batch, eval_chunk), .slots = 2});

  data::batcher batcher(train_set.size(), data::batcher_options{o.batch, o.shuffle, o.seed, false});
  const std::size_t batches = batcher.batches_per_epoch();
  const std::int64_t total_steps = o.steps >= 0
                                       ? std::min<std::int64_t>(o.steps, std::int64_t(batches) * std::max(o.epochs, 1))
                                       : std::int64_t(batches) * o.epochs;
  auto lr_at = [&](std::int64_t t) {
    if (o.schedule == "none") return o.lr;
    if (o.schedule == "step") return layers::step_lr{o.lr, std::max<std::int64_t>(1, total_steps / 3)}(t);
    if (o.schedule == "cosine") return layers::cosine_lr{o.lr, std::max<std::int64_t>(1, total_steps)}(t);
    throw std::invalid_argument("unknown --schedule '" + o.schedule + "' (none, step, cosine)");
  };
  (void)lr_at(0);

  layers::train_report report;
  report.parameters = g.parameter_count();
  std::int64_t step = 0;
  const int epochs = o.steps >= 0 ? int((o.steps + std::int64_t(batches) - 1) / std::int64_t(batches)) : o.epochs;
  std::vector<float> x[2];
  std::vector<std::int32_t> y[2];
  auto gather = [&](std::size_t b, int k) {
    const auto rows = batcher.indices(b).size();
    x[k].resize(rows * features);
    y[k].resize(rows);
    batcher.gather(train_set, b, x[k], y[k]);
  };
  for (int epoch = 0; epoch < std::max(epochs, 1) && (o.steps < 0 || step < o.steps); ++epoch) {
    const auto t0 = std::chrono::steady_clock::now();
    layers::epoch_stats st;
    st.epoch = epoch + 1;
    batcher.set_epoch(std::uint64_t(epoch));
    double loss_sum = 0;
    std::int64_t correct = 0, seen = 0;
    gather(0, 0);
    for (std::size_t b = 0; b < batches && (o.steps < 0 || step < o.steps); ++b) {
      const int k = int(b % 2);
      const auto rows = y[k].size();
      const auto step_start = rec.enabled() ? rec.now() : 0;
      auto done = net.train_step(x[k], y[k], std::min<std::size_t>(o.micro_batches, rows), lr_at(step));
      // The batch was copied into a pinned slot: gather the next one while the device works.
      if (b + 1 < batches) gather(b + 1, 1 - k);
      const auto r = done.get();
      if (rec.enabled()) rec.span(0, "step", "step", step_start, rec.now(), -1, nullptr, -1, -1, step);
      ++step;
      ++st.steps;
      loss_sum += r.loss * double(r.samples);
      correct += r.correct;
      seen += r.samples;
      if (on_progress)
        on_progress({epoch + 1, b + 1, batches, loss_sum / double(seen), double(seen) / seconds_since(t0)});
    }
    st.seconds = seconds_since(t0);
    st.train_loss = seen ? loss_sum / double(seen) : 0;
    st.train_accuracy = seen ? double(correct) / double(seen) : 0;
    st.samples_per_s = st.seconds > 0 ? double(seen) / st.seconds : 0;
    if (test_set) {
      double tl = 0;
      std::int64_t tc = 0;
      for (std::size_t first = 0; first < test_set->size(); first += eval_chunk) {
        const auto rows = std::min(eval_chunk, test_set->size() - first);
        auto v = test_set->rows(first, rows);
        std::vector<std::int32_t> labels(test_set->labels.begin() + std::ptrdiff_t(first),
                                         test_set->labels.begin() + std::ptrdiff_t(first + rows));
        const auto r = net.evaluate(v, labels).get();
        tl += r.loss * double(r.samples);
        tc += r.correct;
      }
      st.test_loss = tl / double(test_set->size());
      st.test_accuracy = double(tc) / double(test_set->size());
    }
    report.epochs.push_back(st);
    if (on_epoch) on_epoch(st);
  }
  report.steps = step;
  net.download(g);
  if (!o.trace.empty()) {
    // The last completion handler records its run after it set the step's future: wait
    // for the loop to pass it before reading the records.
    std::promise<void> passed;
    boost::asio::post(loop.context(), [&passed] { passed.set_value(); });
    passed.get_future().wait();
    rec.write_file(o.trace, nlohmann::json::array(),
                   {{"device", {{"name", dev.name()}, {"ordinal", dev.ordinal()}}}, {"model", o.model}});
  }
  if (!o.save.empty()) layers::save_weights(g, o.save, o.model);
  return report;
}

}  // namespace nerve::gpu

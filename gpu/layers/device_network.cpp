#include "gpu/layers/device_network.hpp"

#include "gpu/kernels.hpp"
#include "gpu/status.hpp"
#include "layers/graph.hpp"
#include "layers/plan.hpp"
#include "layers/linear.hpp"
#include "layers/conv2d.hpp"

#include <algorithm>
#include <cstring>

namespace nerve::gpu {

namespace {

struct node_plan {
  std::string name;
  std::unique_ptr<device_layer> layer;  // null for a graph input
  std::vector<std::size_t> inputs;
  shape_t sample;                       // output sample shape (no batch)
};

/// Pinned staging of one step in flight: the batch going in, the figures coming out.
struct slot {
  pinned_buffer in;   // max_batch·features floats, then max_batch int32 labels
  pinned_buffer out;  // per micro-batch: loss sum (float), then per micro-batch: correct (int32)
  std::atomic<bool> busy{false};
};

shape_t with_batch(std::size_t n, const shape_t& sample) {
  shape_t s{n};
  s.insert(s.end(), sample.begin(), sample.end());
  return s;
}

std::size_t numel(const shape_t& s) {
  std::size_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

}  // namespace

struct device_network::impl {
  device& dev;
  boost::asio::any_io_executor executor;
  device_parameters params;
  device_network_options options;
  std::vector<node_plan> nodes;  // graph node order
  std::vector<std::size_t> order;
  std::size_t input = 0, output = 0, features = 0, classes = 0;
  std::vector<std::unique_ptr<slot>> slots;
  std::size_t max_micro_batches = 64;

  impl(device& d, boost::asio::any_io_executor ex, device_optimizer o, device_network_options opts)
      : dev(d), executor(std::move(ex)), params(std::move(o)), options(opts) {}
};

device_network::device_network(device& dev, layers::basic_graph<float>& g, device_optimizer opt,
                               boost::asio::any_io_executor executor, device_network_options options)
    : stream_(dev.create_stream(options.stream)),
      impl_(std::make_unique<impl>(dev, std::move(executor), std::move(opt), options)) {
  auto& m = *impl_;
  if (g.inputs().size() != 1) throw error(errc::not_supported, "device_network: graphs with one input only");
  m.input = g.inputs()[0];
  m.output = g.output();
  m.order = g.order();
  std::vector<bool> from_input(g.nodes().size(), false);  // does the node's gradient get computed?
  for (std::size_t i = 0; i < g.nodes().size(); ++i) {
    auto& n = g.nodes()[i];
    node_plan p;
    p.name = n.name;
    p.inputs = n.inputs;
    for (auto d : n.output_shape.dims()) p.sample.push_back(std::size_t(d));
    m.nodes.push_back(std::move(p));
  }
  for (auto i : m.order) {
    auto& n = g.nodes()[i];
    if (n.is_input()) continue;
    auto& p = m.nodes[i];
    try {
      p.layer = make_device_layer(stream_, *n.layer);
    } catch (const error& e) {
      throw error(e.code(), n.name + ": " + e.what());
    }
    // Products of the forward (and B, W) for GFLOP/s.
    double fwd = 0, w = 0;
    if (auto* l = dynamic_cast<layers::basic_linear<float>*>(n.layer.get())) {
      fwd = 2.0 * double(l->in_features()) * double(l->out_features());
      w = fwd;
    } else if (auto* c = dynamic_cast<layers::basic_conv2d<float>*>(n.layer.get())) {
      const auto& o = c->options();
      const double pixels = double(n.output_shape.numel()) / double(o.out_channels);
      fwd = 2.0 * double(o.out_channels) * double(o.in_channels * o.kernel[0] * o.kernel[1]) * pixels;
      w = fwd;
    }
    const bool wants_dx = std::any_of(n.inputs.begin(), n.inputs.end(), [&](std::size_t k) { return !g.nodes()[k].is_input(); });
    flops_per_sample_ += fwd + w + (wants_dx ? fwd : 0.0);
    for (auto& dp : p.layer->parameters()) m.params.add(stream_, n.name + "." + dp.name, dp);
  }
  m.features = numel(m.nodes[m.input].sample);
  m.classes = numel(m.nodes[m.output].sample);
  for (std::size_t k = 0; k < std::max<std::size_t>(1, options.slots); ++k) {
    auto s = std::make_unique<slot>();
    s->in = pinned_buffer(dev, options.max_batch * (m.features * sizeof(float) + sizeof(std::int32_t)));
    s->out = pinned_buffer(dev, m.max_micro_batches * (sizeof(float) + sizeof(std::int32_t)));
    m.slots.push_back(std::move(s));
  }
  stream_.synchronize();
}

device_network::~device_network() {
  // Nothing may be reading the pinned slots when they go: wait for the stream.
  // (Off the loops, as the constructor.) Errors were reported to the handlers.
  try {
    stream_.synchronize();
  } catch (...) {
  }
}

void device_network::synchronize() { stream_.synchronize(); }

void device_network::async_train_step(std::span<const float> x, std::span<const std::int32_t> labels,
                                      std::size_t micro_batches, double lr, handler h) {
  launch(x, labels, micro_batches, lr, true, std::move(h));
}

void device_network::async_evaluate(std::span<const float> x, std::span<const std::int32_t> labels, handler h) {
  launch(x, labels, 1, -1, false, std::move(h));
}

namespace {
std::future<device_step_result> as_future(std::function<void(device_network::handler)> start) {
  auto p = std::make_shared<std::promise<device_step_result>>();
  auto f = p->get_future();
  start([p](std::error_code ec, device_step_result r) {
    if (ec)
      p->set_exception(std::make_exception_ptr(error(ec, "device_network step")));
    else
      p->set_value(r);
  });
  return f;
}
}  // namespace

std::future<device_step_result> device_network::train_step(std::span<const float> x,
                                                           std::span<const std::int32_t> labels,
                                                           std::size_t micro_batches, double lr) {
  return as_future([&](handler h) { async_train_step(x, labels, micro_batches, lr, std::move(h)); });
}

std::future<device_step_result> device_network::evaluate(std::span<const float> x,
                                                         std::span<const std::int32_t> labels) {
  return as_future([&](handler h) { async_evaluate(x, labels, std::move(h)); });
}

void device_network::launch(std::span<const float> x, std::span<const std::int32_t> labels, std::size_t parts,
                            double lr, bool train, handler h) {
  auto& m = *impl_;
  auto& s = stream_;
  const auto traced_from = s.trace_now();  // the trace's span of this step starts here
  const std::size_t rows = labels.size();
  if (rows == 0 || x.size() != rows * m.features)
    throw error(errc::invalid_argument, "device_network: " + std::to_string(x.size()) + " inputs for " +
                                            std::to_string(rows) + " labels of " + std::to_string(m.features) +
                                            " features");
  if (rows > m.options.max_batch)
    throw error(errc::invalid_argument, "device_network: batch " + std::to_string(rows) + " above max_batch " +
                                            std::to_string(m.options.max_batch));
  if (parts == 0 || parts > rows || parts > m.max_micro_batches)
    throw error(errc::invalid_argument, "device_network: " + std::to_string(parts) + " micro-batches of " +
                                            std::to_string(rows) + " rows");
  for (auto l : labels)
    if (l < 0 || std::size_t(l) >= m.classes)
      throw error(errc::invalid_argument, "device_network: label " + std::to_string(l) + " outside [0, " +
                                              std::to_string(m.classes) + ")");
  slot* sl = nullptr;
  for (auto& c : m.slots) {
    bool expected = false;
    if (c->busy.compare_exchange_strong(expected, true, std::memory_order_acq_rel)) {
      sl = c.get();
      break;
    }
  }
  if (!sl) throw error(errc::invalid_argument, "device_network: every staging slot is in flight");

  bool counted = false;
  try {
    auto* px = static_cast<float*>(sl->in.data());
    auto* pl = reinterpret_cast<std::int32_t*>(px + m.options.max_batch * m.features);
    std::memcpy(px, x.data(), x.size_bytes());
    std::memcpy(pl, labels.data(), labels.size_bytes());

    device_buffer labels_dev(s, rows * sizeof(std::int32_t));
    copy_async(s, labels_dev.data(), pl, rows * sizeof(std::int32_t));
    device_buffer figures(s, parts * (sizeof(float) + sizeof(std::int32_t)));
    auto* loss_sums = static_cast<float*>(figures.data());
    auto* corrects = reinterpret_cast<std::int32_t*>(loss_sums + parts);

    if (train)
      m.params.zero_grad(s);

    const auto split = layers::split_micro_batches(std::int64_t(rows), parts);  // the one split rule
    for (std::size_t mb = 0; mb < parts; ++mb) {
      const auto first = std::size_t(split[mb].first), n = std::size_t(split[mb].count);
      std::vector<device_tensor> outputs(m.nodes.size());
      std::vector<device_stash> stashes(m.nodes.size());
      outputs[m.input] = device_tensor(s, with_batch(n, m.nodes[m.input].sample));
      copy_async(s, outputs[m.input].data(), px + first * m.features, n * m.features * sizeof(float));
      for (auto i : m.order) {
        auto& node = m.nodes[i];
        if (!node.layer) continue;
        std::vector<const device_tensor*> ins;
        for (auto k : node.inputs) ins.push_back(&outputs[k]);
        node.layer->forward(s, ins, outputs[i], stashes[i]);
      }
      const auto* lab = static_cast<const std::int32_t*>(labels_dev.data()) + first;
      const device_tensor& logits = outputs[m.output];
      device_tensor probs(s, logits.shape());
      device_tensor row_loss(s, {n});
      softmax_xent_forward(s, logits.data(), lab, n, m.classes, probs.data(), row_loss.data(), corrects + mb);
      column_sums(s, row_loss.data(), n, 1, loss_sums + mb, 0.0f);
      if (train) {
        std::vector<device_tensor> grads(m.nodes.size());
        grads[m.output] = device_tensor(s, logits.shape());
        // d(mean over the mini-batch)/d(logits): (nᵢ/N)·(1/nᵢ) = 1/N.
        softmax_xent_backward(s, probs.data(), lab, n, m.classes, 1.0f / float(rows), grads[m.output].data());
        for (auto it = m.order.rbegin(); it != m.order.rend(); ++it) {
          const auto i = *it;
          auto& node = m.nodes[i];
          if (!node.layer || grads[i].empty()) continue;
          std::uint64_t wanted = 0;
          for (std::size_t k = 0; k < node.inputs.size(); ++k)
            if (m.nodes[node.inputs[k]].layer) wanted |= std::uint64_t{1} << k;
          auto g = node.layer->backward_input(s, stashes[i], grads[i], wanted);
          node.layer->backward_weight(s, stashes[i], grads[i]);
          for (std::size_t k = 0; k < node.inputs.size() && k < g.size(); ++k) {
            if (g[k].empty()) continue;
            auto& acc = grads[node.inputs[k]];
            if (acc.empty())
              acc = std::move(g[k]);
            else
              axpy(s, acc.size(), 1.0f, g[k].data(), acc.data());
          }
          grads[i] = device_tensor();  // freed in stream order, after the work that reads it
        }
      }
    }

    if (train) {
      m.params.step(s, lr);
    }
    copy_async(s, sl->out.data(), figures.data(), parts * (sizeof(float) + sizeof(std::int32_t)));
    in_flight_.fetch_add(1, std::memory_order_acq_rel);
    counted = true;
    s.async_wait(m.executor, [this, sl, parts, rows, h = std::move(h)](std::error_code ec) {
      device_step_result r;
      if (!ec) {
        const auto* sums = static_cast<const float*>(sl->out.data());
        const auto* right = reinterpret_cast<const std::int32_t*>(sums + parts);
        double total = 0;
        for (std::size_t k = 0; k < parts; ++k) {
          total += double(sums[k]);
          r.correct += right[k];
        }
        r.loss = total / double(rows);
        r.samples = std::int64_t(rows);
      }
      sl->busy.store(false, std::memory_order_release);
      in_flight_.fetch_sub(1, std::memory_order_acq_rel);
      h(ec, r);
    }, span_label{train ? "train_step" : "evaluate", traced_from});
  } catch (...) {
    if (counted) in_flight_.fetch_sub(1, std::memory_order_acq_rel);
    sl->busy.store(false, std::memory_order_release);
    throw;
  }
}

layers::basic_optimizer_state<float> device_network::optimizer_state() { return impl_->params.state(stream_); }

void device_network::load_optimizer_state(const layers::basic_optimizer_state<float>& state) {
  impl_->params.load(stream_, state);
}

void device_network::download(layers::basic_graph<float>& g) {
  stream_.synchronize();
  for (std::size_t i = 0; i < impl_->nodes.size(); ++i)
    if (impl_->nodes[i].layer) download_parameters(stream_, *impl_->nodes[i].layer, *g.nodes().at(i).layer);
}

void device_network::upload(layers::basic_graph<float>& g) {
  stream_.synchronize();
  for (std::size_t i = 0; i < impl_->nodes.size(); ++i)
    if (impl_->nodes[i].layer) upload_parameters(stream_, *impl_->nodes[i].layer, *g.nodes().at(i).layer);
}

void device_network::download_gradients(layers::basic_graph<float>& g) {
  stream_.synchronize();
  for (std::size_t i = 0; i < impl_->nodes.size(); ++i)
    if (impl_->nodes[i].layer) gpu::download_gradients(stream_, *impl_->nodes[i].layer, *g.nodes().at(i).layer);
}

}  // namespace nerve::gpu

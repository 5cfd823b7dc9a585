#include "gpu/layers/device_backend.hpp"

#include "gpu/layers/detail/device_backend_impl.hpp"
#include "gpu/layers/host_all_reduce.hpp"
#include "gpu/status.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <stdexcept>

namespace nerve::gpu {

device_backend::device_backend(device& dev, layers::graph& g, device_backend_options options)
    : impl_(std::make_unique<impl>(dev, std::move(options))) {
  auto& m = *impl_;
  for (auto i : g.order()) {
    auto& n = g.nodes()[i];
    const auto& only = m.options.nodes;
    if (n.is_input() || (!only.empty() && std::find(only.begin(), only.end(), i) == only.end())) continue;
    auto e = std::make_unique<detail::node_entry>(
        detail::node_entry{&n, n.layer->as_op_layer(), {}, {}, device_parameters(m.options.optimizer)});
    if (e->op) {
      detail::mirror_parameters(m.s, *e);
    } else {
      // Not written with ops: the layer runs on the host in the stream's order, with a CPU
      // optimizer of the same settings.
      const auto& o = m.options.optimizer;
      e->host_opt = layers::make_optimizer<float>(o.kind, o.lr, o.momentum, o.weight_decay, o.nesterov);
    }
    for (auto& p : e->parameters) e->params.add(m.s, p.name, p);  // the layer's names, as on the CPU
    m.nodes.push_back(std::move(e));
  }
  if (g.inputs().size() != 1) throw error(errc::not_supported, "device backend: graphs with one input only");
  m.features = g.nodes()[g.inputs()[0]].output_shape.numel();
  const auto rows = m.options.max_batch * kSlots;
  m.in = pinned_buffer(dev, rows * std::size_t(m.features) * sizeof(float));
  m.labels = pinned_buffer(dev, rows * sizeof(std::int32_t));
  m.figures = pinned_buffer(dev, rows * (sizeof(float) + sizeof(std::int32_t)));
  m.s.synchronize();
}

device_backend::~device_backend() {
  // Nothing may be reading the pinned staging when it goes.
  try {
    impl_->s.synchronize();
  } catch (...) {
  }
}

std::string_view device_backend::name() const noexcept {
  return impl_->dev.kind() == backend_kind::cuda ? "cuda" : "standin";
}

void device_backend::check_loss(const layers::loss& criterion) const {
  if (!dynamic_cast<const layers::cross_entropy*>(&criterion))
    throw std::invalid_argument("device backend: the loss must be softmax cross-entropy");
}

std::unique_ptr<layers::layer_kernels> device_backend::kernels_for(layers::graph::node_type& node) {
  for (auto& e : impl_->nodes)
    if (e->node == &node) return detail::make_kernels(*impl_, *e);
  throw std::invalid_argument("device backend: node '" + node.name + "' is not in its graph");
}

layers::value device_backend::feed(layers::tensor& batch, std::int64_t first, std::int64_t count, std::uint64_t step) {
  auto& m = *impl_;
  if (batch.features() != m.features || std::size_t(batch.batch()) > m.options.max_batch)
    throw error(errc::invalid_argument, "device backend: a batch of " + batch.shape_string() + " (at most " +
                                            std::to_string(m.options.max_batch) + " rows of " +
                                            std::to_string(m.features) + " features)");
  // Each micro-batch stages at its own rows of its step's slot: a step's copies never
  // overlap, and a slot is written again only after the step before last completed.
  const auto row = std::int64_t(step % kSlots * m.options.max_batch) + first;
  auto* px = m.in.as<float>().data() + row * m.features;
  const auto bytes = std::size_t(count * m.features) * sizeof(float);
  std::memcpy(px, batch.row(first), bytes);
  auto t = std::make_shared<device_tensor>(m.s, detail::with_batch(count, batch.sample_shape()));
  copy_async(m.s, t->data(), px, bytes);
  return detail::wrap(std::move(t));
}

void device_backend::loss(actors::actor& owner, const layers::loss&, layers::value output, const layers::targets& t,
                          std::int64_t first, std::uint64_t step, double share, bool train, bool want_output,
                          const std::function<void(layers::value)>& gradient,
                          std::function<void(layers::loss_figures&)> report) {
  auto& m = *impl_;
  auto& s = m.s;
  const auto logits = detail::tensor_of(output);
  const std::size_t n = logits->rows(), classes = logits->cols();
  if (std::size_t(first) + n > m.options.max_batch)
    throw error(errc::invalid_argument, "device backend: a loss over rows [" + std::to_string(first) + ", " +
                                            std::to_string(first + std::int64_t(n)) + ") of a batch of at most " +
                                            std::to_string(m.options.max_batch));
  first += std::int64_t(step % kSlots * m.options.max_batch);  // the step's slot of the staging
  auto* sum = reinterpret_cast<float*>(static_cast<char*>(m.figures.data()) + first * 8);
  auto* right = reinterpret_cast<std::int32_t*>(sum + 1);
  const bool labelled = !t.labels.empty();
  if (labelled) {
    if (t.labels.size() != n) throw std::invalid_argument("device backend: labels for another batch");
    for (auto l : t.labels)
      if (l < 0 || std::size_t(l) >= classes)
        throw error(errc::invalid_argument, "device backend: label " + std::to_string(l) + " outside [0, " +
                                                std::to_string(classes) + ")");
    auto* pl = m.labels.as<std::int32_t>().data() + first;
    std::memcpy(pl, t.labels.data(), n * sizeof(std::int32_t));
    device_buffer lab(s, n * sizeof(std::int32_t)), figures(s, sizeof(float) + sizeof(std::int32_t));
    copy_async(s, lab.data(), pl, n * sizeof(std::int32_t));
    auto* dsum = static_cast<float*>(figures.data());
    auto* dright = reinterpret_cast<std::int32_t*>(dsum + 1);
    device_tensor probs(s, logits->shape()), row_loss(s, {n});
    const auto* labels = static_cast<const std::int32_t*>(lab.data());
    softmax_xent_forward(s, logits->data(), labels, n, classes, probs.data(), row_loss.data(), dright);
    column_sums(s, row_loss.data(), n, 1, dsum, 0.0f);
    if (train) {
      // share/n = (nᵢ/N)·(1/nᵢ): the gradient of the mini-batch mean.
      auto g = std::make_shared<device_tensor>(s, logits->shape());
      softmax_xent_backward(s, probs.data(), labels, n, classes, float(share / double(n)), g->data());
      gradient(detail::wrap(std::move(g)));
    }
    copy_async(s, sum, figures.data(), sizeof(float) + sizeof(std::int32_t));
  }
  m.download(owner, {want_output ? logits.get() : nullptr}, "loss",
             [sum, right, n, labelled, report = std::move(report)](std::vector<layers::tensor>& host) {
    layers::loss_figures f;
    if (labelled) {
      f.loss = double(*sum) / double(n);
      f.correct = *right;
    }
    f.output = std::move(host[0]);
    report(f);
  });
}

void device_backend::download() {
  auto& m = *impl_;
  m.s.synchronize();
  for (auto& e : m.nodes) {
    if (e->on_host()) continue;  // trained in the graph's own layer
    auto host = e->op->parameters();
    for (std::size_t i = 0; i < host.size(); ++i)
      copy_async(m.s, host[i].value->data(), e->parameters[i].value->data(), e->parameters[i].value->bytes());
    auto host_buffers = e->op->buffers();  // running statistics, which training changed here
    for (std::size_t i = 0; i < host_buffers.size(); ++i)
      copy_async(m.s, host_buffers[i].value->data(), e->buffers[i]->data(), e->buffers[i]->bytes());
    m.s.synchronize();  // pageable host memory
  }
}

actors::address device_backend::spawn_reducer(actors::runtime& rt, actors::spawn_options so, std::string name,
                                              bus::group members, const std::vector<layers::backend*>& replicas) {
  std::vector<device_backend*> all;
  bool one_device = true;
  for (auto* b : replicas) {
    auto* d = dynamic_cast<device_backend*>(b);
    if (!d)
      throw std::invalid_argument("pipeline: the replicas of a device stage must all run on devices ('" + name +
                                  "' has one on the CPU)");
    one_device = one_device && d->domain() == domain();
    all.push_back(d);
  }
  if (one_device)
    return rt.spawn_with<device_all_reduce>(std::move(so), std::move(name), std::move(members), impl_->reduce_stream());
  // One replica per device: NCCL among the devices, each on a reduce stream of its own.
  std::vector<device*> devices;
  std::vector<gpu::stream> streams;
  for (auto* d : all) {
    if (std::any_of(devices.begin(), devices.end(), [&](device* e) { return &e->core() == &d->impl_->dev.core(); }))
      throw error(errc::not_supported, "device backend: '" + name +
                                           "': replicas on several devices run one per device (NCCL), or all on one");
    devices.push_back(&d->impl_->dev);
    streams.push_back(d->impl_->reduce_stream());
  }
  return rt.spawn_with<nccl_all_reduce>(std::move(so), std::move(name), std::move(members), std::move(devices),
                                        std::move(streams));
}

bool device_backend::sums_across_ranks() const {
  return impl_->dev.kind() == backend_kind::cuda && nccl_comms::available();
}

std::string device_backend::new_rank_id() { return nccl_comms::unique_id(); }

actors::address device_backend::spawn_rank_reducer(actors::runtime& rt, actors::spawn_options so, std::string name,
                                                   actors::address local, const layers::rank_reduce& how) {
  auto& m = *impl_;
  if (how.id.empty()) {  // through the host: this rank's copies, the ranks' member-order sum
    auto a = rt.spawn_with<host_all_reduce>(so, name, std::move(local), how.me, m.dev, m.reduce_stream());
    static_cast<host_all_reduce*>(a.get())->reduce_with(how.host(a));
    return a;
  }
  if (!m.rank_group)
    m.rank_group = std::make_shared<nccl_rank_group>(m.dev, how.members, how.me, how.id, m.reduce_stream());
  if (m.rank_group->id() != how.id || m.rank_group->me() != how.me)
    throw std::logic_error("device backend: '" + name + "' joins another NCCL group than its stage's layers");
  if (!m.rank_group->loop) m.rank_group->loop = so.loop;
  if (!so.loop || m.rank_group->loop != so.loop)  // the group's order is kept on one loop
    throw actors::wiring_error("device backend: '" + name + "' reduces on another loop than its stage's other layers");
  return rt.spawn_with<nccl_all_reduce>(std::move(so), std::move(name), std::move(local), m.rank_group);
}

void device_backend::synchronize() { impl_->s.synchronize(); }
const void* device_backend::domain() const noexcept { return &impl_->dev.core(); }
std::int64_t device_backend::host_transfers() const noexcept { return impl_->host_transfers; }
gpu::stream& device_backend::stream() noexcept { return impl_->s; }

}  // namespace nerve::gpu

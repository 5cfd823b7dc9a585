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
    auto e = std::make_unique<detail::node_entry>();
    e->node = &n;
    e->op = n.layer->as_op_layer();
    // Not written with ops: the layer runs on the host in the stream's order.
    if (e->op) detail::mirror_parameters(m.s, *e);
    if (!m.options.make_optimizer) throw error(errc::invalid_argument, "device backend: no optimizer factory");
    e->opt = m.options.make_optimizer();
    m.nodes.push_back(std::move(e));
  }
  if (g.inputs().size() != 1) throw error(errc::not_supported, "device backend: graphs with one input only");
  m.features = g.nodes()[g.inputs()[0]].output_shape.numel();
  const auto rows = m.options.max_batch * kSlots;
  m.in = pinned_buffer(dev, rows * std::size_t(m.features) * sizeof(float));
  const auto& out = g.nodes()[g.output()].output_shape;
  m.labels_per_row = out.rank() == 2 ? out[0] : 1;
  m.labels = pinned_buffer(dev, rows * std::size_t(m.labels_per_row) * sizeof(std::int32_t));
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
  if (!criterion.as_op_loss())
    throw std::invalid_argument("device backend: the loss " + std::string(criterion.kind()) +
                                " is not written with ops (layers::op_loss), so it runs on the CPU only");
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

void device_backend::loss(actors::actor& owner, const layers::loss& criterion, layers::value output,
                          const layers::targets& t, std::int64_t first, std::uint64_t step, double share, bool train,
                          bool want_output, const std::function<void(layers::value)>& gradient,
                          std::function<void(layers::loss_figures&)> report) {
  auto& m = *impl_;
  auto& s = m.s;
  const auto prediction = detail::tensor_of(output);
  const std::size_t n = prediction->rows();
  if (std::size_t(first) + n > m.options.max_batch)
    throw error(errc::invalid_argument, "device backend: a loss over rows [" + std::to_string(first) + ", " +
                                            std::to_string(first + std::int64_t(n)) + ") of a batch of at most " +
                                            std::to_string(m.options.max_batch));
  std::shared_ptr<device_tensor> terms, correct;
  double divisor = 1;
  if (!t.labels.empty() || !t.values.empty()) {
    const auto* written = criterion.as_op_loss();
    if (!written) check_loss(criterion);  // says why
    // The targets on the device: labels staged at the step's slot rows (a slot is written
    // again only after the step before last completed), values uploaded.
    layers::op_targets target;
    device_buffer labels;
    if (!t.labels.empty()) {
      if (t.labels.size() != n * std::size_t(t.labels_per_sample) || t.labels_per_sample > m.labels_per_row)
        throw std::invalid_argument("device backend: " + std::to_string(t.labels.size()) + " labels for a batch of " +
                                    std::to_string(n) +
                                    (m.labels_per_row == 1 ? std::string()
                                                           : " samples of at most " + std::to_string(m.labels_per_row) +
                                                                 " tokens"));
      auto* pl = m.labels.as<std::int32_t>().data() +
                 (std::int64_t(step % kSlots * m.options.max_batch) + first) * m.labels_per_row;
      std::memcpy(pl, t.labels.data(), t.labels.size() * sizeof(std::int32_t));
      labels = device_buffer(s, std::max<std::size_t>(1, t.labels.size()) * sizeof(std::int32_t));
      copy_async(s, labels.data(), pl, t.labels.size() * sizeof(std::int32_t));
      target.labels = static_cast<const std::int32_t*>(labels.data());
      target.host_labels = t.labels;
    }
    std::shared_ptr<device_tensor> values;
    if (!t.values.empty()) {
      values = m.upload(owner, t.values);
      target.values = device_op_set::array_of(values);
    }
    auto run = written->compute(*m.ops, device_op_set::array_of(prediction), target);
    if (train) gradient(detail::wrap(m.ops->tensor_of(written->gradient(*m.ops, run, target, float(share)))));
    terms = m.ops->tensor_of(run.terms);
    if (!run.correct.empty()) correct = m.ops->tensor_of(run.correct);
    divisor = run.divisor;
  }
  // The figures (and the output, for a prediction) come back through pinned memory.
  m.download(owner, {terms.get(), correct.get(), want_output ? prediction.get() : nullptr}, "loss",
             [divisor, report = std::move(report)](std::vector<layers::tensor>& host) {
               layers::loss_figures f;
               if (!host[0].empty()) {
                 double sum = 0;  // as the CPU sums them: in double, in order
                 for (std::int64_t i = 0; i < host[0].size(); ++i) sum += double(host[0].data()[i]);
                 f.loss = divisor > 0 ? sum / divisor : 0.0;
               }
               if (!host[1].empty()) f.correct = std::int64_t(host[1].data()[0]);
               f.output = std::move(host[2]);
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

#include "gpu/layers/device_backend.hpp"

#include "actors/actor.hpp"
#include "gpu/kernels.hpp"
#include "gpu/layers/device_all_reduce.hpp"
#include "gpu/layers/host_all_reduce.hpp"
#include "gpu/layers/nccl_all_reduce.hpp"
#include "gpu/status.hpp"
#include "layers/graph.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <stdexcept>

namespace nerve::gpu {

namespace {

/// A device tensor on an edge. Consumers only read it, so a fan-out shares it (and so
/// does the producer's stash, which needs its output until backward).
struct device_value final : layers::backend_data {
  std::shared_ptr<device_tensor> t;
  event ready;  ///< set on a copy for another stream (layer_kernels::hand_over): its stream waits for it
  explicit device_value(std::shared_ptr<device_tensor> v, event e = {}) : t(std::move(v)), ready(std::move(e)) {}
  std::unique_ptr<layers::backend_data> clone() const override { return std::make_unique<device_value>(t, ready); }
  std::size_t payload_bytes() const noexcept override { return t->bytes(); }
};

/// What a device layer keeps for backward: its stash points into these tensors.
struct device_kept final : layers::backend_data {
  std::vector<std::shared_ptr<device_tensor>> inputs;
  std::shared_ptr<device_tensor> output;
  device_stash st;
  std::unique_ptr<layers::backend_data> clone() const override {
    throw std::logic_error("device backend: a stash is not cloned");
  }
  std::size_t payload_bytes() const noexcept override {
    std::size_t b = output->bytes() + st.indices.bytes();
    for (auto& t : inputs) b += t->bytes();
    return b;
  }
};

const std::shared_ptr<device_tensor>& tensor_of(const layers::value& v) {
  auto* d = dynamic_cast<const device_value*>(v.device.get());
  if (!d) throw std::logic_error("device backend: a host tensor reached a device layer");
  return d->t;
}

layers::value wrap(std::shared_ptr<device_tensor> t) { return layers::value(std::make_unique<device_value>(std::move(t))); }

shape_t with_batch(std::int64_t n, const layers::shape& sample) {
  shape_t s{std::size_t(n)};
  for (auto d : sample.dims()) s.push_back(std::size_t(d));
  return s;
}

/// A host tensor of `t`'s shape.
layers::tensor host_like(const device_tensor& t) {
  std::vector<std::int64_t> dims(t.shape().begin() + 1, t.shape().end());
  return layers::tensor(std::int64_t(t.rows()), layers::shape(std::move(dims)));
}

/// One layer node on the device: its twin and its optimizer.
struct node_entry {
  layers::graph::node_type* node;
  std::unique_ptr<device_layer> layer;
  device_parameters params;
};

}  // namespace

struct device_backend::impl {
  device& dev;
  gpu::stream s;
  device_backend_options options;
  std::vector<std::unique_ptr<node_entry>> nodes;
  std::int64_t features = 0;
  pinned_buffer in, labels, figures;  // max_batch rows of inputs, labels, (loss sum, correct)
  // Staging of downloads (hooks, predicted outputs, values handed to the host) and uploads
  // (values adopted from the host); shared with the completions that give blocks back.
  std::shared_ptr<pinned_pool> pool;
  std::atomic<std::int64_t> host_transfers{0};
  // Events of other streams this one waits for: a pooled event handed back at once could
  // be recorded again before the wait passed it (the stand-in's wait follows the latest
  // record), so they are kept until the next completion after the wait.
  std::vector<event> waited;
  // Device sums of the replica group this stream copied from: they live until the
  // completion after the copy, as the events above.
  std::vector<std::shared_ptr<layers::backend_data>> sums;
  // Replica 0's backend of a stage: the stream its layers' device all-reduces sum on (and,
  // replicas one per rank, the stream of this rank's copies or NCCL calls).
  gpu::stream reduce;
  // Replicas one per rank with NCCL: this rank's communicator, shared by the layers.
  std::shared_ptr<nccl_rank_group> rank_group;

  gpu::stream& reduce_stream() {
    if (!reduce.valid()) reduce = dev.create_stream(options.stream);
    return reduce;
  }

  impl(device& d, device_backend_options o)
      : dev(d), s(d.create_stream(o.stream)), options(std::move(o)), pool(std::make_shared<pinned_pool>(d)) {}

  /// `then` as a `backend_done` in `owner`'s mailbox once the work enqueued so far is done;
  /// `what` names the wait's span in the trace.
  void when_done(actors::actor& owner, std::function<void()> then, const char* what) {
    after_stream(owner, s, "device backend", [then = std::move(then), sums = std::exchange(sums, {})] { then(); },
                 std::exchange(waited, {}), span_label{what});
  }

  /// Downloads `ts` (null: skipped, left empty) through staging, then `fn` on their host
  /// copies in a completion on `owner` (`what` labels the wait).
  void download(actors::actor& owner, const std::vector<const device_tensor*>& ts, const char* what,
                std::function<void(std::vector<layers::tensor>&)> fn) {
    auto host = std::make_shared<std::vector<layers::tensor>>(ts.size());
    auto blocks = std::make_shared<std::vector<std::pair<layers::tensor*, pinned_buffer>>>();
    for (std::size_t i = 0; i < ts.size(); ++i) {
      if (!ts[i]) continue;
      (*host)[i] = host_like(*ts[i]);
      blocks->emplace_back(&(*host)[i], pool->take(ts[i]->bytes()));
      copy_async(s, blocks->back().second.data(), ts[i]->data(), ts[i]->bytes());
    }
    when_done(owner, [host, blocks, pool = pool, fn = std::move(fn)] {
      for (auto& [into, block] : *blocks) {
        std::memcpy(into->data(), block.data(), std::size_t(into->size()) * sizeof(float));
        pool->give(std::move(block));
      }
      fn(*host);
    }, what);
  }
};

namespace {

std::logic_error host_gradients() {
  return std::logic_error("device backend: the gradients of a device layer stay on the device (its replicas sum "
                          "them with a device all-reduce)");
}

class device_kernels final : public layers::layer_kernels {
 public:
  device_kernels(device_backend::impl& b, node_entry& e) : b_(b), e_(e) {}

  layers::value forward(std::vector<layers::value>& inputs, const layers::forward_context&, bool train,
                        layers::kept& keep) override {
    auto k = std::make_unique<device_kept>();
    std::vector<const device_tensor*> ptrs;
    for (auto& v : inputs) {
      k->inputs.push_back(tensor_of(v));
      ptrs.push_back(k->inputs.back().get());
    }
    k->output = std::make_shared<device_tensor>();
    e_.layer->forward(b_.s, ptrs, *k->output, k->st);
    auto out = wrap(k->output);
    if (train) keep.device = std::move(k);
    return out;
  }
  void add(layers::value& into, const layers::value& g) override {
    auto& acc = *tensor_of(into);
    axpy(b_.s, acc.size(), 1.0f, tensor_of(g)->data(), acc.data());
  }
  std::vector<layers::value> backward_input(const layers::kept& k, const layers::value& dy,
                                            layers::input_mask wanted) override {
    auto g = e_.layer->backward_input(b_.s, stash_of(k), *tensor_of(dy), wanted);
    std::vector<layers::value> out(g.size());
    for (std::size_t i = 0; i < g.size(); ++i)
      if (!g[i].empty()) out[i] = wrap(std::make_shared<device_tensor>(std::move(g[i])));
    return out;
  }
  void backward_weight(const layers::kept& k, const layers::value& dy) override {
    e_.layer->backward_weight(b_.s, stash_of(k), *tensor_of(dy));
  }
  void set_lr(double lr) override {
    if (lr >= 0) lr_ = lr;
  }
  void update(std::uint64_t, bool) override {
    e_.params.step(b_.s, lr_);
    e_.params.zero_grad(b_.s);
  }
  std::vector<float> gradients() override { throw host_gradients(); }
  void set_gradients(const std::vector<float>&) override { throw host_gradients(); }
  std::shared_ptr<layers::backend_data> device_gradients() override {
    auto g = std::make_shared<gpu::device_gradients>();
    for (auto& p : e_.layer->parameters()) g->parts.emplace_back(p.grad->data(), p.grad->size());
    g->ready = b_.s.record();
    g->domain = &b_.dev.core();
    g->ordinal = b_.dev.ordinal();
    return g;
  }
  void take_device_sum(std::shared_ptr<layers::backend_data> sum) override {
    auto* d = dynamic_cast<device_sum*>(sum.get());
    if (!d) throw std::logic_error("device backend: '" + e_.node->name + "' got a sum that is not on a device");
    b_.s.wait(d->ready);
    b_.waited.push_back(d->ready);
    if (!d->in_place) {  // the group's sum into this replica's gradients, before the update reads them
      std::size_t at = 0;
      for (auto& p : e_.layer->parameters()) {
        copy_async(b_.s, p.grad->data(), d->sum->data() + at, p.grad->bytes());
        at += p.grad->size();
      }
    }
    b_.sums.push_back(std::move(sum));
  }
  void when_done(actors::actor& owner, std::function<void()> then) override {
    b_.when_done(owner, std::move(then), "update");
  }
  void with_host(actors::actor& owner, std::vector<layers::value*> vs,
                 std::function<void(std::vector<layers::tensor>&)> fn) override {
    std::vector<const device_tensor*> ts;
    for (auto* v : vs) ts.push_back(v->empty() ? nullptr : tensor_of(*v).get());
    b_.download(owner, ts, "hooks", std::move(fn));
  }
  void adopt(actors::actor& owner, layers::value& v) override {
    if (!v.device) {  // from the host: through a pinned buffer, given back once copied
      const auto& h = v.host;
      auto t = std::make_shared<device_tensor>(b_.s, with_batch(h.batch(), h.sample_shape()));
      auto staging = b_.pool->take(t->bytes());
      std::memcpy(staging.data(), h.data(), t->bytes());
      copy_async(b_.s, t->data(), staging.data(), t->bytes());
      b_.s.async_wait(owner.executor(), [pool = b_.pool, b = std::move(staging)](std::error_code) mutable {
        pool->give(std::move(b));
      });
      ++b_.host_transfers;
      v = wrap(std::move(t));
      return;
    }
    auto* d = dynamic_cast<device_value*>(v.device.get());
    if (!d) throw std::logic_error("device backend: another backend's value reached '" + e_.node->name + "'");
    if (!d->ready.valid()) return;  // made on this stream
    b_.s.wait(d->ready);
    b_.waited.push_back(std::exchange(d->ready, {}));
    d->t->buffer().set_stream(b_.s);  // a copy of its own: freed after this stream's work
  }
  void hand_over(actors::actor& owner, layers::value v, bool to_host,
                 std::function<void(layers::value)> then) override {
    const auto& t = *tensor_of(v);
    if (!to_host) {  // a copy: the original may stay in a stash of this stream
      auto c = std::make_shared<device_tensor>(b_.s, t.shape());
      copy_async(b_.s, c->data(), t.data(), t.bytes());
      return then(layers::value(std::make_unique<device_value>(std::move(c), b_.s.record())));
    }
    ++b_.host_transfers;
    b_.download(owner, {&t}, "to host",
                [then = std::move(then)](auto& host) { then(layers::value(std::move(host[0]))); });
  }

 private:
  static const device_stash& stash_of(const layers::kept& k) {
    auto* d = dynamic_cast<const device_kept*>(k.device.get());
    if (!d) throw std::logic_error("device backend: backward without a device stash");
    return d->st;
  }
  device_backend::impl& b_;
  node_entry& e_;
  double lr_ = -1;
};

}  // namespace

device_backend::device_backend(device& dev, layers::graph& g, device_backend_options options)
    : impl_(std::make_unique<impl>(dev, std::move(options))) {
  auto& m = *impl_;
  for (auto i : g.order()) {
    auto& n = g.nodes()[i];
    const auto& only = m.options.nodes;
    if (n.is_input() || (!only.empty() && std::find(only.begin(), only.end(), i) == only.end())) continue;
    auto e = std::make_unique<node_entry>(node_entry{&n, nullptr, device_parameters(m.options.optimizer)});
    try {
      e->layer = make_device_layer(m.s, *n.layer);
    } catch (const error& err) {
      throw error(err.code(), n.name + ": " + err.what());
    }
    for (auto& p : e->layer->parameters()) e->params.add(m.s, n.name + "." + p.name, p);
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
    if (e->node == &node) return std::make_unique<device_kernels>(*impl_, *e);
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
  auto t = std::make_shared<device_tensor>(m.s, with_batch(count, batch.sample_shape()));
  copy_async(m.s, t->data(), px, bytes);
  return wrap(std::move(t));
}

void device_backend::loss(actors::actor& owner, const layers::loss&, layers::value output, const layers::targets& t,
                          std::int64_t first, std::uint64_t step, double share, bool train, bool want_output,
                          const std::function<void(layers::value)>& gradient,
                          std::function<void(layers::loss_figures&)> report) {
  auto& m = *impl_;
  auto& s = m.s;
  const auto logits = tensor_of(output);
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
      gradient(wrap(std::move(g)));
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
  for (auto& e : m.nodes) download_parameters(m.s, *e->layer, *e->node->layer);
}

layers::optimizer_state device_backend::save_optimizer_state() {
  layers::optimizer_state all;
  for (auto& e : impl_->nodes) {
    auto st = e->params.state(impl_->s);
    for (auto& b : st.buffers) all.buffers.push_back(std::move(b));
    all.counters.merge(st.counters);
  }
  return all;
}

void device_backend::load_optimizer_state(const layers::optimizer_state& state) {
  std::vector<layers::optimizer_state> parts(impl_->nodes.size());
  auto owner = [&](const std::string& name) -> std::size_t {
    for (std::size_t i = 0; i < impl_->nodes.size(); ++i) {
      const auto& n = impl_->nodes[i]->node->name;
      if (name.size() > n.size() && name.compare(0, n.size(), n) == 0 && name[n.size()] == '.') return i;
    }
    throw std::invalid_argument("optimizer state: '" + name + "' belongs to no layer on the device");
  };
  for (const auto& b : state.buffers) parts[owner(b.parameter)].buffers.push_back(b);
  for (const auto& [k, v] : state.counters) parts[owner(k)].counters[k] = v;
  for (std::size_t i = 0; i < parts.size(); ++i) impl_->nodes[i]->params.load(impl_->s, parts[i]);
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

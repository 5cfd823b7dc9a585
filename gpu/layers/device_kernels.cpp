// Each layer actor's kernels on a device backend: an op layer run with the backend's op
// set (layers written once), or a layer without ops run on the host (host_kernels.cpp).
#include "gpu/layers/detail/device_backend_impl.hpp"
#include "gpu/status.hpp"

namespace nerve::gpu::detail {

void mirror_parameters(stream& s, node_entry& e) {
  for (auto& p : e.op->parameters()) {
    const shape_t shape{std::size_t(p.value->batch()), std::size_t(p.value->features())};
    auto* v = e.op_tensors.emplace_back(std::make_unique<device_tensor>(s, shape)).get();
    auto* g = e.op_tensors.emplace_back(std::make_unique<device_tensor>(s, shape)).get();
    copy_async(s, v->data(), p.value->data(), v->bytes());
    fill_zero_async(s, g->data(), g->bytes());
    e.parameters.push_back({p.name, v, g});
    e.stepped.push_back({p.name, {p.torch_shape, v->data(), nullptr, -1}, {p.torch_shape, g->data(), nullptr, -1}});
  }
  for (auto& b : e.op->buffers()) {
    const shape_t shape{std::size_t(b.value->batch()), std::size_t(b.value->features())};
    auto* v = e.op_tensors.emplace_back(std::make_unique<device_tensor>(s, shape)).get();
    copy_async(s, v->data(), b.value->data(), v->bytes());
    e.buffers.push_back(v);
  }
  s.synchronize();  // pageable host memory
}

/// The op layer's parameter values, then its buffers (or the parameters' gradients), as
/// arrays the op set reads.
std::vector<layers::array> parameter_arrays(node_entry& e, bool grads) {
  std::vector<layers::array> out;
  auto host = e.op->parameters();
  for (std::size_t i = 0; i < e.parameters.size(); ++i) {
    auto* t = grads ? e.parameters[i].grad : e.parameters[i].value;
    out.push_back({host[i].torch_shape, t->data(), nullptr, -1});
  }
  if (grads) return out;
  auto host_buffers = e.op->buffers();
  for (std::size_t i = 0; i < e.buffers.size(); ++i)
    out.push_back({host_buffers[i].torch_shape, e.buffers[i]->data(), nullptr, -1});
  return out;
}

namespace {

std::logic_error host_gradients() {
  return std::logic_error("device backend: the gradients of a device layer stay on the device (its replicas sum "
                          "them with a device all-reduce)");
}

class device_kernels final : public layers::layer_kernels {
 public:
  device_kernels(device_backend::impl& b, node_entry& e) : b_(b), e_(e) {}

  layers::value forward(std::vector<layers::value>& inputs, const layers::forward_context& context, bool train,
                        layers::kept& keep) override {
    if (e_.on_host()) return host_forward(b_, e_, inputs, context, train, keep);
    std::vector<layers::array> in;
    for (auto& v : inputs) in.push_back(device_op_set::array_of(tensor_of(v)));
    auto run = std::make_unique<layers::basic_op_run<float>>(*e_.op, *b_.ops, std::move(in),
                                                             parameter_arrays(e_, false), e_.parameters.size(),
                                                             train, context);
    auto out = wrap(b_.ops->tensor_of(run->output()));
    if (train) {
      auto k = std::make_unique<op_kept>();
      k->run = std::move(run);
      keep.device = std::move(k);
    }
    return out;
  }
  void add(layers::value& into, const layers::value& g) override {
    auto& acc = *tensor_of(into);
    axpy(b_.s, acc.size(), 1.0f, tensor_of(g)->data(), acc.data());
  }
  std::vector<layers::value> backward_input(const layers::kept& k, const layers::value& dy,
                                            layers::input_mask wanted) override {
    if (e_.on_host()) return host_backward_input(b_, e_, k, dy, wanted);
    auto g = run_of(k).backward_input(device_op_set::array_of(tensor_of(dy)), wanted);
    std::vector<layers::value> out(g.size());
    for (std::size_t i = 0; i < g.size(); ++i)
      if (!g[i].empty()) out[i] = wrap(b_.ops->tensor_of(g[i]));
    return out;
  }
  void backward_weight(const layers::kept& k, const layers::value& dy) override {
    if (e_.on_host()) return host_backward_weight(b_, e_, k, dy);
    run_of(k).backward_weight(device_op_set::array_of(tensor_of(dy)), parameter_arrays(e_, true));
  }
  void set_lr(double lr) override {
    if (lr >= 0) lr_ = lr;
  }
  void update(std::uint64_t, bool) override {
    if (e_.on_host()) return host_update(b_, e_, lr_);
    if (e_.parameters.empty()) return;
    if (lr_ >= 0) e_.opt->set_lr(lr_);
    e_.opt->step(*b_.ops, e_.stepped);
    for (auto& p : e_.parameters) fill_zero_async(b_.s, p.grad->data(), p.grad->bytes());
  }
  std::vector<float> gradients() override { throw host_gradients(); }
  void set_gradients(const std::vector<float>&) override { throw host_gradients(); }
  std::shared_ptr<layers::backend_data> device_gradients() override {
    if (e_.on_host())
      throw error(errc::not_supported, "device backend: '" + e_.node->name + "' runs on the host (" +
                                           std::string(e_.node->layer->kind()) +
                                           " has no device kernels): its replicas cannot sum on the device");
    auto g = std::make_shared<gpu::device_gradients>();
    for (auto& p : e_.parameters) g->parts.emplace_back(p.grad->data(), p.grad->size());
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
      for (auto& p : e_.parameters) {
        copy_async(b_.s, p.grad->data(), d->sum->data() + at, p.grad->bytes());
        at += p.grad->size();
      }
    }
    b_.sums.push_back(std::move(sum));
  }
  void when_done(actors::actor& owner, std::function<void()> then) override {
    b_.when_done(owner, std::move(then), "update");
  }
  // The optimizer's state, the layer's parameter names (as on the CPU): it waits for the
  // stream, which runs on its own (a checkpoint asks between steps).
  layers::optimizer_state save_state() override {
    b_.s.synchronize();
    layers::optimizer_state st;
    e_.opt->save_state(st);
    return st;
  }
  void load_state(const layers::optimizer_state& st) override {
    b_.s.synchronize();
    if (e_.on_host()) return e_.opt->load_state(st, e_.node->layer->parameters());
    e_.opt->load_state(st, *b_.ops, e_.stepped);
  }
  void with_host(actors::actor& owner, std::vector<layers::value*> vs,
                 std::function<void(std::vector<layers::tensor>&)> fn) override {
    std::vector<const device_tensor*> ts;
    for (auto* v : vs) ts.push_back(v->empty() ? nullptr : tensor_of(*v).get());
    b_.download(owner, ts, "hooks", std::move(fn));
  }
  void adopt(actors::actor& owner, layers::value& v) override {
    if (!v.device) {  // from the host: through a pinned buffer, given back once copied
      ++b_.host_transfers;
      v = wrap(b_.upload(owner, v.host));
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
  layers::basic_op_run<float>& run_of(const layers::kept& k) const {
    auto* d = dynamic_cast<const op_kept*>(k.device.get());
    if (!d) throw std::logic_error("device backend: backward of '" + e_.node->name + "' without its stash");
    return *d->run;
  }
  device_backend::impl& b_;
  node_entry& e_;
  double lr_ = -1;
};

}  // namespace

std::unique_ptr<layers::layer_kernels> make_kernels(device_backend::impl& b, node_entry& e) {
  return std::make_unique<device_kernels>(b, e);
}

}  // namespace nerve::gpu::detail

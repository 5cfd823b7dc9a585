// A layer with no device kernels (not written with ops) inside a device
// backend: its CPU math runs on the host in the stream's order. Each call enqueues the
// copies of its inputs off the device into pinned staging, a host function that runs the
// layer (and keeps its stash), and the copy of its result back; later work on the stream
// waits for it, so the device's order holds and nothing blocks the actor's loop. Every
// copy counts in `device_backend::host_transfers`.
#include "gpu/layers/detail/device_backend_impl.hpp"
#include "gpu/status.hpp"

namespace nerve::gpu::detail {
namespace {

/// Pinned blocks of one call, given back to the pool by a host function after its copies.
using blocks = std::shared_ptr<std::vector<pinned_buffer>>;

/// `t` copied into a new pinned block of `bs` (counted).
void stage_out(device_backend::impl& b, const device_tensor& t, const blocks& bs) {
  bs->push_back(b.pool->take(t.bytes()));
  copy_async(b.s, bs->back().data(), t.data(), t.bytes());
  ++b.host_transfers;
}

/// A host tensor of `shape` (batch first) from a pinned block.
layers::tensor from_block(const shape_t& shape, const pinned_buffer& block) {
  std::vector<std::int64_t> sample(shape.begin() + 1, shape.end());
  layers::tensor t{std::int64_t(shape[0]), layers::shape(std::move(sample))};
  std::memcpy(t.data(), block.data(), std::size_t(t.size()) * sizeof(float));
  return t;
}

/// Gives `bs` back once the stream reaches this point.
void give_back(device_backend::impl& b, blocks bs) {
  b.s.enqueue_host([pool = b.pool, bs = std::move(bs)] {
    for (auto& block : *bs) pool->give(std::move(block));
  });
}

/// Runs `fn` on the stream's host thread unless a host function failed before; an
/// exception is kept for the backend's next completion (a host function must not throw).
template <class Fn>
void on_host(device_backend::impl& b, Fn fn) {
  b.s.enqueue_host([fn = std::move(fn), failed = b.host_failed]() mutable {
    if (failed->is_set()) return;
    try {
      fn();
    } catch (...) {
      failed->set(std::current_exception());
    }
  });
}

const host_kept& kept_of(const layers::kept& k, const node_entry& e) {
  auto* h = dynamic_cast<const host_kept*>(k.device.get());
  if (!h) throw std::logic_error("device backend: backward of '" + e.node->name + "' without its stash");
  return *h;
}

}  // namespace

layers::value host_forward(device_backend::impl& b, node_entry& e, std::vector<layers::value>& inputs,
                           const layers::forward_context& context, bool train, layers::kept& keep) {
  auto bs = std::make_shared<std::vector<pinned_buffer>>();
  auto k = std::make_unique<host_kept>();
  for (auto& v : inputs) {
    const auto& t = *tensor_of(v);
    stage_out(b, t, bs);
    k->input_shapes.push_back(t.shape());
    k->bytes += t.bytes();
  }
  const auto rows = inputs.empty() ? 0 : std::int64_t(k->input_shapes[0][0]);
  auto out = std::make_shared<device_tensor>(b.s, with_batch(rows, e.node->output_shape));
  bs->push_back(b.pool->take(out->bytes()));
  auto* result = &bs->back();  // a vector of blocks: the address stays until give_back
  on_host(b, [layer = e.node->layer.get(), bs, shapes = k->input_shapes, result, stash = k->stash, train, context] {
    std::vector<layers::tensor> in;
    for (std::size_t i = 0; i < shapes.size(); ++i) in.push_back(from_block(shapes[i], (*bs)[i]));
    layer->set_training(train);
    auto r = layer->forward(std::move(in), context);
    if (r.output.payload_bytes() > result->bytes())
      throw error(errc::invalid_argument, layer->label() + ": an output of " + r.output.shape_string() +
                                              " where the graph said " + std::to_string(result->bytes()) + " bytes");
    std::memcpy(result->data(), r.output.data(), r.output.payload_bytes());
    if (train) *stash = std::move(r.stash);
  });
  copy_async(b.s, out->data(), result->data(), out->bytes());
  ++b.host_transfers;
  give_back(b, std::move(bs));
  if (train) {
    k->bytes += out->bytes();
    keep.device = std::move(k);
  }
  return wrap(std::move(out));
}

std::vector<layers::value> host_backward_input(device_backend::impl& b, node_entry& e, const layers::kept& k,
                                               const layers::value& dy, layers::input_mask wanted) {
  const auto& h = kept_of(k, e);
  auto bs = std::make_shared<std::vector<pinned_buffer>>();
  const auto& g = *tensor_of(dy);
  stage_out(b, g, bs);
  std::vector<layers::value> out(h.input_shapes.size());
  std::vector<std::pair<std::shared_ptr<device_tensor>, std::size_t>> back;  // tensor, its block
  std::vector<std::size_t> where(h.input_shapes.size(), 0);  // input i's block; 0 (dy's): not wanted
  for (std::size_t i = 0; i < h.input_shapes.size(); ++i) {
    if (!(wanted & (layers::input_mask{1} << i))) continue;
    auto t = std::make_shared<device_tensor>(b.s, h.input_shapes[i]);
    bs->push_back(b.pool->take(t->bytes()));
    where[i] = bs->size() - 1;
    back.emplace_back(t, where[i]);
    out[i] = wrap(std::move(t));
  }
  on_host(b, [layer = e.node->layer.get(), bs, dshape = g.shape(), stash = h.stash, wanted, where] {
    auto grads = layer->backward_input(*stash, from_block(dshape, (*bs)[0]), wanted);
    for (std::size_t i = 0; i < grads.size() && i < where.size(); ++i)
      if (where[i] && !grads[i].empty())
        std::memcpy((*bs)[where[i]].data(), grads[i].data(), grads[i].payload_bytes());
  });
  for (auto& [t, block] : back) {
    copy_async(b.s, t->data(), (*bs)[block].data(), t->bytes());
    ++b.host_transfers;
  }
  give_back(b, std::move(bs));
  return out;
}

void host_backward_weight(device_backend::impl& b, node_entry& e, const layers::kept& k, const layers::value& dy) {
  if (!e.node->layer->has_parameters()) return;
  const auto& h = kept_of(k, e);
  auto bs = std::make_shared<std::vector<pinned_buffer>>();
  const auto& g = *tensor_of(dy);
  stage_out(b, g, bs);
  on_host(b, [layer = e.node->layer.get(), bs, dshape = g.shape(), stash = h.stash] {
    layer->backward_weight(*stash, from_block(dshape, (*bs)[0]));
  });
  give_back(b, std::move(bs));
}

void host_update(device_backend::impl& b, node_entry& e, double lr) {
  if (!e.node->layer->has_parameters()) return;
  on_host(b, [layer = e.node->layer.get(), opt = e.opt.get(), lr] {
    if (lr >= 0) opt->set_lr(lr);
    auto ps = layer->parameters();
    opt->step(ps);
    layer->zero_grad();
  });
}

}  // namespace nerve::gpu::detail

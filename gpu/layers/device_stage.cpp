// A pipeline stage on a stream: piece_executor's forward, B and W as device work,
// payloads device-resident between stages of one device, pinned copies elsewhere.
#include "gpu/layers/device_stage.hpp"

#include "gpu/kernels.hpp"
#include "gpu/message.hpp"
#include "gpu/status.hpp"
#include "layers/pipeline/piece.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <stdexcept>

namespace nerve::gpu {

namespace {

using layers::tensor;

/// What travels between two stages of one device: tensors and the event after which they are ready.
struct device_payload {
  std::vector<device_tensor> tensors;
  event ready;
};

/// Pinned staging buffers, reused: taken on the stage's loop, given back on it by the
/// completion handler of the copy that read or wrote them (never freed while in use).
class pinned_pool {
 public:
  explicit pinned_pool(device& d) : dev_(d) {}
  pinned_buffer take(std::size_t bytes) {
    bytes = std::max<std::size_t>(bytes, 256);
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it)
      if (it->bytes() >= bytes && (best == free_.end() || it->bytes() < best->bytes())) best = it;
    if (best != free_.end()) {
      pinned_buffer b = std::move(*best);
      free_.erase(best);
      return b;
    }
    // First use of this size: allocated once, kept for the next micro-batches.
    std::size_t size = 4096;
    while (size < bytes) size *= 2;
    return pinned_buffer(dev_, size);
  }
  void give_back(pinned_buffer b) {
    if (b.data()) free_.push_back(std::move(b));
  }

 private:
  device& dev_;
  std::vector<pinned_buffer> free_;
};

shape_t full_shape(const tensor& t) {
  shape_t s;
  for (auto d : t.full_shape()) s.push_back(std::size_t(d));
  return s;
}

layers::shape sample_shape(const shape_t& s) {
  std::vector<std::int64_t> d;
  for (std::size_t i = 1; i < s.size(); ++i) d.push_back(std::int64_t(s[i]));
  return layers::shape(std::move(d));
}

std::exception_ptr as_exception(std::error_code ec, std::uint32_t stage) {
  return std::make_exception_ptr(error(ec, "pipeline stage " + std::to_string(stage) + " on the device"));
}

/// One piece of the stage: its layers on the device and the micro-batches in flight.
struct device_piece {
  std::vector<std::size_t> nodes, in, out;  // as piece_executor
  bool first = false;                       // piece 0: its input is the batch
  struct held {
    std::map<std::size_t, device_tensor> values;  // node -> output (frontier inputs too); stable addresses
    std::vector<device_stash> stashes;            // by position in nodes
    std::vector<device_tensor> dy;                // after B, layers with parameters
    bool b_done = false, w_due = false;
    std::size_t bytes = 0;
  };
  std::map<std::uint64_t, held> held_;
  std::uint64_t next_w = 0;
};

class device_stage final : public pipeline::stage_engine {
 public:
  device_stage(device& dev, const pipeline::stage_engine_context& ctx, const device_stage_options& o)
      : dev_(dev), graph_(ctx.graph), stage_(ctx.stage), holds_last_(ctx.holds_last),
        s_(dev.create_stream(o.stream)), pool_(std::make_shared<pinned_pool>(dev)), params_(o.optimizer) {
    if (holds_last_ && !dynamic_cast<const layers::cross_entropy*>(ctx.criterion.get()))
      throw error(errc::not_supported, "pipeline stage " + std::to_string(stage_) +
                                           ": a device stage computes softmax cross-entropy only");
    auto& nodes = graph_.nodes();
    layers_.resize(nodes.size());
    for (auto piece : ctx.piece_of_chunk) {
      pipeline::piece_executor frontier(graph_, ctx.pieces, piece);  // the same frontiers as a CPU stage
      device_piece p;
      p.first = piece == 0;
      p.nodes = frontier.nodes();
      p.in = frontier.input_nodes();
      p.out = frontier.output_nodes();
      for (auto i : p.nodes) {
        try {
          layers_[i] = make_device_layer(s_, *nodes[i].layer);
        } catch (const error& e) {
          throw error(e.code(), nodes[i].name + ": " + e.what());
        }
        for (auto& dp : layers_[i]->parameters()) params_.add(s_, nodes[i].name + "." + dp.name, dp);
      }
      if (holds_last_) classes_ = std::size_t(nodes[graph_.output()].output_shape.numel());
      pieces_.push_back(std::move(p));
    }
    s_.synchronize();
  }

  ~device_stage() override {
    // Nothing may still read the pinned buffers or the parameters when they go (off the loops).
    try {
      s_.synchronize();
    } catch (...) {  // the error went to the step's handlers
    }
  }

  const void* domain() const noexcept override { return &dev_.core(); }
  std::string device_name() const override { return dev_.name(); }

  void begin_step(double lr, const boost::asio::any_io_executor& ex) override {
    executor_ = ex;
    if (lr >= 0) lr_ = lr;
    params_.zero_grad(s_);
    for (auto& p : pieces_) p.next_w = 0;
    figures_.clear();
    losses_->clear();
    waited_.clear();  // the last step's completion came after every wait on them
  }

  pipeline::stage_payload forward(std::uint32_t chunk, std::uint64_t mb, pipeline::stage_payload in) override {
    auto& p = piece(chunk);
    auto inputs = take(std::move(in), !p.first);
    if (inputs.size() != p.in.size())
      throw std::invalid_argument("device stage: " + std::to_string(p.in.size()) + " input tensors expected, got " +
                                  std::to_string(inputs.size()));
    if (p.held_.count(mb))
      throw std::invalid_argument("device stage: micro-batch " + std::to_string(mb) + " is already in flight");
    auto& h = p.held_[mb];
    for (std::size_t k = 0; k < p.in.size(); ++k) h.values.emplace(p.in[k], std::move(inputs[k]));
    h.stashes.resize(p.nodes.size());
    auto& nodes = graph_.nodes();
    for (std::size_t k = 0; k < p.nodes.size(); ++k) {
      const auto i = p.nodes[k];
      std::vector<const device_tensor*> ins;
      for (auto x : nodes[i].inputs) ins.push_back(&h.values.at(x));
      auto& out = h.values[i];
      layers_[i]->forward(s_, ins, out, h.stashes[k]);
    }
    for (auto& [i, t] : h.values) h.bytes += t.bytes();
    // The outputs stay for backward (stashes point at them): a copy travels.
    std::vector<device_tensor> out;
    for (auto x : p.out) out.push_back(copy_of(h.values.at(x)));
    return send(std::move(out));
  }

  pipeline::stage_payload loss(std::uint64_t mb, pipeline::stage_payload logits, const layers::targets& t,
                               double share) override {
    auto in = take(std::move(logits), false);
    const auto& y = in.at(0);
    const std::size_t n = y.rows();
    if (t.labels.size() != n)
      throw std::invalid_argument("device stage: " + std::to_string(t.labels.size()) + " labels for " +
                                  std::to_string(n) + " rows");
    for (auto l : t.labels)
      if (l < 0 || std::size_t(l) >= classes_)
        throw std::invalid_argument("device stage: label " + std::to_string(l) + " outside [0, " +
                                    std::to_string(classes_) + ")");
    device_buffer labels(s_, n * sizeof(std::int32_t));
    upload_bytes(labels.data(), t.labels.data(), n * sizeof(std::int32_t));
    device_tensor probs(s_, y.shape()), row_loss(s_, {n});
    auto& f = figures_[mb];
    f.rows = n;
    f.sums = device_buffer(s_, sizeof(float) + sizeof(std::int32_t));
    auto* sum = static_cast<float*>(f.sums.data());
    softmax_xent_forward(s_, y.data(), static_cast<const std::int32_t*>(labels.data()), n, classes_, probs.data(),
                         row_loss.data(), reinterpret_cast<std::int32_t*>(sum + 1));
    column_sums(s_, row_loss.data(), n, 1, sum, 0.0f);
    // layers::cross_entropy::backward: (p − onehot)·(scale / n) with scale = float(nᵢ/N).
    const float scale = n ? float(share) / float(n) : 0.0f;
    std::vector<device_tensor> g;
    g.emplace_back(s_, y.shape());
    softmax_xent_backward(s_, probs.data(), static_cast<const std::int32_t*>(labels.data()), n, classes_, scale,
                          g[0].data());
    return send(std::move(g));
  }

  pipeline::engine_loss loss_of(std::uint64_t mb) const override {
    auto it = losses_->find(mb);
    return it == losses_->end() ? pipeline::engine_loss{} : it->second;
  }

  pipeline::stage_payload backward_input(std::uint32_t chunk, std::uint64_t mb, pipeline::stage_payload grads) override {
    auto& p = piece(chunk);
    auto it = p.held_.find(mb);
    if (it == p.held_.end() || it->second.b_done)
      throw std::invalid_argument("device stage: backward of micro-batch " + std::to_string(mb) +
                                  ", which has no forward in flight");
    auto g = take(std::move(grads), true);
    if (g.size() != p.out.size())
      throw std::invalid_argument("device stage: " + std::to_string(p.out.size()) + " gradients expected, got " +
                                  std::to_string(g.size()));
    auto& h = it->second;
    auto& nodes = graph_.nodes();
    std::map<std::size_t, device_tensor> acc;
    for (std::size_t k = 0; k < p.out.size(); ++k) acc[p.out[k]] = std::move(g[k]);
    h.dy.resize(p.nodes.size());
    for (std::size_t k = p.nodes.size(); k-- > 0;) {
      const auto i = p.nodes[k];
      auto& n = nodes[i];
      auto dit = acc.find(i);
      if (dit == acc.end() || dit->second.empty())
        throw std::logic_error("device stage: no gradient reached '" + n.name + "'");
      device_tensor dy = std::move(dit->second);
      acc.erase(dit);
      std::uint64_t wanted = 0;
      for (std::size_t q = 0; q < n.inputs.size(); ++q)
        if (!nodes[n.inputs[q]].is_input()) wanted |= std::uint64_t{1} << q;
      auto gi = layers_[i]->backward_input(s_, h.stashes[k], dy, wanted);
      for (std::size_t q = 0; q < n.inputs.size() && q < gi.size(); ++q) {
        if (!(wanted & (std::uint64_t{1} << q)) || gi[q].empty()) continue;
        auto& a = acc[n.inputs[q]];
        if (a.empty()) a = std::move(gi[q]);
        else axpy(s_, a.size(), 1.0f, gi[q].data(), a.data());  // fan-out: latest consumer first
      }
      if (n.layer->has_parameters()) {
        h.bytes += dy.bytes();
        h.dy[k] = std::move(dy);
      }
    }
    h.b_done = true;
    std::vector<device_tensor> out;
    for (auto x : p.in) {
      auto a = acc.find(x);
      out.push_back(a == acc.end() ? device_tensor() : std::move(a->second));
    }
    return send(std::move(out));
  }

  void backward_weight(std::uint32_t chunk, std::uint64_t mb) override {
    auto& p = piece(chunk);
    auto it = p.held_.find(mb);
    if (it == p.held_.end() || !it->second.b_done)
      throw std::invalid_argument("device stage: W of micro-batch " + std::to_string(mb) + " before its B");
    it->second.w_due = true;
    // Weight gradients accumulate in micro-batch order, as in sequential training.
    while (true) {
      auto next = p.held_.find(p.next_w);
      if (next == p.held_.end() || !next->second.w_due) break;
      auto& h = next->second;
      for (std::size_t k = p.nodes.size(); k-- > 0;)
        if (!h.dy[k].empty()) layers_[p.nodes[k]]->backward_weight(s_, h.stashes[k], h.dy[k]);
      p.held_.erase(next);  // freed in stream order, after the work that reads them
      ++p.next_w;
    }
  }

  void optimizer_step() override { params_.step(s_, lr_); }

  layers::optimizer_state optimizer_state() override { return params_.state(s_); }
  void load_optimizer_state(const layers::optimizer_state& st) override { params_.load(s_, st); }

  void to_host(pipeline::stage_payload p, const boost::asio::any_io_executor& ex, host_handler done) override {
    auto m = std::static_pointer_cast<device_payload>(p.device);
    if (!m) throw std::logic_error("device stage: to_host of a host payload");
    ++host_transfers_;
    keep_waiting_on(m->ready);
    struct copy {
      pinned_buffer staging;
      shape_t shape;
    };
    std::vector<copy> copies;
    for (auto& t : m->tensors) {
      copy c;
      c.shape = t.shape();
      if (!t.empty()) {
        c.staging = pool_->take(t.bytes());
        copy_async(s_, c.staging.data(), t.data(), t.bytes());
      }
      t.buffer().set_stream(s_);  // freed after the copy
      copies.push_back(std::move(c));
    }
    m.reset();
    s_.async_wait(ex, [pool = pool_, stage = stage_, copies = std::move(copies),
                       done = std::move(done)](std::error_code ec) mutable {
      std::vector<tensor> host;
      if (!ec)
        for (auto& c : copies) {
          if (c.staging.data() == nullptr) {
            host.emplace_back();
            continue;
          }
          tensor t(std::int64_t(c.shape.empty() ? 1 : c.shape[0]), sample_shape(c.shape));
          std::memcpy(t.data(), c.staging.data(), std::size_t(t.size()) * sizeof(float));
          host.push_back(std::move(t));
        }
      for (auto& c : copies) pool->give_back(std::move(c.staging));
      done(ec ? as_exception(ec, stage) : nullptr, std::move(host));
    });
  }

  void when_done(const boost::asio::any_io_executor& ex, done_handler done) override {
    // The last stage's figures (loss sum, correct count per micro-batch) come back with it.
    std::vector<std::pair<std::uint64_t, std::size_t>> rows;  // micro-batch, rows
    pinned_buffer out;
    if (!figures_.empty()) {
      const std::size_t each = sizeof(float) + sizeof(std::int32_t);
      out = pool_->take(figures_.size() * each);
      std::size_t k = 0;
      for (auto& [mb, f] : figures_) {
        copy_async(s_, static_cast<char*>(out.data()) + k++ * each, f.sums.data(), each);
        rows.emplace_back(mb, f.rows);
      }
      figures_.clear();  // freed in stream order, after the copies
    }
    s_.async_wait(ex, [losses = losses_, pool = pool_, stage = stage_, rows = std::move(rows), out = std::move(out),
                       done = std::move(done)](std::error_code ec) mutable {
      if (!ec) {
        // On the stage's loop, before the stage reads loss_of.
        const std::size_t each = sizeof(float) + sizeof(std::int32_t);
        for (std::size_t k = 0; k < rows.size(); ++k) {
          float sum = 0;
          std::int32_t right = 0;
          std::memcpy(&sum, static_cast<const char*>(out.data()) + k * each, sizeof(float));
          std::memcpy(&right, static_cast<const char*>(out.data()) + k * each + sizeof(float), sizeof(right));
          (*losses)[rows[k].first] = {rows[k].second ? double(sum) / double(rows[k].second) : 0.0, right};
        }
      }
      pool->give_back(std::move(out));
      done(ec ? as_exception(ec, stage) : nullptr);
    });
  }

  std::size_t stashed() const noexcept override {
    std::size_t n = 0;
    for (auto& p : pieces_) n += p.held_.size();
    return n;
  }
  std::size_t stash_bytes() const noexcept override {
    std::size_t b = 0;
    for (auto& p : pieces_)
      for (auto& [mb, h] : p.held_) b += h.bytes;
    return b;
  }

  void download() override {
    s_.synchronize();
    for (std::size_t i = 0; i < layers_.size(); ++i)
      if (layers_[i]) download_parameters(s_, *layers_[i], *graph_.nodes()[i].layer);
  }

 private:
  struct figures {
    std::size_t rows = 0;
    device_buffer sums;  // loss sum (float), correct (int32)
  };

  device_piece& piece(std::uint32_t chunk) {
    if (chunk >= pieces_.size())
      throw std::invalid_argument("device stage: chunk " + std::to_string(chunk) + " of " +
                                  std::to_string(pieces_.size()));
    return pieces_[chunk];
  }

  /// A payload's tensors on this stream: a device payload's stream waits on its event
  /// (no host sync); host tensors are copied in through pinned memory.
  std::vector<device_tensor> take(pipeline::stage_payload in, bool between_pieces) {
    std::vector<device_tensor> v;
    if (in.on_device()) {
      auto m = std::static_pointer_cast<device_payload>(in.device);
      keep_waiting_on(m->ready);
      for (auto& t : m->tensors) {
        if (!t.empty()) t.buffer().set_stream(s_);  // freed after this stream's work
        v.push_back(std::move(t));
      }
      return v;
    }
    if (between_pieces) ++host_transfers_;
    for (auto& t : in.host) {
      if (t.empty()) {
        v.emplace_back();
        continue;
      }
      device_tensor d(s_, full_shape(t));
      upload_bytes(d.data(), t.data(), d.bytes());
      v.push_back(std::move(d));
    }
    return v;
  }

  /// This stream waits on `e` on the device. The handle is kept until the step's end: a
  /// pooled event handed back at once could be recorded again before this stream's wait
  /// has passed it (the stand-in's wait follows the event's latest record).
  void keep_waiting_on(const event& e) {
    if (!e.valid()) return;
    s_.wait(e);
    waited_.push_back(e);
  }

  /// Host bytes to the device through a pinned buffer, given back when the copy's
  /// completion comes back on the stage's loop.
  void upload_bytes(void* dst, const void* src, std::size_t bytes) {
    if (bytes == 0) return;
    auto staging = pool_->take(bytes);
    std::memcpy(staging.data(), src, bytes);
    copy_async(s_, dst, staging.data(), bytes);
    s_.async_wait(executor_, [pool = pool_, b = std::move(staging)](std::error_code) mutable {
      pool->give_back(std::move(b));
    });
  }

  device_tensor copy_of(const device_tensor& t) {
    device_tensor c(s_, t.shape());
    if (t.bytes()) copy_async(s_, c.data(), t.data(), t.bytes());
    return c;
  }

  pipeline::stage_payload send(std::vector<device_tensor> tensors) {
    auto m = std::make_shared<device_payload>();
    m->tensors = std::move(tensors);
    m->ready = s_.record();
    pipeline::stage_payload p;
    p.device = std::move(m);
    return p;
  }

  device& dev_;
  layers::graph& graph_;
  std::uint32_t stage_;
  bool holds_last_;
  stream s_;
  std::shared_ptr<pinned_pool> pool_;
  boost::asio::any_io_executor executor_;
  std::vector<std::unique_ptr<device_layer>> layers_;  // by graph node; null outside the stage
  std::vector<device_piece> pieces_;
  device_parameters params_;
  std::size_t classes_ = 0;
  double lr_ = -1;
  std::map<std::uint64_t, figures> figures_;
  // Shared with the completion handler that fills it (it may run after the engine is gone).
  std::shared_ptr<std::map<std::uint64_t, pipeline::engine_loss>> losses_ =
      std::make_shared<std::map<std::uint64_t, pipeline::engine_loss>>();
  std::int64_t host_transfers_ = 0;
  std::vector<event> waited_;  // events this stream waited on in this step

 public:
  stream& stage_stream() noexcept { return s_; }
  std::int64_t host_transfers() const noexcept override { return host_transfers_; }
};

}  // namespace

std::shared_ptr<pipeline::stage_engine> make_device_stage(device& dev, const pipeline::stage_engine_context& ctx,
                                                          const device_stage_options& options) {
  return std::make_shared<device_stage>(dev, ctx, options);
}

stream stage_stream(pipeline::stage_engine& e) {
  auto* d = dynamic_cast<device_stage*>(&e);
  if (!d) throw std::invalid_argument("stage_stream: not a device stage");
  return d->stage_stream();
}

device_optimizer optimizer_of(const std::string& kind, double lr, double momentum, double weight_decay) {
  device_optimizer o;
  o.kind = kind;
  o.lr = lr;
  o.momentum = momentum;
  o.weight_decay = weight_decay;
  return o;
}

}  // namespace nerve::gpu

#include "layers/backend.hpp"

#include "layers/detail/vector_state.hpp"
#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace nerve::layers {

namespace {

/// Today's Eigen calls, on the layer actor's loop.
class cpu_kernels final : public layer_kernels {
 public:
  cpu_kernels(graph::node_type& node, std::unique_ptr<optimizer> opt) : node_(node), opt_(std::move(opt)) {}

  value forward(std::vector<value>& inputs, const forward_context& context, bool train, kept& keep) override {
    std::vector<tensor> in;
    in.reserve(inputs.size());
    for (auto& v : inputs) in.push_back(std::move(v.host));
    auto& lay = *node_.layer;
    lay.set_training(train);
    detail::enter_user_code();  // the layer may be a user's, built without AVX
    auto r = lay.forward(std::move(in), context);
    if (train) keep.host = std::move(r.stash);
    return value(std::move(r.output));
  }
  void add(value& into, const value& g) override { into.host += g.host; }
  std::vector<value> backward_input(const kept& k, const value& dy, input_mask wanted) override {
    detail::enter_user_code();
    auto g = node_.layer->backward_input(k.host, dy.host, wanted);
    std::vector<value> out;
    out.reserve(g.size());
    for (auto& t : g) out.emplace_back(std::move(t));
    return out;
  }
  void backward_weight(const kept& k, const value& dy) override {
    if (!node_.layer->has_parameters()) return;
    detail::enter_user_code();
    node_.layer->backward_weight(k.host, dy.host);
  }
  void set_lr(double lr) override {
    if (lr >= 0 && opt_) opt_->set_lr(lr);
  }
  void update(std::uint64_t step, bool allow_nonfinite) override {
    auto& lay = *node_.layer;
    if (!lay.has_parameters()) return;
    auto ps = lay.parameters();
    for (auto& p : ps)  // a NaN would reach the weights and every later step
      if (!allow_nonfinite && !std::all_of(p.grad->data(), p.grad->data() + p.grad->size(),
                                           [](float v) { return std::isfinite(v); }))
        throw std::runtime_error("layer '" + node_.name + "': step " + std::to_string(step) + ": the gradient of " +
                                 node_.name + "." + p.name + " is not finite (nan or inf): training diverged");
    opt_->step(ps);
    lay.zero_grad();
  }
  void when_done(actors::actor&, std::function<void()> then) override { then(); }
  void with_host(actors::actor&, std::vector<value*> vs, std::function<void(std::vector<tensor>&)> fn) override {
    std::vector<tensor> h;  // lent: what `fn` changes goes back
    for (auto* v : vs) h.push_back(std::move(v->host));
    fn(h);
    for (std::size_t i = 0; i < vs.size(); ++i) vs[i]->host = std::move(h[i]);
  }
  std::vector<float> gradients() override {
    std::vector<float> flat;
    for (auto& p : node_.layer->parameters()) flat.insert(flat.end(), p.grad->data(), p.grad->data() + p.grad->size());
    return flat;
  }
  void set_gradients(const std::vector<float>& flat) override {
    const float* src = flat.data();
    for (auto& p : node_.layer->parameters()) {
      if (src + p.grad->size() > flat.data() + flat.size())
        throw std::logic_error("layer '" + node_.name + "': the reduced gradients are shorter than its parameters");
      std::copy(src, src + p.grad->size(), p.grad->data());
      src += p.grad->size();
    }
  }
  void adopt(actors::actor&, value& v) override {
    if (v.device) throw std::logic_error("layer '" + node_.name + "': a device value reached a CPU layer");
  }
  void hand_over(actors::actor&, value v, bool, std::function<void(value)> then) override { then(std::move(v)); }
  optimizer_state save_state() override {
    optimizer_state st;
    if (opt_) opt_->save_state(st);
    return st;
  }
  void load_state(const optimizer_state& st) override {
    if (opt_) opt_->load_state(st, node_.layer->parameters());
  }

 private:
  graph::node_type& node_;
  std::unique_ptr<optimizer> opt_;
};

class cpu_backend final : public backend {
 public:
  explicit cpu_backend(std::function<std::unique_ptr<optimizer>()> make) : make_(std::move(make)) {}
  std::string_view name() const noexcept override { return "cpu"; }
  std::unique_ptr<layer_kernels> kernels_for(graph::node_type& node) override {
    if (!make_)
      throw std::invalid_argument("layer '" + node.name + "': no optimizer factory given for a layer on the CPU");
    return std::make_unique<cpu_kernels>(node, make_());
  }
  value feed(tensor& batch, std::int64_t first, std::int64_t count, std::uint64_t) override {
    if (first == 0 && count == batch.batch()) return value(std::move(batch));
    return value(batch.slice(first, count));
  }
  void loss(actors::actor&, const layers::loss& criterion, value output, const targets& t, std::int64_t, std::uint64_t,
            double share, bool train, bool want_output, const std::function<void(value)>& gradient,
            std::function<void(loss_figures&)> report) override {
    loss_figures f;
    if (!t.labels.empty() || !t.values.empty()) {
      detail::enter_user_code();  // the loss may be a user's
      auto r = criterion.forward(output.host, t);
      f.loss = r.loss;
      f.correct = r.correct;
      if (train) {
        detail::enter_user_code();
        gradient(value(criterion.backward(r.stash, float(share))));
      }
    }
    if (want_output) f.output = std::move(output.host);
    report(f);
  }

 private:
  std::function<std::unique_ptr<optimizer>()> make_;
};

}  // namespace

std::shared_ptr<backend> make_cpu_backend(std::function<std::unique_ptr<optimizer>()> make) {
  return std::make_shared<cpu_backend>(std::move(make));
}

}  // namespace nerve::layers

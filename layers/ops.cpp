// The tape and the ops' derivatives, and op layers on the CPU (their op set: cpu_ops.cpp).
#include "layers/ops.hpp"

#include <cmath>
#include <stdexcept>

#include "layers/detail/vector_state.hpp"

namespace nerve::layers {

std::string_view to_string(unary_fn f) noexcept {
  switch (f) {
    case unary_fn::relu: return "relu";
    case unary_fn::leaky_relu: return "leaky_relu";
    case unary_fn::sigmoid: return "sigmoid";
    case unary_fn::tanh: return "tanh";
    case unary_fn::gelu: return "gelu";
  }
  return "?";
}

std::string_view to_string(op_kind k) noexcept {
  static constexpr std::string_view names[op_kinds] = {"gemm",        "unary", "unary_grad", "binary", "broadcast",
                                                       "column_sums", "axpy",  "scale",      "fill",   "copy"};
  return std::size_t(k) < op_kinds ? names[std::size_t(k)] : "?";
}

template <class S>
std::string basic_array<S>::shape_string() const {
  std::string s = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

namespace {

template <class S>
void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("ops: " + what);
}

}  // namespace

// ---- the tape ---------------------------------------------------------------------

template <class S>
int basic_tape<S>::leaf() {
  slots_.emplace_back();
  return int(slots_.size() - 1);
}

template <class S>
int basic_tape<S>::record(backward_fn back) {
  slots_.push_back(slot{{}, false, std::move(back)});
  return int(slots_.size() - 1);
}

template <class S>
void basic_tape<S>::accumulate(int id, array g, bool owned) {
  if (id < 0) return;
  auto& s = slots_.at(std::size_t(id));
  if (s.grad.empty()) {
    s.grad = std::move(g);
    s.owned = owned;
    return;
  }
  if (!s.owned) {  // a borrowed gradient is never written: add into a copy of it
    auto c = set_->alloc(s.grad.dims);
    set_->copy(c.size(), s.grad.data, c.data);
    s.grad = std::move(c);
    s.owned = true;
  }
  require<S>(g.size() == s.grad.size(), "a gradient of " + g.shape_string() + " for " + s.grad.shape_string());
  set_->axpy(s.grad.size(), S(1), g.data, s.grad.data);
}

template <class S>
void basic_tape<S>::backward(int out, const array& dy) {
  if (done_) throw std::logic_error("tape: backward ran twice");
  done_ = true;
  if (out < 0) return;
  accumulate(out, dy, false);  // borrowed: the caller's
  for (int i = out; i >= 0; --i) {
    auto& s = slots_[std::size_t(i)];
    if (!s.back || s.grad.empty()) continue;
    const array g = s.grad;  // the op's output gradient, complete: every consumer came later
    detail::enter_user_code();  // a user's layer may record derivatives of its own
    s.back(*this, g);
    if (s.owned) s.grad = {};  // an intermediate's gradient is not needed again
  }
}

// ---- ops and their derivatives -------------------------------------------------------

template <class S>
bool basic_ops<S>::recording(std::initializer_list<const array*> in) const noexcept {
  if (!tape_) return false;
  for (auto* a : in)
    if (a->id >= 0) return true;
  return false;
}

template <class S>
auto basic_ops<S>::zeros(std::vector<std::int64_t> dims) -> array {
  auto a = set_.alloc(std::move(dims));
  set_.fill(a.size(), S(0), a.data);
  return a;
}

template <class S>
auto basic_ops<S>::clone(const array& x) -> array {
  auto a = set_.alloc(x.dims);
  set_.copy(x.size(), x.data, a.data);
  return a;
}

template <class S>
auto basic_ops<S>::binary(binary_fn f, const array& a, const array& b) -> array {
  require<S>(a.size() == b.size(), std::string(f == binary_fn::mul ? "mul" : f == binary_fn::add ? "add" : "sub") +
                                       " of " + a.shape_string() + " and " + b.shape_string());
  auto y = set_.alloc(a.dims);
  set_.binary(f, a.data, b.data, y.data, y.size());
  if (recording({&a, &b})) {
    y.id = tape_->record([f, a, b](basic_tape<S>& t, const array& dy) {
      auto& set = t.set();
      if (f == binary_fn::mul) {
        if (a.id >= 0) {
          auto g = set.alloc(a.dims);
          set.binary(binary_fn::mul, dy.data, b.data, g.data, g.size());
          t.accumulate(a.id, std::move(g), true);
        }
        if (b.id >= 0) {
          auto g = set.alloc(b.dims);
          set.binary(binary_fn::mul, dy.data, a.data, g.data, g.size());
          t.accumulate(b.id, std::move(g), true);
        }
        return;
      }
      auto as = [](const array& g, const std::vector<std::int64_t>& dims) {
        array r = g;
        r.dims = dims;
        r.id = -1;
        return r;
      };
      t.accumulate(a.id, as(dy, a.dims), false);
      if (b.id < 0) return;
      if (f == binary_fn::add) return t.accumulate(b.id, as(dy, b.dims), false);
      auto g = set.alloc(b.dims);  // sub: −dy
      set.copy(g.size(), dy.data, g.data);
      set.scale(g.size(), S(-1), g.data);
      t.accumulate(b.id, std::move(g), true);
    });
  }
  return y;
}

template <class S>
auto basic_ops<S>::broadcast(binary_fn f, const array& x, const array& v) -> array {
  const std::int64_t period = v.size();
  require<S>(period > 0 && x.size() % period == 0 && (period == 1 || period == x.cols()),
             "a row vector of " + v.shape_string() + " over " + x.shape_string() + " (it needs " +
                 std::to_string(x.cols()) + " elements or 1)");
  auto y = set_.alloc(x.dims);
  set_.broadcast(f, x.data, v.data, y.data, y.size(), period);
  if (recording({&x, &v})) {
    y.id = tape_->record([f, x, v, period](basic_tape<S>& t, const array& dy) {
      auto& set = t.set();
      const std::int64_t rows = dy.size() / period;
      if (f == binary_fn::mul) {
        if (x.id >= 0) {
          auto g = set.alloc(x.dims);
          set.broadcast(binary_fn::mul, dy.data, v.data, g.data, g.size(), period);
          t.accumulate(x.id, std::move(g), true);
        }
        if (v.id >= 0) {
          auto p = set.alloc(x.dims);
          set.binary(binary_fn::mul, dy.data, x.data, p.data, p.size());
          auto g = set.alloc(v.dims);
          set.column_sums(p.data, rows, period, g.data, S(0));
          t.accumulate(v.id, std::move(g), true);
        }
        return;
      }
      if (x.id >= 0) {
        array g = dy;
        g.dims = x.dims;
        t.accumulate(x.id, std::move(g), false);
      }
      if (v.id >= 0) {
        auto g = set.alloc(v.dims);
        set.column_sums(dy.data, rows, period, g.data, S(0));
        if (f == binary_fn::sub) set.scale(g.size(), S(-1), g.data);
        t.accumulate(v.id, std::move(g), true);
      }
    });
  }
  return y;
}

template <class S>
auto basic_ops<S>::scale(const array& x, S alpha) -> array {
  auto y = clone(x);
  set_.scale(y.size(), alpha, y.data);
  if (recording({&x})) {
    y.id = tape_->record([x, alpha](basic_tape<S>& t, const array& dy) {
      auto g = t.set().alloc(x.dims);
      t.set().copy(g.size(), dy.data, g.data);
      t.set().scale(g.size(), alpha, g.data);
      t.accumulate(x.id, std::move(g), true);
    });
  }
  return y;
}

template <class S>
auto basic_ops<S>::unary(unary_fn f, const array& x, S alpha) -> array {
  auto y = set_.alloc(x.dims);
  set_.unary(f, x.data, y.data, y.size(), alpha);
  if (recording({&x})) {
    array out;  // sigmoid and tanh differentiate through their output; the others hold none
    if (f == unary_fn::sigmoid || f == unary_fn::tanh) out = y;
    out.id = -1;
    y.id = tape_->record([f, x, out, alpha](basic_tape<S>& t, const array& dy) {
      auto g = t.set().alloc(x.dims);
      t.set().unary_grad(f, x.data, out.data, dy.data, g.data, g.size(), alpha);
      t.accumulate(x.id, std::move(g), true);
    });
  }
  return y;
}

template <class S>
auto basic_ops<S>::matmul(const array& a, const array& b, trans ta, trans tb) -> array {
  const bool at = ta == trans::yes, bt = tb == trans::yes;
  const std::int64_t m = at ? a.cols() : a.rows(), k = at ? a.rows() : a.cols();
  const std::int64_t kb = bt ? b.cols() : b.rows(), n = bt ? b.rows() : b.cols();
  require<S>(k == kb, "matmul of " + a.shape_string() + (at ? "ᵀ" : "") + " and " + b.shape_string() +
                          (bt ? "ᵀ" : "") + ": inner dimensions " + std::to_string(k) + " and " + std::to_string(kb));
  auto c = set_.alloc({m, n});
  set_.gemm(ta, tb, m, n, k, S(1), a.data, a.cols(), b.data, b.cols(), S(0), c.data, n);
  if (recording({&a, &b})) {
    c.id = tape_->record([a, b, at, bt, m, n, k](basic_tape<S>& t, const array& dc) {
      auto& set = t.set();
      // C = op(A)·op(B): d op(A) = dC·op(B)ᵀ, d op(B) = op(A)ᵀ·dC, transposed back
      // where the operand was used transposed.
      if (a.id >= 0) {
        auto g = set.alloc(a.dims);
        if (!at)  // dA (m×k) = dC·op(B)ᵀ
          set.gemm(trans::no, bt ? trans::no : trans::yes, m, k, n, S(1), dc.data, n, b.data, b.cols(), S(0),
                   g.data, k);
        else  // dA (k×m) = op(B)·dCᵀ
          set.gemm(bt ? trans::yes : trans::no, trans::yes, k, m, n, S(1), b.data, b.cols(), dc.data, n, S(0),
                   g.data, m);
        t.accumulate(a.id, std::move(g), true);
      }
      if (b.id >= 0) {
        auto g = set.alloc(b.dims);
        if (!bt)  // dB (k×n) = op(A)ᵀ·dC
          set.gemm(at ? trans::no : trans::yes, trans::no, k, n, m, S(1), a.data, a.cols(), dc.data, n, S(0),
                   g.data, n);
        else  // dB (n×k) = dCᵀ·op(A)
          set.gemm(trans::yes, at ? trans::yes : trans::no, n, k, m, S(1), dc.data, n, a.data, a.cols(), S(0),
                   g.data, k);
        t.accumulate(b.id, std::move(g), true);
      }
    });
  }
  return c;
}

template <class S>
auto basic_ops<S>::linear(const array& x, const array& w, const array& b) -> array {
  auto y = matmul(x, w, trans::no, trans::yes);
  return b.empty() ? y : add_row(y, b);
}

template <class S>
auto basic_ops<S>::sum_rows(const array& x) -> array {
  auto y = set_.alloc({x.cols()});
  set_.column_sums(x.data, x.rows(), x.cols(), y.data, S(0));
  if (recording({&x})) {
    y.id = tape_->record([x](basic_tape<S>& t, const array& dy) {
      auto g = t.set().alloc(x.dims);
      t.set().fill(g.size(), S(0), g.data);
      t.set().broadcast(binary_fn::add, g.data, dy.data, g.data, g.size(), dy.size());
      t.accumulate(x.id, std::move(g), true);
    });
  }
  return y;
}

template <class S>
auto basic_ops<S>::reshape(const array& x, std::vector<std::int64_t> dims) -> array {
  array y = x;
  y.dims = std::move(dims);
  require<S>(y.size() == x.size(), "reshape of " + x.shape_string() + " to " + y.shape_string());
  if (recording({&x})) {
    y.id = tape_->record([x](basic_tape<S>& t, const array& dy) {
      array g = dy;
      g.dims = x.dims;
      t.accumulate(x.id, std::move(g), false);
    });
  } else {
    y.id = -1;
  }
  return y;
}

// ---- one micro-batch of an op layer ------------------------------------------------------

template <class S>
basic_op_run<S>::basic_op_run(basic_op_layer<S>& l, basic_op_set<S>& set, std::vector<array> inputs,
                              std::vector<array> params, bool train, const forward_context& context)
    : layer_(l), set_(set), inputs_(std::move(inputs)), params_(std::move(params)) {
  for (const auto& a : inputs_) in_dims_.push_back(a.dims);
  if (train && !l.custom_backward()) {
    tape_ = std::make_unique<basic_tape<S>>(set);
    for (auto& a : inputs_) a.id = tape_->leaf();
    for (auto& p : params_) p.id = tape_->leaf();
  } else {
    for (auto& a : inputs_) a.id = -1;
    for (auto& p : params_) p.id = -1;
  }
  basic_ops<S> o(set, tape_.get());
  detail::enter_user_code();  // `compute` is the layer's: a user's, built with any -march
  out_ = l.compute(o, inputs_, params_, keep_, context);
  out_id_ = out_.id;
  out_dims_ = out_.dims;
  // What backward reads stays: the tape's arrays, or what a hand-written backward kept.
  // The inputs go otherwise, so an output that is an input relabelled (Flatten) is
  // the only holder of its memory and moves on without a copy.
  if (!tape_) inputs_.clear();
  if (!train) {
    keep_.clear();
    return;
  }
  for (auto& k : keep_) kept_bytes_ += std::size_t(k.size()) * sizeof(S) * (k.data ? 1 : 0);
  for (auto& a : inputs_) kept_bytes_ += std::size_t(a.size()) * sizeof(S);
}

template <class S>
void basic_op_run<S>::run_tape(const array& dy) {
  if (ran_) return;
  ran_ = true;
  if (!tape_) throw std::logic_error(layer_.label() + ": backward of a forward run in evaluation");
  tape_->backward(out_id_, dy);
  in_grads_.assign(inputs_.size(), array{});
  param_grads_.assign(params_.size(), array{});
  for (std::size_t i = 0; i < inputs_.size(); ++i) {
    auto& g = tape_->grad(inputs_[i].id);
    if (g.empty()) continue;
    if (!tape_->owned(inputs_[i].id)) {  // the output gradient passed through: the caller's
      auto c = set_.alloc(g.dims);
      set_.copy(c.size(), g.data, c.data);
      g = std::move(c);
    }
    g.dims = inputs_[i].dims;
    in_grads_[i] = std::move(g);
  }
  for (std::size_t j = 0; j < params_.size(); ++j) param_grads_[j] = tape_->grad(params_[j].id);
}

template <class S>
auto basic_op_run<S>::backward_input(const array& dy, input_mask wanted) -> std::vector<array> {
  basic_array<S> shape_of_out{out_dims_, nullptr, nullptr, -1};
  require<S>(dy.size() == shape_of_out.size(), layer_.label() + ": an output gradient of " + dy.shape_string() +
                                                   " for an output of " + shape_of_out.shape_string());
  std::vector<array> out(in_dims_.size());
  if (layer_.custom_backward()) {
    basic_ops<S> o(set_);
    detail::enter_user_code();
    auto g = layer_.grad_input(o, keep_, params_, dy, wanted);
    for (std::size_t i = 0; i < g.size() && i < out.size(); ++i)
      if (wanted & (input_mask{1} << i)) out[i] = std::move(g[i]);
  } else {
    run_tape(dy);  // B may be asked again (the gradient checker does): hand out shares
    for (std::size_t i = 0; i < inputs_.size(); ++i)
      if (wanted & (input_mask{1} << i)) out[i] = in_grads_[i];
  }
  for (std::size_t i = 0; i < in_dims_.size(); ++i) {
    if (!(wanted & (input_mask{1} << i)) || !out[i].empty()) continue;
    out[i] = set_.alloc(in_dims_[i]);  // nothing reached the input: its gradient is zero
    set_.fill(out[i].size(), S(0), out[i].data);
  }
  return out;
}

template <class S>
void basic_op_run<S>::backward_weight(const array& dy, std::span<const array> grads) {
  require<S>(grads.size() == params_.size(), layer_.label() + ": " + std::to_string(grads.size()) +
                                                   " gradients for " + std::to_string(params_.size()) + " parameters");
  if (layer_.custom_backward()) {
    basic_ops<S> o(set_);
    detail::enter_user_code();
    return layer_.grad_weight(o, keep_, params_, dy, grads);
  }
  run_tape(dy);
  for (std::size_t j = 0; j < grads.size(); ++j) {
    const auto& g = param_grads_[j];
    if (g.empty()) continue;
    require<S>(g.size() == grads[j].size(), layer_.label() + ": a gradient of " + g.shape_string() +
                                                " for a parameter of " + grads[j].shape_string());
    set_.axpy(g.size(), S(1), g.data, grads[j].data);
  }
}

// ---- op layers on the CPU (basic_layer's calls) ------------------------------------------

namespace {

/// `t` as an array owning it (moved in) or borrowing it.
template <class S>
basic_array<S> host_array(basic_tensor<S>& t) {
  return {t.full_shape(), t.data(), nullptr, -1};
}
template <class S>
basic_array<S> owning_array(basic_tensor<S> t) {
  auto mem = std::make_shared<basic_tensor<S>>(std::move(t));
  basic_array<S> a{mem->full_shape(), mem->data(), nullptr, -1};
  a.owner = std::move(mem);
  return a;
}

/// The array as a tensor of its dims: its own tensor, moved, when nothing else holds it
/// (every owner of a CPU array is a tensor: `alloc`, `owning_array`); else a copy (the
/// tape or a kept array still reads it).
template <class S>
basic_tensor<S> to_tensor(basic_array<S>&& a) {
  std::vector<std::int64_t> sample(a.dims.begin() + (a.dims.empty() ? 0 : 1), a.dims.end());
  shape sample_shape(std::move(sample));
  if (a.owner && a.owner.use_count() == 1) {
    auto* own = static_cast<basic_tensor<S>*>(a.owner.get());
    if (own->data() == a.data && own->size() == a.size() && own->batch() == a.rows()) {
      basic_tensor<S> t = std::move(*own);
      t.reshape(std::move(sample_shape));
      a = {};
      return t;
    }
  }
  basic_tensor<S> t(a.rows(), std::move(sample_shape));
  std::copy(a.data, a.data + a.size(), t.data());
  return t;
}

template <class S>
std::vector<basic_array<S>> host_parameters(basic_layer<S>& l, bool grads) {
  std::vector<basic_array<S>> out;
  for (auto& p : l.parameters()) {
    auto a = host_array(grads ? *p.grad : *p.value);
    a.dims = p.torch_shape;
    out.push_back(std::move(a));
  }
  return out;
}

/// What an op layer's stash keeps on the CPU: the run (its tape or kept arrays).
template <class S>
struct cpu_run {
  std::unique_ptr<basic_op_run<S>> run;
};

template <class S>
basic_op_run<S>& run_of(const basic_stash<S>& saved, const std::string& label) {
  auto* r = static_cast<cpu_run<S>*>(saved.extra.get());
  if (!r || !r->run) throw std::logic_error(label + ": backward without its forward's stash");
  return *r->run;
}

}  // namespace

template <class S>
auto basic_op_layer<S>::do_forward(std::vector<tensor_type>& inputs, const forward_context& context)
    -> forward_result {
  std::vector<array> in;
  in.reserve(inputs.size());
  for (auto& t : inputs) in.push_back(owning_array(std::move(t)));
  auto run = std::make_unique<basic_op_run<S>>(*this, cpu_op_set<S>(), std::move(in), host_parameters(*this, false),
                                               this->training(), context);
  forward_result r{to_tensor(std::move(run->output())), {}};
  if (this->training()) {
    auto keep = std::make_shared<cpu_run<S>>();
    keep->run = std::move(run);
    r.stash.extra_bytes = keep->run->kept_bytes();
    r.stash.extra = std::move(keep);
  }
  return r;
}

template <class S>
auto basic_op_layer<S>::do_backward_input(const stash_type& saved, const tensor_type& dy, input_mask wanted)
    -> std::vector<tensor_type> {
  auto& run = run_of(saved, this->label());
  auto g = run.backward_input(host_array(const_cast<tensor_type&>(dy)), wanted);
  std::vector<tensor_type> out(g.size());
  for (std::size_t i = 0; i < g.size(); ++i)
    if (!g[i].empty()) {
      out[i] = to_tensor(std::move(g[i]));
      out[i].reshape(saved.input_shapes[i]);
    }
  return out;
}

template <class S>
void basic_op_layer<S>::do_backward_weight(const stash_type& saved, const tensor_type& dy) {
  auto grads = host_parameters(*this, true);
  run_of(saved, this->label()).backward_weight(host_array(const_cast<tensor_type&>(dy)), grads);
}

template struct basic_array<float>;
template struct basic_array<double>;
template class basic_tape<float>;
template class basic_tape<double>;
template class basic_ops<float>;
template class basic_ops<double>;
template class basic_op_run<float>;
template class basic_op_run<double>;
template class basic_op_layer<float>;
template class basic_op_layer<double>;

}  // namespace nerve::layers

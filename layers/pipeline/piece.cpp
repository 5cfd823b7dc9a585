#include "layers/pipeline/piece.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>

namespace nerve::pipeline {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

piece_executor::piece_executor(layers::graph& g, const partition& p, std::size_t index) : g_(g) {
  if (index >= p.size())
    throw std::invalid_argument("piece: index " + std::to_string(index) + " of " + std::to_string(p.size()) + " pieces");
  if (p[index].empty()) throw std::invalid_argument("piece " + std::to_string(index) + " is empty");
  const auto& nodes = g.nodes();
  const std::size_t n = nodes.size();
  // Which piece each layer node is in; graph inputs are "before piece 0" (-1).
  std::vector<long> piece_of(n, -1);
  std::vector<std::size_t> pos(n, 0);
  for (std::size_t k = 0; k < g.order().size(); ++k) pos[g.order()[k]] = k;
  for (std::size_t k = 0; k < p.size(); ++k)
    for (std::size_t i : p[k]) {
      if (i >= n || nodes[i].is_input()) throw std::invalid_argument("piece: node " + std::to_string(i) + " is not a layer");
      piece_of[i] = long(k);
    }
  for (std::size_t i = 0; i < n; ++i)
    if (!nodes[i].is_input() && piece_of[i] < 0)
      throw std::invalid_argument("piece: layer '" + nodes[i].name + "' is in no piece");
  nodes_ = p[index];
  std::sort(nodes_.begin(), nodes_.end(), [&](std::size_t a, std::size_t b) { return pos[a] < pos[b]; });
  local_.assign(n, -1);
  for (std::size_t k = 0; k < nodes_.size(); ++k) local_[nodes_[k]] = int(k);
  uses_in_piece_.assign(n, 0);
  // The frontier into piece j: tensors made before j (graph inputs, earlier pieces) used at j or later.
  auto frontier = [&](long j) {
    std::vector<std::size_t> f;
    for (std::size_t x : g.order()) {
      if (piece_of[x] >= j) continue;
      bool used = false;
      for (std::size_t c : nodes[x].consumers) used |= piece_of[c] >= j;
      if (used) f.push_back(x);
    }
    return f;
  };
  in_ = frontier(long(index));
  if (index + 1 < p.size()) out_ = frontier(long(index) + 1);
  else out_ = {g.output()};
  for (std::size_t i : nodes_) {
    // A piece must not need a tensor that comes from a later piece (the cut is in topological order).
    for (std::size_t x : nodes[i].inputs) {
      if (piece_of[x] > long(index))
        throw std::invalid_argument("piece: layer '" + nodes[i].name + "' in piece " + std::to_string(index) +
                                    " needs '" + nodes[x].name + "' from a later piece");
      ++uses_in_piece_[x];
    }
  }
  if (index + 1 == p.size() && piece_of[g.output()] != long(index))
    throw std::invalid_argument("piece: the graph output '" + nodes[g.output()].name + "' is not in the last piece");
}

auto piece_executor::forward(std::uint64_t mb, std::vector<tensor> inputs, const layers::forward_context& ctx)
    -> std::vector<tensor> {
  if (inputs.size() != in_.size())
    throw std::invalid_argument("piece: " + std::to_string(in_.size()) + " input tensors expected, got " +
                                std::to_string(inputs.size()));
  if (held_.count(mb)) throw std::invalid_argument("piece: micro-batch " + std::to_string(mb) + " is already in flight");
  auto& nodes = g_.nodes();
  std::map<std::size_t, tensor> values;
  std::map<std::size_t, std::size_t> uses;  // uses left inside the piece
  for (std::size_t k = 0; k < in_.size(); ++k) values.emplace(in_[k], std::move(inputs[k]));
  for (std::size_t x : in_) uses[x] = uses_in_piece_[x];
  // A tensor that also leaves the piece keeps one use for the way out.
  std::vector<bool> leaves(nodes.size(), false);
  for (std::size_t x : out_) leaves[x] = true;
  held h;
  h.stashes.resize(nodes_.size());
  for (std::size_t k = 0; k < nodes_.size(); ++k) {
    const std::size_t i = nodes_[k];
    auto& n = nodes[i];
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<tensor> in;
    in.reserve(n.inputs.size());
    for (std::size_t p : n.inputs) {
      auto it = values.find(p);
      if (it == values.end()) throw std::logic_error("piece: missing the output of '" + nodes[p].name + "'");
      const bool last = --uses[p] == 0 && !leaves[p];
      in.push_back(last ? std::move(it->second) : it->second.clone());
    }
    auto r = n.layer->forward(std::move(in), ctx);
    for (auto& hook : n.forward_hooks) hook(layers::hook_context{n.name, mb}, r.output);
    h.bytes += r.stash.payload_bytes();
    h.stashes[k] = std::move(r.stash);
    values[i] = std::move(r.output);
    uses[i] = uses_in_piece_[i];
    if (timer_) (*timer_)[k] += seconds_since(t0);
  }
  std::vector<tensor> out;
  out.reserve(out_.size());
  for (std::size_t x : out_) out.push_back(std::move(values.at(x)));
  bytes_ += h.bytes;
  held_.emplace(mb, std::move(h));
  return out;
}

auto piece_executor::backward_input(std::uint64_t mb, std::vector<tensor> grads) -> std::vector<tensor> {
  auto it = held_.find(mb);
  if (it == held_.end() || it->second.b_done)
    throw std::invalid_argument("piece: backward of micro-batch " + std::to_string(mb) + ", which has no forward in flight");
  if (grads.size() != out_.size())
    throw std::invalid_argument("piece: " + std::to_string(out_.size()) + " gradients expected, got " +
                                std::to_string(grads.size()));
  held& h = it->second;
  auto& nodes = g_.nodes();
  std::map<std::size_t, tensor> acc;
  for (std::size_t k = 0; k < out_.size(); ++k) acc[out_[k]] = std::move(grads[k]);
  h.dy.resize(nodes_.size());
  for (std::size_t k = nodes_.size(); k-- > 0;) {
    const std::size_t i = nodes_[k];
    auto& n = nodes[i];
    const auto t0 = std::chrono::steady_clock::now();
    auto dit = acc.find(i);
    if (dit == acc.end() || dit->second.empty())
      throw std::logic_error("piece: no gradient reached '" + n.name + "'");
    tensor dy = std::move(dit->second);
    acc.erase(dit);
    layers::input_mask wanted = 0;
    for (std::size_t q = 0; q < n.inputs.size(); ++q)
      if (!nodes[n.inputs[q]].is_input()) wanted |= layers::input_mask{1} << q;
    auto g = n.layer->backward_input(h.stashes[k], dy, wanted);
    for (auto& hook : n.backward_hooks) hook(layers::hook_context{n.name, mb}, g, dy);
    for (std::size_t q = 0; q < n.inputs.size(); ++q) {
      if (!(wanted & (layers::input_mask{1} << q)) || g[q].empty()) continue;
      auto& a = acc[n.inputs[q]];
      if (a.empty()) a = std::move(g[q]);
      else a += g[q];  // fan-out: sum over consumers, latest consumer first
    }
    if (n.layer->has_parameters()) {
      h.bytes += dy.payload_bytes();
      bytes_ += dy.payload_bytes();
      h.dy[k] = std::move(dy);
    } else {
      bytes_ -= h.stashes[k].payload_bytes();
      h.bytes -= h.stashes[k].payload_bytes();
      h.stashes[k] = {};  // nothing left for W
    }
    if (timer_) (*timer_)[k] += seconds_since(t0);
  }
  h.b_done = true;
  std::vector<tensor> out;
  out.reserve(in_.size());
  for (std::size_t x : in_) {
    auto a = acc.find(x);
    out.push_back(a == acc.end() ? tensor() : std::move(a->second));
  }
  return out;
}

void piece_executor::run_weight(held& h) {
  auto& nodes = g_.nodes();
  for (std::size_t k = nodes_.size(); k-- > 0;) {
    auto& n = nodes[nodes_[k]];
    if (h.dy[k].empty()) continue;
    const auto t0 = std::chrono::steady_clock::now();
    n.layer->backward_weight(h.stashes[k], h.dy[k]);
    if (timer_) (*timer_)[k] += seconds_since(t0);
  }
}

void piece_executor::backward_weight(std::uint64_t mb) {
  auto it = held_.find(mb);
  if (it == held_.end() || !it->second.b_done)
    throw std::invalid_argument("piece: W of micro-batch " + std::to_string(mb) + " before its B");
  it->second.w_due = true;
  // Weight gradients accumulate in micro-batch order, as in sequential training.
  while (true) {
    auto next = held_.find(next_w_);
    if (next == held_.end() || !next->second.w_due) break;
    run_weight(next->second);
    bytes_ -= next->second.bytes;
    held_.erase(next);
    ++next_w_;
  }
}

void piece_executor::zero_grad() {
  for (std::size_t i : nodes_) g_.nodes()[i].layer->zero_grad();
  next_w_ = 0;
}

std::vector<layers::parameter_ref> piece_executor::parameters() {
  std::vector<layers::parameter_ref> v;
  for (std::size_t i : nodes_) {
    auto& n = g_.nodes()[i];
    for (auto& p : n.layer->parameters()) {
      p.name = n.name + "." + p.name;
      v.push_back(std::move(p));
    }
  }
  return v;
}

}  // namespace nerve::pipeline

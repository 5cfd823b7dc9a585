#include "layers/pipeline/partition.hpp"
#include "layers/module_path.hpp"

#include <algorithm>
#include <chrono>
#include <limits>
#include <random>
#include <stdexcept>

namespace nerve::pipeline {

namespace {

/// The graph's layer nodes (no graph inputs) in topological order.
std::vector<std::size_t> layer_order(const layers::graph& g) {
  std::vector<std::size_t> v;
  for (std::size_t i : g.order())
    if (!g.nodes()[i].is_input()) v.push_back(i);
  return v;
}

double elapsed_seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// The runs of `order` between consecutive `cuts` (which start at 0 and end at its size).
partition runs_between(const std::vector<std::size_t>& order, const std::vector<std::size_t>& cuts) {
  partition p;
  for (std::size_t k = 0; k + 1 < cuts.size(); ++k)
    p.emplace_back(order.begin() + long(cuts[k]), order.begin() + long(cuts[k + 1]));
  return p;
}

}  // namespace

partition partition_at(const layers::graph& g, const std::vector<std::string>& first_layers) {
  const auto order = layer_order(g);
  std::vector<std::size_t> cuts{0};
  for (const auto& name : first_layers) {
    const std::size_t node = g.index_of(name);  // throws for an unknown name
    auto it = std::find(order.begin(), order.end(), node);
    if (it == order.end()) throw std::invalid_argument("partition: '" + name + "' is a graph input, not a layer");
    const auto pos = static_cast<std::size_t>(it - order.begin());
    if (pos <= cuts.back())
      throw std::invalid_argument("partition: cutting before '" + name + "' leaves stage " +
                                  std::to_string(cuts.size() - 1) + " empty (split points must follow the layer order)");
    cuts.push_back(pos);
  }
  cuts.push_back(order.size());
  return runs_between(order, cuts);
}

partition partition_by_cost(const layers::graph& g, const std::vector<double>& layer_costs, std::size_t pieces) {
  const auto order = layer_order(g);
  const std::size_t n = order.size();
  if (layer_costs.size() != n)
    throw std::invalid_argument("partition: " + std::to_string(layer_costs.size()) + " costs for " +
                                std::to_string(n) + " layers");
  if (pieces == 0) throw std::invalid_argument("partition: 0 stages");
  if (n < pieces)
    throw std::invalid_argument("partition: cannot cut " + std::to_string(n) + " layers into " +
                                std::to_string(pieces) + " pieces: at least one stage would be empty");
  std::vector<double> prefix(n + 1, 0);
  for (std::size_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + layer_costs[i];
  // A transformer's blocks stay whole (layers/module_path.hpp): no cut between two layers
  // of one block, unless the pieces outnumber the places left to cut.
  std::vector<bool> may_cut(n + 1, true);
  std::size_t places = n - 1;
  for (std::size_t j = 1; j < n; ++j) {
    const auto a = layers::block_of(g.nodes()[order[j - 1]].name), b = layers::block_of(g.nodes()[order[j]].name);
    if (!a.empty() && a == b) may_cut[j] = false, --places;
  }
  if (places + 1 < pieces) std::fill(may_cut.begin(), may_cut.end(), true);
  // best[k][i]: smallest maximum piece cost for the first i layers in k pieces; cut[k][i] the last cut.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(pieces + 1, std::vector<double>(n + 1, inf));
  std::vector<std::vector<std::size_t>> cut(pieces + 1, std::vector<std::size_t>(n + 1, 0));
  best[0][0] = 0;
  for (std::size_t k = 1; k <= pieces; ++k)
    for (std::size_t i = k; i <= n; ++i)
      for (std::size_t j = k - 1; j < i; ++j) {
        if (!may_cut[j]) continue;
        const double c = std::max(best[k - 1][j], prefix[i] - prefix[j]);
        if (c < best[k][i] - 1e-12 * std::abs(c)) best[k][i] = c, cut[k][i] = j;
      }
  std::vector<std::size_t> cuts{n};
  for (std::size_t k = pieces, i = n; k > 0; --k) cuts.push_back(i = cut[k][i]);
  std::reverse(cuts.begin(), cuts.end());
  return runs_between(order, cuts);
}

partition partition_by_parameters(layers::graph& g, std::size_t pieces) {
  const auto order = layer_order(g);
  std::vector<double> costs;
  for (std::size_t i : order) {
    double c = 0;
    for (auto& prm : g.nodes()[i].layer->parameters()) c += double(prm.value->size());
    costs.push_back(std::max(c, 1.0));
  }
  return partition_by_cost(g, costs, pieces);
}

std::vector<double> profile_layers(layers::graph& g, std::int64_t batch, int repeats, std::uint64_t seed) {
  const auto order = layer_order(g);
  auto& nodes = g.nodes();
  std::vector<std::vector<double>> samples(order.size());
  std::mt19937_64 rng(seed);
  // Inputs of 0 and 1: pixels and token ids alike (an embedding refuses a fractional id),
  // and a layer's time does not depend on its values.
  std::bernoulli_distribution dist;
  for (int r = 0; r <= repeats; ++r) {  // run 0 warms up
    // Forward, B and W of every layer in turn, a step of one micro-batch, timed per layer.
    std::vector<layers::tensor> out(nodes.size()), dy(nodes.size());
    std::vector<layers::basic_stash<float>> st(nodes.size());
    std::vector<double> t(order.size(), 0);
    for (std::size_t k : g.inputs()) {
      out[k] = layers::tensor(batch, nodes[k].output_shape);
      std::generate_n(out[k].data(), out[k].size(), [&] { return dist(rng) ? 1.0f : 0.0f; });
    }
    for (std::size_t k = 0; k < order.size(); ++k) {
      auto& n = nodes[order[k]];
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<layers::tensor> in;
      for (auto x : n.inputs) in.push_back(out[x].clone());
      auto f = n.layer->forward(std::move(in), {});
      out[order[k]] = std::move(f.output);
      st[order[k]] = std::move(f.stash);
      t[k] += elapsed_seconds(t0);
    }
    const auto& y = out[g.output()];
    dy[g.output()] = layers::tensor::constant(y.batch(), y.sample_shape(), 1.0f / float(y.size()));
    for (std::size_t k = order.size(); k-- > 0;) {
      const auto i = order[k];
      auto& n = nodes[i];
      if (dy[i].empty()) continue;
      const auto t0 = std::chrono::steady_clock::now();
      layers::input_mask wanted = 0;
      for (std::size_t q = 0; q < n.inputs.size(); ++q)
        if (!nodes[n.inputs[q]].is_input()) wanted |= layers::input_mask{1} << q;
      auto gi = n.layer->backward_input(st[i], dy[i], wanted);
      if (n.layer->has_parameters()) n.layer->backward_weight(st[i], dy[i]);
      for (std::size_t q = 0; q < n.inputs.size() && q < gi.size(); ++q) {
        if (!(wanted & (layers::input_mask{1} << q)) || gi[q].empty()) continue;
        auto& a = dy[n.inputs[q]];
        if (a.empty()) a = std::move(gi[q]);
        else a += gi[q];
      }
      t[k] += elapsed_seconds(t0);
    }
    if (r > 0)
      for (std::size_t i = 0; i < order.size(); ++i) samples[i].push_back(t[i]);
  }
  g.zero_grad();
  std::vector<double> med;
  for (auto& s : samples) {
    std::sort(s.begin(), s.end());
    med.push_back(s.empty() ? 0 : s[s.size() / 2]);
  }
  return med;
}

std::string to_string(const layers::graph& g, const partition& p) {
  std::string s;
  for (std::size_t k = 0; k < p.size(); ++k) {
    if (k) s += " | ";
    s += "[";
    for (std::size_t i = 0; i < p[k].size(); ++i) s += (i ? " " : "") + g.nodes()[p[k][i]].name;
    s += "]";
  }
  return s;
}

}  // namespace nerve::pipeline

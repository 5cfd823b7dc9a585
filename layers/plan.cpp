#include "layers/plan.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace nerve::layers {

std::vector<micro_batch_rows> split_micro_batches(std::int64_t rows, std::size_t parts) {
  if (parts == 0) throw std::invalid_argument("split_micro_batches: parts must be at least 1");
  if (rows < 0 || static_cast<std::uint64_t>(rows) < parts)
    throw std::invalid_argument("cannot split a batch of " + std::to_string(rows) + " into " + std::to_string(parts) +
                                " non-empty micro-batches");
  const auto m = static_cast<std::int64_t>(parts);
  std::vector<micro_batch_rows> out(parts);
  std::int64_t at = 0;
  for (std::int64_t k = 0; k < m; ++k) {
    const std::int64_t count = rows / m + (k < rows % m ? 1 : 0);
    out[static_cast<std::size_t>(k)] = {at, count};
    at += count;
  }
  return out;
}

graph_plan make_plan(const graph& g) {
  const auto& nodes = g.nodes();
  graph_plan plan;
  plan.nodes.resize(nodes.size());

  // Consumer edges: distinct consumers in `consumers` order, each one's ports ascending.
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    auto& np = plan.nodes[i];
    std::vector<std::size_t> seen;
    for (std::size_t c : nodes[i].consumers) {
      if (std::find(seen.begin(), seen.end(), c) != seen.end()) continue;
      seen.push_back(c);
      for (std::size_t k = 0; k < nodes[c].inputs.size(); ++k)
        if (nodes[c].inputs[k] == i) np.edges.push_back({c, static_cast<std::uint32_t>(k)});
    }
    np.feeds_loss = i == g.output();
    (nodes[i].is_input() ? plan.input_edges : plan.gradient_edges) += np.edges.size();
  }
  plan.gradient_edges += 1;  // the output's edge into the loss

  // Producer edges: input port k of node i is edge (i, k) of its producer.
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    auto& np = plan.nodes[i];
    np.producer_edge.resize(nodes[i].inputs.size());
    for (std::size_t k = 0; k < nodes[i].inputs.size(); ++k) {
      const auto& pe = plan.nodes[nodes[i].inputs[k]].edges;
      const auto it = std::find(pe.begin(), pe.end(), plan_edge{i, static_cast<std::uint32_t>(k)});
      np.producer_edge[k] = static_cast<std::uint32_t>(it - pe.begin());
    }
  }

  // Gradient order: the loss first, then consumers latest in the topological order first,
  // ports ascending within one consumer (the direct executor's backward sweep).
  std::vector<long> topo_pos(nodes.size());
  for (std::size_t k = 0; k < g.order().size(); ++k) topo_pos[g.order()[k]] = static_cast<long>(k);
  for (auto& np : plan.nodes) {
    const auto n = static_cast<std::uint32_t>(np.edge_count());
    np.grad_order.resize(n);
    for (std::uint32_t k = 0; k < n; ++k) np.grad_order[k] = k;
    auto rank = [&](std::uint32_t k) -> std::pair<long, std::uint32_t> {
      if (k >= np.edges.size()) return {-static_cast<long>(nodes.size()) - 1, 0};  // the loss edge
      return {-topo_pos[np.edges[k].consumer], np.edges[k].port};
    };
    std::stable_sort(np.grad_order.begin(), np.grad_order.end(), [&](auto a, auto b) { return rank(a) < rank(b); });
  }
  return plan;
}

}  // namespace nerve::layers

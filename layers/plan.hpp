#pragma once
/// \file
/// `graph_plan`: what running a graph needs, computed once from it: the micro-batch split,
/// every node's consumer edges and producer edges, and the order in which a node sums the
/// gradients that come back along its edges.
///
/// ```
///   input ──e0──► fc1 ──e0──► relu1 ──e0──► add1 ──e0──► loss
///                   └─────────e1──────────────┘           (fc1 feeds add1's port 1)
///   fc1's edges: [relu1 port 0, add1 port 1]; add1's producer_edge: [0 (relu1's e0), 1 (fc1's e1)]
///   fc1 sums its gradients in grad_order: e1 (add1, later in the topological order) then e0
/// ```
/// An *edge* is one input port of a consumer reading a node's output; a consumer that
/// reads the same output on two ports is two edges. The graph's output has one more edge,
/// into the loss. The gradient order is the direct executor's (consumers in reverse
/// topological order, ports ascending within one consumer, the loss first), so every
/// engine that sums in this order gets the executor's bits.
///
/// Plain data, computed by `make_plan`; no thread-safety concerns.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "layers/graph.hpp"

namespace nerve::layers {

/// Rows `[first, first + count)` of a batch: one micro-batch.
struct micro_batch_rows {
  std::int64_t first = 0;
  std::int64_t count = 0;
  friend bool operator==(const micro_batch_rows&, const micro_batch_rows&) = default;
};

/// Splits `rows` rows into `parts` contiguous, near-equal micro-batches: the first
/// `rows % parts` get one row more (as `numpy.array_split` / `torch.tensor_split`). The
/// one split rule of every engine. Throws `std::invalid_argument` if `parts` is 0 or
/// greater than `rows` (an empty micro-batch is never what a schedule wants).
std::vector<micro_batch_rows> split_micro_batches(std::int64_t rows, std::size_t parts);

/// One consumer edge of a node: input `port` of node `consumer`.
struct plan_edge {
  std::size_t consumer = 0;
  std::uint32_t port = 0;
  friend bool operator==(const plan_edge&, const plan_edge&) = default;
};

/// A node's wiring.
struct node_plan {
  /// Consumer edges, distinct consumers in the order of `node::consumers`, ports ascending.
  std::vector<plan_edge> edges;
  /// True for the graph's output: edge `edges.size()` goes into the loss.
  bool feeds_loss = false;
  /// Every edge (the loss edge included) in the order its gradient is summed.
  std::vector<std::uint32_t> grad_order;
  /// Per input port: which of the producer's edges this input is.
  std::vector<std::uint32_t> producer_edge;
  /// Edges out of the node, the loss edge included.
  std::size_t edge_count() const noexcept { return edges.size() + (feeds_loss ? 1 : 0); }
};

/// A graph's plan: `nodes[i]` wires node i (graph inputs included).
struct graph_plan {
  std::vector<node_plan> nodes;
  /// Edges that carry a forward and, back, a gradient: from a layer to a layer, and the
  /// output's edge into the loss.
  std::size_t gradient_edges = 0;
  /// Edges from a graph input to a layer (forward only: inputs get no gradient).
  std::size_t input_edges = 0;
};

/// Plans `g` (a built, validated graph).
graph_plan make_plan(const graph& g);

}  // namespace nerve::layers

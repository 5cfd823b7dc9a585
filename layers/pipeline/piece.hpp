#pragma once
/// \file
/// `piece_executor`: forward, B and W of one pipeline piece (a run of consecutive
/// layers of a graph) for any number of micro-batches in flight, with no runtime.
///
/// ```
///   piece k-1 ──(frontier k: every tensor made before piece k and used at k or later)──► piece k
///            ◄──(the gradients of the same tensors)──────────────────────────────────────
/// ```
/// A piece receives the tensors of its input frontier (for piece 0 the graph
/// inputs) and sends those of its output frontier (for the last piece the graph
/// output). A tensor that a later piece uses passes through. Backward sums the
/// gradients of a tensor in the direct executor's order (consumers in reverse
/// topological order; the later pieces' share first, as it arrives summed), and W
/// accumulates parameter gradients in micro-batch order whatever order B ran in,
/// so a pipelined step gives the bits of `direct_executor::train_step`.
///
/// Thread safety: none; one actor (or thread) drives a piece, and no two pieces
/// share a layer.

#include <cstdint>
#include <map>
#include <vector>

#include "layers/graph.hpp"
#include "layers/pipeline/partition.hpp"

namespace nerve::pipeline {

class piece_executor {
 public:
  using tensor = layers::tensor;

  /// Piece `index` of partition `p` of `g` (which must outlive the executor).
  piece_executor(layers::graph& g, const partition& p, std::size_t index);

  /// Node indices whose tensors come in (forward) and whose gradients go out (backward).
  const std::vector<std::size_t>& input_nodes() const noexcept { return in_; }
  /// Node indices whose tensors go out (forward) and whose gradients come in.
  const std::vector<std::size_t>& output_nodes() const noexcept { return out_; }
  const std::vector<std::size_t>& nodes() const noexcept { return nodes_; }
  /// The graph's nodes (index with `nodes()`).
  std::vector<layers::node>& graph_nodes() noexcept { return g_.nodes(); }

  /// Forward of micro-batch `mb`: tensors of `input_nodes()` in, of `output_nodes()` out.
  std::vector<tensor> forward(std::uint64_t mb, std::vector<tensor> inputs, const layers::forward_context& ctx);
  /// B of micro-batch `mb`: gradients of `output_nodes()` in, of `input_nodes()` out
  /// (empty tensors for graph inputs). Keeps what W needs.
  std::vector<tensor> backward_input(std::uint64_t mb, std::vector<tensor> grads);
  /// W of micro-batch `mb` (after its B). Runs the W of every micro-batch that is due
  /// in micro-batch order (0, 1, …, reset by `zero_grad`); a later one waits for the earlier.
  void backward_weight(std::uint64_t mb);

  /// Zeroes the piece's parameter gradients and restarts the W order at micro-batch 0.
  void zero_grad();
  /// The piece's parameters (named as in the graph).
  std::vector<layers::parameter_ref> parameters();

  /// Micro-batches between forward and the end of their W, and the bytes they hold.
  std::size_t stashed() const noexcept { return held_.size(); }
  std::size_t stash_bytes() const noexcept { return bytes_; }

  /// Adds each layer's forward+B+W seconds to `(*t)[i]` (i: position in `nodes()`); null: off.
  void set_timer(std::vector<double>* t) noexcept { timer_ = t; }

 private:
  struct held {
    std::vector<layers::basic_stash<float>> stashes;  // by position in nodes_
    std::vector<tensor> dy;              // after B: the output gradient of each node
    bool b_done = false, w_due = false;
    std::size_t bytes = 0;
  };
  void run_weight(held& h);

  layers::graph& g_;
  std::vector<std::size_t> nodes_, in_, out_;
  std::vector<int> local_;                   // node index -> position in nodes_, -1 outside
  std::vector<std::size_t> uses_in_piece_;   // node index -> consumer edges inside the piece
  std::map<std::uint64_t, held> held_;
  std::uint64_t next_w_ = 0;
  std::size_t bytes_ = 0;
  std::vector<double>* timer_ = nullptr;
};

}  // namespace nerve::pipeline

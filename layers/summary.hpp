#pragma once
/// \file
/// `summary`: a graph's nodes as a table (PyTorch users know it from `torchinfo`): each
/// node's name, kind, output shape, parameter count, the bytes its forward keeps for its
/// backward per micro-batch (the stash) and where it runs; and the totals.
///
/// ```
///   node     kind    output  parameters  stash/micro-batch  runs on
///   input    Input   [784]            -                  -  -
///   fc1      Linear  [256]       200960            200704  loop 0
///   ...
///   total                        203530            ...
/// ```
/// The stash is measured, not estimated: forward runs once on zeros of two rows and once
/// of three rows (BatchNorm refuses one in training), in training mode, and the stash grows linearly from there to the
/// micro-batch asked for (what every built-in layer keeps is an affine function of the
/// rows). The graph's buffers (BatchNorm's running statistics) and each layer's mode are
/// put back afterwards; a BatchNorm's `batches_tracked()` count, which no arithmetic reads,
/// counts the two calls. Hooks do not run. The apps summarise a graph of their own.

#include <cstdint>
#include <string>
#include <vector>

#include "layers/graph.hpp"
#include "layers/shape.hpp"

namespace nerve::layers {

/// One node of a `model_summary`.
struct node_summary {
  std::string name;
  std::string kind;                ///< the layer's `kind()`, or `Input` for a graph input
  shape output;                    ///< one sample's output shape
  std::int64_t parameters = 0;     ///< trainable scalars
  std::int64_t stash_bytes = 0;    ///< what forward keeps for backward, per micro-batch
  std::string place;               ///< where it runs (`loop 0`, `stage 1 (cuda:0)`); `-` for an input
};

/// A graph summarised for micro-batches of `micro_batch` rows.
struct model_summary {
  std::vector<node_summary> nodes;  ///< in the graph's topological order
  std::int64_t micro_batch = 1;
  std::int64_t parameters = 0;      ///< summed over the nodes
  std::int64_t stash_bytes = 0;     ///< summed over the nodes: one micro-batch in flight through all
  /// The parameters' bytes (float32).
  std::int64_t parameter_bytes() const noexcept { return parameters * std::int64_t(sizeof(float)); }
};

/// What `summary` is told besides the graph.
struct summary_options {
  /// Rows of the micro-batch whose stash is counted (at least 1).
  std::int64_t micro_batch = 1;
  /// Where node `i` runs, by node index of the graph (`places_on_loops` makes them for a
  /// network); empty or shorter: `-` for the nodes left out.
  std::vector<std::string> places;
};

/// Summarises `g` (see the file's comment: runs forward twice on zeros; between runs, on
/// the thread that owns the graph). Throws `std::invalid_argument` for a `micro_batch`
/// below 1, and what a layer's forward throws.
model_summary summary(graph& g, const summary_options& options = {});

/// Where a `network`'s layer actors run on `loops` loops (`network_options::spread`),
/// by node index: `loop L`, followed by ` on DEVICE` when `device` is not `cpu`.
std::vector<std::string> places_on_loops(const graph& g, unsigned loops, bool spread, const std::string& device);

/// The summary as an aligned text table, a line per node, then the totals.
std::string to_text(const model_summary& s);

/// The totals in one line: `203,530 parameters (795.0 KiB), stash 1.2 MiB per micro-batch of 256`.
std::string totals_line(const model_summary& s);

}  // namespace nerve::layers

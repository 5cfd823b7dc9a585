#pragma once
/// \file
/// Cutting a graph into pipeline pieces: runs of consecutive layers (in the graph's
/// topological order), by explicit split points, by parameter count, or by measured cost.
///
/// ```
///   deep-mlp, 2 pieces by parameters:
///   [fc1 relu1 fc2 relu2] | [fc3 relu3 fc4 relu4 fc5]
/// ```
/// A piece is a list of graph node indices (layers only, never graph inputs). Every
/// function refuses a partition that would leave a piece empty, naming the counts.
/// Not thread-safe: call before a pipeline runs.

#include <cstdint>
#include <string>
#include <vector>

#include "layers/graph.hpp"

namespace nerve::pipeline {

/// Layer node indices of each piece, in topological order.
using partition = std::vector<std::vector<std::size_t>>;

/// Cuts before each layer named in `first_layers` (the first layer of pieces 1, 2, …):
/// `{"fc3"}` gives two pieces, `[… up to before fc3] [fc3 …]`. Throws
/// `std::invalid_argument` for an unknown name, names out of order, or an empty piece.
partition partition_at(const layers::graph& g, const std::vector<std::string>& first_layers);

/// `pieces` runs whose costs (one per layer in topological order, graph inputs left out)
/// have the smallest possible maximum (ties: the earliest cut). A transformer's blocks stay
/// whole (no cut between two layers of `blocks.3`, layers/module_path.hpp) unless there are
/// more pieces than places left to cut. Throws `std::invalid_argument`
/// when there are fewer layers than pieces (a piece would be empty) or `pieces` is 0.
partition partition_by_cost(const layers::graph& g, const std::vector<double>& layer_costs, std::size_t pieces);

/// Balances trainable parameter counts (a layer without parameters weighs one
/// parameter, so activations spread too).
partition partition_by_parameters(layers::graph& g, std::size_t pieces);

/// Measures forward + backward seconds per layer (median of `repeats` runs on a
/// batch of `batch` random samples, after one warm-up), for `partition_by_cost`.
/// Runs the graph directly on the calling thread; gradients are zeroed afterwards.
std::vector<double> profile_layers(layers::graph& g, std::int64_t batch, int repeats = 3, std::uint64_t seed = 0);

/// `[fc1 relu1] | [fc2 …]`: the layer names of each piece.
std::string to_string(const layers::graph& g, const partition& p);

}  // namespace nerve::pipeline

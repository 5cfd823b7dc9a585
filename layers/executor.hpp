#pragma once
/// \file
/// `basic_direct_executor`: runs a graph's layers directly, in topological order, on the caller's thread.
///
/// This is the reference the actor executor must match bitwise: the same layer
/// calls in the same order on the same data.

#include <cstdint>
#include <map>
#include <vector>

#include "layers/graph.hpp"
#include "layers/loss.hpp"
#include "layers/memory.hpp"
#include "layers/optimizer.hpp"

namespace nerve::layers {

/// What one training step reports.
struct step_result {
  /// Mean loss over the mini-batch (the weighted mean of the micro-batch losses).
  double loss = 0;
  /// Correctly classified samples in the mini-batch.
  std::int64_t correct = 0;
  std::int64_t samples = 0;
};

/// Runs forward and backward of a `basic_graph` without any runtime.
///
/// Forward keeps, per micro-batch id, every node's stash until that
/// micro-batch's backward, so several micro-batches can be in flight (as in a
/// pipeline). Fan-out hands each consumer its own copy of the output (the last
/// consumer gets the original by move); in backward, the gradients from all
/// consumers of a node are summed before its layer runs. Input gradients of
/// graph inputs are not computed.
///
/// Thread safety: none; one thread drives the executor and its graph.
template <class Scalar>
class basic_direct_executor {
 public:
  using tensor_type = basic_tensor<Scalar>;
  using graph_type = basic_graph<Scalar>;

  /// Runs `graph`, which must outlive the executor. Sets the training heap policy
  /// (`keep_freed_memory`) so steps reuse their pages.
  explicit basic_direct_executor(graph_type& g) : graph_(g) { keep_freed_memory(); }

  /// Forward of one micro-batch: `inputs` in the order of `graph.inputs()`.
  /// Returns the graph's output and stashes what backward needs under
  /// `context.micro_batch` (an id already in flight is an error).
  tensor_type forward(std::vector<tensor_type> inputs, const forward_context& context = {});
  tensor_type forward(tensor_type input, const forward_context& context = {});

  /// Backward of micro-batch `micro_batch` from the gradient of the loss with
  /// respect to the graph output. Accumulates every parameter gradient and
  /// releases the micro-batch's stashes.
  void backward(std::uint64_t micro_batch, const tensor_type& grad_output);

  /// Forward without keeping stashes (for evaluation; the layers' mode is unchanged). Its
  /// forward hooks see `hook_context::training` false and step 0.
  tensor_type predict(tensor_type input);

  /// One optimizer step over a mini-batch split into `micro_batches` nearly equal
  /// micro-batches (sizes differ by at most one): zero_grad, then per
  /// micro-batch forward, loss, backward with the loss gradient scaled by the
  /// micro-batch's share nᵢ/N (so the accumulated gradient is the gradient of
  /// the mini-batch mean), then `optimizer.step`. `step` is passed to layers
  /// (Dropout masks) in the forward context; micro-batch ids are 0…m−1.
  step_result train_step(tensor_type input, const basic_targets<Scalar>& target,
                         const basic_loss<Scalar>& criterion, basic_optimizer<Scalar>& opt,
                         std::size_t micro_batches = 1, std::uint64_t step = 0);

  /// Accuracy-style evaluation of a batch: the mean loss and the correct count, no stashes.
  step_result evaluate(tensor_type input, const basic_targets<Scalar>& target, const basic_loss<Scalar>& criterion);

  /// Micro-batches between forward and backward.
  std::size_t in_flight() const noexcept { return stashes_.size(); }
  /// Scalar bytes held in stashes now (what a pipeline stage bounds).
  std::size_t stash_bytes() const noexcept;

 private:
  tensor_type run_forward(std::vector<tensor_type> inputs, const forward_context& context,
                          std::vector<basic_stash<Scalar>>* keep);

  /// What forward keeps for one micro-batch until its backward.
  struct kept_forward {
    std::vector<basic_stash<Scalar>> stashes;  // by node index
    std::uint64_t step = 0;                     // the forward's, for the backward hooks
  };

  graph_type& graph_;
  std::map<std::uint64_t, kept_forward> stashes_;
};

using direct_executor = basic_direct_executor<float>;

}  // namespace nerve::layers

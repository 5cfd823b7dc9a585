#pragma once
/// \file
/// `stage_engine`: where a pipeline stage runs its pieces when not on its loop's CPU
/// (a GPU stream, or the CPU stand-in of one). The stage actor keeps its schedule,
/// messages, metrics and failure handling; the engine only enqueues.
///
/// ```
///   stage actor (loop L)                 engine (stream S of a device)
///   F mb ──forward(chunk, mb, in)──────► enqueue fwd on S, record ready event ──► payload
///   B mb ──backward_input(...)─────────► enqueue B on S                       ──► payload
///   end  ──optimizer_step; when_done──► [event] … completion poller ──► done() on L
/// ```
/// A payload between two stages whose engines share a `domain()` (the same device)
/// stays on the device: its tensors and their ready event; the receiver's stream waits
/// on the event, nothing goes through the host. Toward a CPU stage (or another device)
/// the sender copies into pinned memory (`to_host`) and sends once the copy's event
/// has come back on its loop; from a CPU stage the receiving engine copies the host
/// tensors in through pinned memory on its own stream.
///
/// Thread safety: one stage actor drives an engine; every call on its loop. Callbacks
/// run on the executor they are given (the stage's loop).

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/any_io_executor.hpp>

#include "layers/graph.hpp"
#include "layers/loss.hpp"
#include "layers/optimizer.hpp"
#include "layers/pipeline/partition.hpp"

namespace nerve::pipeline {

/// The tensors of one micro-batch between two pieces: on the host, or device-resident
/// (an engine's own type, opaque here). Exactly one of the two is set. Move-only in use.
struct stage_payload {
  std::vector<layers::tensor> host;
  std::shared_ptr<void> device;
  bool on_device() const noexcept { return device != nullptr; }
};

/// The figures of one micro-batch's loss (read after `when_done`).
struct engine_loss {
  double loss = 0;
  std::int64_t correct = 0;
};

class stage_engine {
 public:
  using done_handler = std::function<void(std::exception_ptr)>;
  using host_handler = std::function<void(std::exception_ptr, std::vector<layers::tensor>)>;

  virtual ~stage_engine() = default;
  /// Stages whose engines return the same non-null domain pass device payloads.
  virtual const void* domain() const noexcept = 0;
  /// "cpu stand-in", "NVIDIA H100 …".
  virtual std::string device_name() const = 0;

  /// Start of a step: zero the gradients, restart the W order; `lr` ≥ 0 sets the rate.
  /// `ex` is the stage's loop: completions of the step's own copies are posted there.
  virtual void begin_step(double lr, const boost::asio::any_io_executor& ex) = 0;
  /// F of chunk `chunk` (the stage's k-th piece): `in` are the tensors of the piece's
  /// input frontier (host or device payload); returns those of its output frontier.
  virtual stage_payload forward(std::uint32_t chunk, std::uint64_t mb, stage_payload in) = 0;
  /// The last piece's loss on its output `logits` (as returned by `forward`) and the
  /// gradient scaled by `share` = nᵢ/N, as `layers::loss::backward` does. The figures
  /// are read with `loss_of` after `when_done`.
  virtual stage_payload loss(std::uint64_t mb, stage_payload logits, const layers::targets& t, double share) = 0;
  virtual engine_loss loss_of(std::uint64_t mb) const = 0;
  /// B: gradients of the output frontier in, of the input frontier out.
  virtual stage_payload backward_input(std::uint32_t chunk, std::uint64_t mb, stage_payload grads) = 0;
  /// W (in micro-batch order whatever order it is called in, as `piece_executor`).
  virtual void backward_weight(std::uint32_t chunk, std::uint64_t mb) = 0;
  /// The optimizer step over the stage's parameters.
  virtual void optimizer_step() = 0;

  /// Copies a device payload to host tensors; `done` runs on `ex` once they are in.
  virtual void to_host(stage_payload p, const boost::asio::any_io_executor& ex, host_handler done) = 0;
  /// `done` runs on `ex` when everything enqueued so far has completed (or failed).
  virtual void when_done(const boost::asio::any_io_executor& ex, done_handler done) = 0;

  /// Payloads between pieces that went through the host since construction: device
  /// payloads copied out (`to_host`) plus host payloads copied in, not counting the
  /// batch into piece 0 or the labels. 0 for a stage whose neighbours share its device.
  virtual std::int64_t host_transfers() const noexcept = 0;
  /// Micro-batch·chunks held between F and the end of W, and their bytes.
  virtual std::size_t stashed() const noexcept = 0;
  virtual std::size_t stash_bytes() const noexcept = 0;
  /// Copies the device parameters into the graph's layers (waits: not on a loop).
  virtual void download() = 0;
  /// The stage's optimizer state, parameters named as in the graph (checkpoints; waits:
  /// not on a loop, between steps).
  virtual layers::optimizer_state optimizer_state() = 0;
  /// Replaces it (resume; waits: not on a loop, before the first step).
  virtual void load_optimizer_state(const layers::optimizer_state& state) = 0;
};

/// What an engine is made from: the stage's pieces of the graph.
struct stage_engine_context {
  layers::graph& graph;
  const partition& pieces;
  std::uint32_t stage = 0;
  std::vector<std::uint32_t> piece_of_chunk;  ///< piece index of each chunk of the stage
  bool holds_last = false;                    ///< the stage runs the last piece (the loss)
  std::shared_ptr<const layers::loss> criterion;
};

/// Makes the engine of a stage (null: the stage runs on its loop's CPU).
using stage_engine_factory = std::function<std::shared_ptr<stage_engine>(const stage_engine_context&)>;

}  // namespace nerve::pipeline

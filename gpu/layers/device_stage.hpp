#pragma once
/// \file
/// `device_stage`: a pipeline stage's pieces on a stream of a device — the
/// `pipeline::stage_engine` of `nerve-pipeline --devices cpu,cuda:0,...`.
///
/// ```
///  stage 0 (CPU, loop 0)        stage 1 (stream A)                stage 2 (stream B, same device)
///  F ─ host tensors ──────────► pinned ─H2D─► fwd … ─[event e]─► B waits on e (no host) ─► fwd … loss
///  ◄──── host tensors ◄─ pinned ◄─D2H─ [event] ◄─ B … ◄─[event]── device gradients + event ◄─ B …
///            (sent from the loop once the copy's completion came back as an event)
/// ```
/// Several stages may share one device, each on its own stream. Between two of them a
/// payload is the device tensors plus their ready event (`device_message`'s rule);
/// toward the CPU (or another device) it goes through pinned memory, and the message
/// is sent from the completion handler on the stage's loop. The forward, B and W of a
/// piece are the device twins of `piece_executor`'s, in the same order (W in
/// micro-batch order, fan-out sums latest consumer first), so a pipelined step on one
/// device gives the bits of the same step on one device stage. The loss is softmax
/// cross-entropy; its figures come back with the step's completion.
///
/// Thread safety: as `stage_engine` (one stage actor's loop). Construct, `download` and
/// destroy off the loops; the device must outlive the engine's pipeline.

#include "gpu/device.hpp"
#include "gpu/layers/device_network.hpp"
#include "layers/pipeline/stage_engine.hpp"

#include <memory>

namespace nerve::gpu {

struct device_stage_options {
  device_optimizer optimizer;  ///< the stage's optimizer (CPU stages use the pipeline's factory)
  stream_options stream;
};

/// The engine of one stage on a new stream of `dev` (mirrors the pieces' current CPU
/// parameters; setup: waits for the stream). Throws `gpu::error` (`not_supported`
/// naming a layer without a device twin, or a loss other than cross-entropy).
std::shared_ptr<pipeline::stage_engine> make_device_stage(device& dev, const pipeline::stage_engine_context& ctx,
                                                          const device_stage_options& options = {});

/// The stream a device stage enqueues on (tests plant faults on it; benches gate it).
/// Throws `std::invalid_argument` when `e` is not a device stage.
stream stage_stream(pipeline::stage_engine& e);

/// `device_optimizer` of an optimizer as the CPU trainer names it ("sgd", "adam", "adamw").
device_optimizer optimizer_of(const std::string& kind, double lr, double momentum = 0, double weight_decay = 0);

}  // namespace nerve::gpu

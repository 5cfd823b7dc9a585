#pragma once
/// \file
/// `gpu::train`: `layers::train` with the network on a device (`nerve-train --device cuda[:N]`).
///
/// The same options, data, shuffling, schedules, evaluation and checkpoints as the
/// CPU trainer; the preset runs as a `device_network` on one stream, its step
/// completions delivered on the network's loop (an io_context thread). While the
/// device runs step b, the calling thread gathers batch b+1 into the other pinned
/// slot. Checkpoints are the same safetensors files whatever the device (the
/// weights are downloaded into the CPU graph at the end).

#include "layers/trainer.hpp"

#include <string>

namespace nerve::gpu {

class device;

/// Parses a `--device` value: "cpu" (returns false), "cuda", "cuda:N", or "standin"
/// (the CPU stand-in backend, for tests). Sets `backend` (a `gpu::backend_kind` as
/// int) and `ordinal`. Throws `std::invalid_argument` on anything else.
bool parse_device(const std::string& spec, int& backend, int& ordinal);

/// Trains as `layers::train` does, on the device `spec` names ("cuda", "cuda:1",
/// "standin"). Throws on bad options, data, no device, and failures of the run
/// (the CUDA error named).
layers::train_report train(const layers::train_options& options, const std::string& spec,
                           const std::function<void(const layers::train_progress&)>& on_progress = {},
                           const std::function<void(const layers::epoch_stats&)>& on_epoch = {});

}  // namespace nerve::gpu

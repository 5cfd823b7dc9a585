#pragma once
/// \file
/// The device engines of the one trainer (`layers::train`): `--device cuda[:N]` and
/// `--device standin` (the CPU stand-in of a GPU, for tests and machines without one).
///
/// The preset (or a user's graph) runs as the layer actors of a `layers::network` on loop
/// 0, their kernels on one stream of the device (`device_backend`); the device's
/// completions come back to the actors as events, and the trainer's loader actor gathers
/// batch b+1 while the device runs step b. The weights are
/// downloaded into the graph when the run finishes, so checkpoints are the same
/// safetensors files whatever the device.

#include <string>

namespace nerve::gpu {

/// Parses a `--device` value: "cpu" (returns false), "cuda", "cuda:N", or "standin"
/// (the CPU stand-in backend, for tests). Sets `backend` (a `gpu::backend_kind` as
/// int) and `ordinal`. Throws `std::invalid_argument` on anything else.
bool parse_device(const std::string& spec, int& backend, int& ordinal);

/// Registers the `cuda` and `standin` engines with `layers::register_engine`. Call once
/// before `layers::train` with such a device (the apps do at start).
void register_engines();

}  // namespace nerve::gpu

#pragma once
/// \file
/// The devices of this build for the one registry (`layers/devices.hpp`): `cuda`,
/// `cuda:N` and `standin` (the CPU stand-in of a GPU, for tests and machines without one).
///
/// An opened device makes a `device_backend` per network or pipeline stage, each on a
/// stream of its own: the layer actors' kernels go there, the device's completions come
/// back to the actors as events, and the weights are downloaded into the graph when the
/// run finishes, so checkpoints are the same safetensors files whatever the device.

namespace nerve::gpu {

/// Registers `cuda` and `standin` with `layers::register_device`. Call once before a
/// device is named (the apps do at start); calling it again changes nothing.
void register_devices();

}  // namespace nerve::gpu

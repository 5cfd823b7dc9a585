#pragma once
/// \file
/// Only for `device_stage.hpp`'s include, until the pipeline's stages are layer actors
/// (issue #20): a network on a device is `layers::network` with a `device_backend`.
#include "gpu/layers/device_parameters.hpp"

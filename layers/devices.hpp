#pragma once
/// \file
/// Devices by name: the one parser and the one registry behind `--device` (nerve-train),
/// `--devices` (nerve-pipeline's stages) and a user's own `train_options::device`.
///
/// A name is `cpu`, `KIND` or `KIND:N`. `cpu` is built in: the layer actors' own Eigen
/// and OpenBLAS kernels, no handle. Other kinds are registered by the code that can open
/// them (`gpu::register_devices` adds `cuda` and `standin`, the CPU stand-in of a GPU), as
/// ggml's backends register with its registry: nothing here names a device, and a build
/// without CUDA still parses and refuses `cuda` with the kinds it has.
///
/// An opened device (`device_handle`) makes backends (layers/backend.hpp): one per network
/// or per pipeline stage, each on a stream of its own, several sharing the device.

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

// The whole of nlohmann::json, not its forward declaration: a device of a user's own
// fills `trace_metadata`'s object, which needs the type defined.
#include <nlohmann/json.hpp>

#include "layers/backend.hpp"

namespace nerve::actors {
class runtime;
}

namespace nerve::layers {

/// What a device backend's optimizer runs: its kernels own the optimizer and its state.
struct optimizer_settings {
  std::string name = "sgd";  ///< sgd, adam, adamw
  double lr = 0.1, momentum = 0, weight_decay = 0;
  bool nesterov = false;
  double beta2 = 0.999;  ///< adam, adamw
};

/// A device opened by name (`open_device`). Members are called off the loops.
class device_handle {
 public:
  virtual ~device_handle() = default;
  /// What it is, for banners and the trace: "standin", "NVIDIA H200 (cuda:0)".
  virtual std::string name() const = 0;
  /// A backend on a stream of its own for `nodes` of `g` (every layer node when empty),
  /// stepping with `optimizer`, staging batches of up to `max_batch` rows.
  virtual std::shared_ptr<backend> make_backend(graph& g, const std::vector<std::size_t>& nodes,
                                                const optimizer_settings& optimizer, std::size_t max_batch) = 0;
  /// Adds what the trace's `nerve` metadata says of the device (`device`: name, ordinal).
  virtual void trace_metadata(nlohmann::json& extra) const = 0;
};

/// A device name taken apart.
struct device_spec {
  std::string kind = "cpu";
  int ordinal = -1;  ///< -1: none named (the device of this process's place: see `device_request`)
  std::string text = "cpu";
  bool cpu() const noexcept { return kind == "cpu"; }
};

/// Parses `text` as `cpu`, `KIND` or `KIND:N` (N a device number) for a kind this build
/// has. Throws `std::invalid_argument` naming `option`, the value and the kinds there are;
/// while `cuda` is not registered, it says instead that `gpu::register_devices()` registers
/// it (a program that links nerve::gpu_layers has only `cpu` until it calls that).
device_spec parse_device(const std::string& text, std::string_view option = "--device");

/// How a device is opened.
struct device_request {
  /// The runtime whose loops hear the device's completions (its `synchronize` waits for
  /// them) and whose recorder takes the device's spans when it records.
  actors::runtime* rt = nullptr;
  /// Replicas run one per rank: an unnumbered device is this rank's local one, and a
  /// device that sums among ranks may refuse more ranks per machine than devices.
  bool replicas_across_ranks = false;
  /// This process is one rank of several (an unnumbered device is the local rank's).
  bool ranked = false;
};

using device_opener = std::function<std::unique_ptr<device_handle>(const device_spec&, const device_request&)>;

/// Registers `kind` (a name of letters and digits; `cpu` is built in and refused). A later
/// registration of the same kind replaces the earlier one. Any thread, before use.
void register_device(const std::string& kind, device_opener open);
/// Opens the device `spec` names (not `cpu`, which has no handle). Throws
/// `std::invalid_argument` for a kind that is not registered.
std::unique_ptr<device_handle> open_device(const device_spec& spec, const device_request& request);
/// `cpu`, then every registered kind in name order.
std::vector<std::string> device_kinds();

}  // namespace nerve::layers

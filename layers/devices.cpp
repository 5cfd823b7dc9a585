#include "layers/devices.hpp"

#include <algorithm>
#include <cctype>
#include <map>
#include <mutex>
#include <stdexcept>

namespace nerve::layers {

namespace {

struct registry {
  std::mutex m;
  std::map<std::string, device_opener, std::less<>> by_kind;
};
registry& devices() {
  static registry r;
  return r;
}

std::string kinds_text() {
  std::string out;
  for (const auto& k : device_kinds()) out += (out.empty() ? "" : ", ") + k;
  return out;
}

// What to call, while nothing registered `cuda` (empty once something did): a program
// that links nerve::gpu_layers but never called `gpu::register_devices()` has `cpu` alone
// whatever its build has, and "this build has: cpu" sent its user looking for a CUDA build.
std::string unregistered_hint() {
  const auto kinds = device_kinds();
  if (std::find(kinds.begin(), kinds.end(), "cuda") != kinds.end()) return "";
  return "this program has registered " + kinds_text() +
         " only: cuda and standin are registered by nerve::gpu::register_devices() (gpu/layers/train.hpp, "
         "target nerve::gpu_layers), which it must call before it names a device";
}

}  // namespace

void register_device(const std::string& kind, device_opener open) {
  const bool word = !kind.empty() && std::all_of(kind.begin(), kind.end(), [](unsigned char c) {
    return std::isalnum(c) != 0;
  });
  if (!word || kind == "cpu")
    throw std::invalid_argument("register_device: '" + kind + "' is not a device kind to register (letters and "
                                "digits, not cpu)");
  if (!open) throw std::invalid_argument("register_device: no opener for '" + kind + "'");
  auto& r = devices();
  std::lock_guard lock(r.m);
  r.by_kind[kind] = std::move(open);
}

std::vector<std::string> device_kinds() {
  std::vector<std::string> out{"cpu"};
  auto& r = devices();
  std::lock_guard lock(r.m);
  for (const auto& [k, _] : r.by_kind) out.push_back(k);
  return out;
}

device_spec parse_device(const std::string& text, std::string_view option) {
  const auto colon = text.find(':');
  device_spec d{text.substr(0, colon), -1, text};
  const auto kinds = device_kinds();
  if (std::find(kinds.begin(), kinds.end(), d.kind) == kinds.end()) {
    if (const auto hint = unregistered_hint(); !hint.empty())
      throw std::invalid_argument("unknown " + std::string(option) + " '" + text + "': " + hint);
    throw std::invalid_argument("unknown " + std::string(option) + " '" + text + "' (this build has: " + kinds_text() +
                                ", and a number after a device kind, e.g. cuda:1)");
  }
  if (colon == std::string::npos) return d;
  const auto n = text.substr(colon + 1);
  const bool digits =
      !n.empty() && n.size() <= 6 && std::all_of(n.begin(), n.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
  if (!digits || d.cpu())
    throw std::invalid_argument(std::string(option) + " '" + text + "': expected " +
                                (d.cpu() ? std::string("cpu, with no number") : d.kind + ":N with N a device number"));
  d.ordinal = std::stoi(n);
  return d;
}

std::unique_ptr<device_handle> open_device(const device_spec& spec, const device_request& request) {
  device_opener open;
  {
    auto& r = devices();
    std::lock_guard lock(r.m);
    if (auto it = r.by_kind.find(spec.kind); it != r.by_kind.end()) open = it->second;
  }
  if (!open) {
    if (const auto hint = unregistered_hint(); !hint.empty())
      throw std::invalid_argument("open_device: '" + spec.text + "': " + hint);
    throw std::invalid_argument("open_device: '" + spec.text + "' is not a device this build registered (it has: " +
                                kinds_text() + ")");
  }
  return open(spec, request);
}

}  // namespace nerve::layers

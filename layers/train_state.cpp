// Weights files and the training state in a checkpoint: `save_weights`, `load_weights`
// (a weights file or a checkpoint's weights), and what the trainer writes between steps
// and resumes from (layers/detail/train_state.hpp).
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>

#include "layers/checkpoint/checkpoint.hpp"
#include "layers/detail/resume_check.hpp"
#include "layers/detail/train_state.hpp"
#include "layers/trainer.hpp"

#include <nlohmann/json.hpp>

namespace nerve::layers {

namespace {

/// Calls `f(name, tensor, torch_shape)` for each of `g`'s parameters, then each buffer.
template <class F>
void for_each_weight(graph& g, F f) {
  for (auto& p : g.parameters()) f(p.name, *p.value, p.torch_shape);
  for (auto& b : g.buffers()) f(b.name, *b.value, b.torch_shape);
}

std::vector<std::size_t> dims_of(const std::vector<std::int64_t>& torch_shape) {
  return {torch_shape.begin(), torch_shape.end()};
}

/// The graph's weights as a state dict (what --save writes).
checkpoint::state_dict weights_of(graph& g, const std::string& model) {
  checkpoint::state_dict d;
  for_each_weight(g, [&](const std::string& name, const tensor& t, const std::vector<std::int64_t>& shape) {
    d.add(name, dims_of(shape), std::vector<float>(t.data(), t.data() + t.size()));
  });
  d.metadata["model"] = model;
  d.metadata["format"] = "nerve-checkpoint-1";
  return d;
}

std::vector<std::string> weight_names(graph& g) {
  std::vector<std::string> names;
  for_each_weight(g, [&](const std::string& name, const tensor&, const auto&) { names.push_back(name); });
  return names;
}

constexpr const char* state_key = "nerve.train_state";
constexpr std::string_view optimizer_prefix = "optimizer.";

/// A checkpoint's weights and buffers: all but its optimizer state (`write_train_state`).
checkpoint::state_dict weights_of_checkpoint(const checkpoint::state_dict& d) {
  checkpoint::state_dict w;
  w.metadata = d.metadata;
  w.source = d.source;
  for (const auto& [name, t] : d.tensors()) {
    if (name.starts_with(optimizer_prefix)) continue;
    if (t.is_integer) w.add_int64(name, t.shape, t.ints);
    else w.add(name, t.shape, t.floats);
  }
  return w;
}

/// Copies the checkpoint's weights into `g` (its names already checked).
void copy_weights(const checkpoint::state_dict& d, graph& g) {
  for_each_weight(g, [&](const std::string& name, tensor& t, const std::vector<std::int64_t>& shape) {
    d.copy_to(name, dims_of(shape), std::span<float>(t.data(), static_cast<std::size_t>(t.size())));
  });
  g.copy_tied();  // a tied weight is in the file once, under its owner's name
}

}  // namespace

void save_weights(graph& g, const std::filesystem::path& path, const std::string& model) {
  checkpoint::save_checkpoint(path, weights_of(g, model));
}

void load_weights(graph& g, const std::filesystem::path& path, bool allow_nonfinite) {
  auto d = checkpoint::load_checkpoint(path);
  if (d.metadata.contains(state_key)) d = weights_of_checkpoint(d);
  if (!allow_nonfinite) d.check_finite();
  auto names = weight_names(g);
  // PyTorch's BatchNorm keeps an integer step count we do not use; accept it when present.
  for (auto& n : d.names())
    if (n.ends_with(".num_batches_tracked")) names.push_back(n);
  d.check_names(names);
  copy_weights(d, g);
}


namespace detail {

nlohmann::json settings_of(const train_options& o) {
  nlohmann::json s = o;
  s["app"] = o.app_settings;
  // Only when set: a checkpoint written before the option existed had none.
  if (o.normalize) s["normalize"] = {o.normalize->mean, o.normalize->std};
  if (o.beta2 != train_options{}.beta2) s["beta2"] = o.beta2;
  if (!o.train_data.empty()) s["train_data"] = {o.train_data.inputs.string(), o.train_data.labels.string()};
  if (!o.test_data.empty()) s["test_data"] = {o.test_data.inputs.string(), o.test_data.labels.string()};
  if (o.augment.any()) s["augment"] = data::augment_text(o.augment);
  return s;
}

void write_train_state(const std::filesystem::path& path, graph& g, const optimizer_state& opt,
                       const train_options& o, const run_position& pos) {
  auto d = weights_of(g, o.model);
  for (auto& b : opt.buffers)
    d.add(std::string(optimizer_prefix) + b.parameter + "." + b.name, {b.values.size()}, b.values);
  const nlohmann::json state = {{"format", "nerve-train-state-1"},
                                {"settings", settings_of(o)},
                                {"position", pos},
                                {"epochs", pos.done},
                                {"optimizer_counters", opt.counters}};
  d.metadata[state_key] = state.dump();
  checkpoint::save_checkpoint(path, d);
}

nlohmann::json read_state(const checkpoint::state_dict& d, const std::filesystem::path& path) {
  auto it = d.metadata.find(state_key);
  if (it == d.metadata.end())
    throw std::invalid_argument("--resume " + path.string() +
                                ": no training state in it (weights only? --init starts from weights)");
  try {
    auto j = nlohmann::json::parse(it->second);
    if (j.value("format", "") != "nerve-train-state-1")
      throw std::invalid_argument("unknown format '" + j.value("format", "") + "'");
    return j;
  } catch (const std::exception& e) {
    throw std::invalid_argument("--resume " + path.string() + ": unreadable training state: " + e.what());
  }
}

/// Loads the checkpoint's weights into `g` and returns its optimizer state and position.
/// Its weights and optimizer buffers must be finite unless the run allows otherwise, as
/// `--init` refuses them: one NaN hidden by a ReLU would reach `--save`.
std::pair<optimizer_state, run_position> read_train_state(const std::filesystem::path& path, graph& g,
                                                          bool allow_nonfinite) {
  const auto d = checkpoint::load_checkpoint(path);
  const auto j = read_state(d, path);
  if (!allow_nonfinite) d.check_finite("a run started with --allow-nonfinite goes on through them");
  detail::check_state_json(j, path.string());
  try {
    auto names = weight_names(g);
    optimizer_state opt;
    for (auto& n : d.names()) {
      if (!n.starts_with(optimizer_prefix)) continue;
      names.push_back(n);
      const auto dot = n.rfind('.');
      const auto& t = d.at(n);
      opt.buffers.push_back({n.substr(optimizer_prefix.size(), dot - optimizer_prefix.size()), n.substr(dot + 1), t.floats});
    }
    d.check_names(names);
    copy_weights(d, g);
    j.at("optimizer_counters").get_to(opt.counters);
    auto pos = j.at("position").get<run_position>();
    j.at("epochs").get_to(pos.done);
    if (j.contains("settings")) {
      pos.planned_epochs = j["settings"].value("epochs", 0);
      pos.planned_steps = j["settings"].value("steps", std::int64_t(-1));
    }
    return {std::move(opt), std::move(pos)};
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument("--resume " + path.string() + ": unreadable training state: " + e.what());
  }
}

}  // namespace detail
}  // namespace nerve::layers

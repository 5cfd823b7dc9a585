#include "layers/checkpoint/checkpoint.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <sstream>
#include <stdexcept>

namespace nerve::checkpoint {

namespace {

std::string shape_string(std::span<const std::size_t> shape) {
  std::ostringstream os;
  os << '[';
  for (std::size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

void check_count(const std::string& name, std::span<const std::size_t> shape, std::size_t count) {
  const auto need = std::accumulate(shape.begin(), shape.end(), std::size_t{1}, std::multiplies<>());
  if (need != count) {
    throw std::invalid_argument("state_dict: tensor '" + name + "' of shape " + shape_string(shape) + " needs " +
                                std::to_string(need) + " values, got " + std::to_string(count));
  }
}

}  // namespace

void state_dict::add(std::string name, std::vector<std::size_t> shape, std::vector<float> values) {
  check_count(name, shape, values.size());
  tensors_.insert_or_assign(std::move(name), state_tensor{std::move(shape), std::move(values), {}, false});
}

void state_dict::add_int64(std::string name, std::vector<std::size_t> shape, std::vector<std::int64_t> values) {
  check_count(name, shape, values.size());
  tensors_.insert_or_assign(std::move(name), state_tensor{std::move(shape), {}, std::move(values), true});
}

bool state_dict::contains(std::string_view name) const { return tensors_.find(name) != tensors_.end(); }

std::vector<std::string> state_dict::names() const {
  std::vector<std::string> out;
  for (auto& [k, _] : tensors_) out.push_back(k);
  return out;
}

const state_tensor& state_dict::at(std::string_view name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end())
    throw std::out_of_range((source.empty() ? "state_dict" : source) + ": no tensor '" + std::string(name) + "'");
  return it->second;
}

std::span<const float> state_dict::floats(std::string_view name, std::span<const std::size_t> expected_shape) const {
  const std::string src = source.empty() ? "state_dict" : source;
  auto it = tensors_.find(name);
  if (it == tensors_.end()) throw std::runtime_error(src + ": no tensor '" + std::string(name) + "'");
  const state_tensor& t = it->second;
  if (t.is_integer) throw std::runtime_error(src + ": tensor '" + std::string(name) + "' holds integers, not floats");
  if (!std::equal(t.shape.begin(), t.shape.end(), expected_shape.begin(), expected_shape.end())) {
    throw std::runtime_error(src + ": tensor '" + std::string(name) + "' has shape " + shape_string(t.shape) +
                             ", the model expects " + shape_string(expected_shape));
  }
  return t.floats;
}

void state_dict::copy_to(std::string_view name, std::span<const std::size_t> expected_shape, std::span<float> out) const {
  auto values = floats(name, expected_shape);
  if (out.size() != values.size()) {
    throw std::invalid_argument("state_dict: tensor '" + std::string(name) + "' has " + std::to_string(values.size()) +
                                " values, the destination " + std::to_string(out.size()));
  }
  std::copy(values.begin(), values.end(), out.begin());
}

void state_dict::check_names(std::span<const std::string> expected) const {
  std::vector<std::string> missing, unexpected;
  for (const auto& e : expected)
    if (!contains(e)) missing.push_back(e);
  for (auto& [k, _] : tensors_)
    if (std::find(expected.begin(), expected.end(), k) == expected.end()) unexpected.push_back(k);
  if (missing.empty() && unexpected.empty()) return;
  auto list = [](const std::vector<std::string>& v) {
    std::string s;
    for (auto& x : v) s += (s.empty() ? "'" : ", '") + x + "'";
    return s;
  };
  std::string msg = (source.empty() ? "state_dict" : source) + ": names do not match the model:";
  if (!missing.empty()) msg += " missing " + list(missing) + ";";
  if (!unexpected.empty()) msg += " unexpected " + list(unexpected) + ";";
  msg.pop_back();
  throw std::runtime_error(msg);
}

void state_dict::check_finite(std::string_view remedy) const {
  for (const auto& [name, t] : tensors_) {
    auto bad = std::find_if(t.floats.begin(), t.floats.end(), [](float v) { return !std::isfinite(v); });
    if (bad == t.floats.end()) continue;
    throw std::runtime_error((source.empty() ? "state_dict" : source) + ": tensor '" + name + "' holds " +
                             (std::isnan(*bad) ? "nan" : *bad > 0 ? "inf" : "-inf") + " at element " +
                             std::to_string(bad - t.floats.begin()) + " of " + std::to_string(t.floats.size()) +
                             ": refusing non-finite weights (" + std::string(remedy) + ")");
  }
}

void save_checkpoint(const std::filesystem::path& path, const state_dict& dict, const write_options& options) {
  std::vector<tensor_ref> refs;
  refs.reserve(dict.size());
  for (const auto& [name, t] : dict.tensors()) {
    std::vector<std::uint64_t> shape(t.shape.begin(), t.shape.end());
    refs.push_back(t.is_integer ? i64_tensor(name, std::move(shape), t.ints)
                                : f32_tensor(name, std::move(shape), t.floats));
  }
  write_safetensors(path, refs, dict.metadata, options);
}

state_dict load_checkpoint(const std::filesystem::path& path) {
  const auto file = safetensors_file::read(path);
  state_dict out;
  out.source = file.name();
  out.metadata = file.metadata();
  for (const auto& t : file.tensors()) {
    std::vector<std::size_t> shape(t.shape.begin(), t.shape.end());
    switch (t.type) {
      case dtype::f32:
      case dtype::f64:
      case dtype::f16:
      case dtype::bf16: out.add(t.name, std::move(shape), file.to_float(t)); break;
      default: out.add_int64(t.name, std::move(shape), file.to_int64(t)); break;
    }
  }
  return out;
}

}  // namespace nerve::checkpoint

#pragma once
/// \file
/// Model checkpoints: named tensors in PyTorch's names and layouts, stored as safetensors.
///
/// Names and layouts follow `torch.nn.Module.state_dict()`: `fc1.weight` is
/// out×in (row-major, as `nn.Linear` stores it), `fc1.bias` is out,
/// `conv1.weight` is out×in×kh×kw, BatchNorm has `running_mean`,
/// `running_var` and an I64 scalar `num_batches_tracked`. A file saved here
/// loads in Python with `safetensors.torch.load_file` and then
/// `model.load_state_dict(...)`, and `safetensors.torch.save_file(model.state_dict(), f)`
/// loads here.

#include "layers/checkpoint/safetensors.hpp"

#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace nerve::checkpoint {

/// One tensor of a state dict: a shape and either float or int64 values.
struct state_tensor {
  std::vector<std::size_t> shape;
  std::vector<float> floats;         ///< the values of an F32 tensor
  std::vector<std::int64_t> ints;    ///< the values of an I64 tensor (e.g. `num_batches_tracked`)
  bool is_integer = false;
};

/// Named tensors, as `model.state_dict()` in PyTorch. A value type; not thread-safe
/// for writes, any number of readers.
class state_dict {
 public:
  state_dict() = default;

  /// Adds (or replaces) a float tensor. Throws `std::invalid_argument` if the
  /// value count is not the product of `shape`.
  void add(std::string name, std::vector<std::size_t> shape, std::vector<float> values);
  /// Adds (or replaces) an int64 tensor (same checks).
  void add_int64(std::string name, std::vector<std::size_t> shape, std::vector<std::int64_t> values);

  bool contains(std::string_view name) const;
  std::size_t size() const noexcept { return tensors_.size(); }
  /// The names, sorted.
  std::vector<std::string> names() const;
  /// The tensor `name`; throws `std::out_of_range` naming the source and the tensor.
  const state_tensor& at(std::string_view name) const;
  /// All tensors by name.
  const std::map<std::string, state_tensor, std::less<>>& tensors() const noexcept { return tensors_; }

  /// The float values of `name`, checked against the shape the model expects.
  /// Throws `std::runtime_error` naming the source, the tensor and both shapes
  /// (or saying it is missing, or holds integers).
  std::span<const float> floats(std::string_view name, std::span<const std::size_t> expected_shape) const;
  /// Copies `name` into `out` after the same checks (the model's parameter buffer).
  void copy_to(std::string_view name, std::span<const std::size_t> expected_shape, std::span<float> out) const;

  /// Checks that the names are exactly `expected`, as `load_state_dict(strict=True)`
  /// does; throws `std::runtime_error` listing the missing and the unexpected names.
  void check_names(std::span<const std::string> expected) const;

  /// Throws `std::runtime_error` naming the source, the tensor, the element and its value
  /// for the first NaN or Inf among the float tensors (weights that would poison a run).
  /// `remedy` ends the message: how to load them after all.
  void check_finite(std::string_view remedy = "--allow-nonfinite loads them") const;

  /// Free-form `__metadata__` strings (e.g. the model preset, the step).
  checkpoint::metadata metadata;
  /// Where it was loaded from (used in error messages); empty for a new one.
  std::string source;

 private:
  std::map<std::string, state_tensor, std::less<>> tensors_;
};

/// Saves `dict` as F32 (floats) and I64 (ints) tensors, atomically (see `write_safetensors`).
void save_checkpoint(const std::filesystem::path& path, const state_dict& dict, const write_options& options = {});

/// Loads a safetensors checkpoint. F32 loads exactly; F64, F16 and BF16 are
/// converted to float; integer and BOOL tensors load as int64. Throws
/// `format_error` for a malformed file (see `safetensors_file::parse`).
state_dict load_checkpoint(const std::filesystem::path& path);

}  // namespace nerve::checkpoint

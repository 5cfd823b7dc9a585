#pragma once
/// \file
/// Where a node sits in a model's module tree, read from its name: PyTorch's module paths
/// (`blocks.3.attn.qkv`), which the transformer presets use for their node names.

#include <string_view>

namespace nerve::layers {

/// The repeated block a node belongs to: `blocks.3` for `blocks.3.attn` (a path whose
/// second part is a number, an entry of a PyTorch `ModuleList`); empty for any other name
/// (`wte`, `ln_f`, `fc1`). The pipeline keeps such a block on one stage where it can, and
/// the trace viewer heads its layers' lanes with it.
constexpr std::string_view block_of(std::string_view name) noexcept {
  const auto dot = name.find('.');
  if (dot == std::string_view::npos || dot == 0) return {};
  auto end = dot + 1;
  while (end < name.size() && name[end] >= '0' && name[end] <= '9') ++end;
  if (end == dot + 1 || end >= name.size() || name[end] != '.') return {};
  return name.substr(0, end);
}

static_assert(block_of("blocks.3.attn") == "blocks.3");
static_assert(block_of("blocks.12.mlp.fc") == "blocks.12");
static_assert(block_of("blocks.3").empty());  // the block itself is no layer in it
static_assert(block_of("ln_f").empty() && block_of("fc1.weight").empty() && block_of(".0.x").empty());

}  // namespace nerve::layers

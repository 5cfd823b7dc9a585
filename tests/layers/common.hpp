#pragma once
// Small functions that several of layers_test's files use, defined once here: a unity
// build (NERVE_UNITY) compiles those files as one translation unit, where a file-local
// copy in each would be a redefinition.

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <string_view>

#include "layers/loss.hpp"

namespace nerve::layers::testing {

/// Whether `part` occurs in `s` (error messages, files read back).
inline bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

/// `n` labels of ten classes, drawn from `seed`.
inline targets random_labels(std::int64_t n, std::uint64_t seed) {
  targets t;
  std::mt19937_64 rng(seed);
  for (std::int64_t i = 0; i < n; ++i) t.labels.push_back(static_cast<std::int32_t>(rng() % 10));
  return t;
}

/// The bytes of the file at `p`, as a string (empty when it cannot be read).
inline std::string contents(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

/// Writes `text` to the file at `p`, replacing what was there.
inline void put(const std::filesystem::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

}  // namespace nerve::layers::testing

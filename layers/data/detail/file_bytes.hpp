#pragma once
/// \file
/// Whole-file reads shared by the IDX and safetensors readers (not public API).

#include <cstddef>
#include <filesystem>
#include <vector>

namespace nerve::data::detail {

/// Reads the whole file at `path`; throws `std::system_error` naming the file.
std::vector<std::byte> read_file_bytes(const std::filesystem::path& path);

}  // namespace nerve::data::detail

#pragma once
/// \file
/// The CUDA backend's entry points, for backend_select.cpp. No CUDA types here.

#include "gpu/detail/backend.hpp"

#include <memory>
#include <string>

namespace nerve::gpu::detail::cuda {

int device_count() noexcept;
std::unique_ptr<backend> make_backend(int ordinal);
std::string error_text(int code);
std::string cublas_text(int code);

}  // namespace nerve::gpu::detail::cuda

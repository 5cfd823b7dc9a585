#include "gpu/status.hpp"

#include "gpu/detail/backend.hpp"

#include <string>

namespace nerve::gpu {
namespace {

class gpu_category_impl final : public std::error_category {
 public:
  const char* name() const noexcept override { return "nerve.gpu"; }
  std::string message(int v) const override {
    switch (static_cast<errc>(v)) {
      case errc::cancelled: return "cancelled: the device shut down before the work completed";
      case errc::stream_failed: return "stream failed: a host function on the stream threw";
      case errc::no_device: return "no GPU device could be opened";
      case errc::not_supported: return "not supported by this backend";
      case errc::invalid_argument: return "invalid argument";
    }
    return "unknown nerve.gpu error " + std::to_string(v);
  }
  std::error_condition default_error_condition(int v) const noexcept override {
    if (static_cast<errc>(v) == errc::cancelled) return std::errc::operation_canceled;
    if (static_cast<errc>(v) == errc::invalid_argument) return std::errc::invalid_argument;
    if (static_cast<errc>(v) == errc::not_supported) return std::errc::not_supported;
    return {v, *this};
  }
};

class cuda_category_impl final : public std::error_category {
 public:
  const char* name() const noexcept override { return "cuda"; }
  std::string message(int v) const override { return detail::cuda_error_text(v); }
};

class cublas_category_impl final : public std::error_category {
 public:
  const char* name() const noexcept override { return "cublas"; }
  std::string message(int v) const override { return detail::cublas_status_text(v); }
};

std::string describe(const std::error_code& code, const std::string& call, const char* file, int line) {
  // std::system_error appends ": " + code.message(), which names the error.
  std::string s = call.empty() ? std::string("gpu call") : call;
  if (file && *file) s += " at " + std::string(file) + ":" + std::to_string(line);
  s += " [" + std::string(code.category().name()) + " " + std::to_string(code.value()) + "]";
  return s;
}

}  // namespace

const std::error_category& gpu_category() noexcept {
  static const gpu_category_impl c;
  return c;
}
const std::error_category& cuda_category() noexcept {
  static const cuda_category_impl c;
  return c;
}
const std::error_category& cublas_category() noexcept {
  static const cublas_category_impl c;
  return c;
}
std::error_code make_error_code(errc e) noexcept { return {static_cast<int>(e), gpu_category()}; }

error::error(std::error_code code, std::string call, const char* file, int line)
    : std::system_error(code, describe(code, call, file, line)), call_(std::move(call)), file_(file), line_(line) {}

error::error(std::error_code code, const std::string& what) : std::system_error(code, what) {}

}  // namespace nerve::gpu

#pragma once
/// \file
/// Errors of `nerve::gpu`: error codes for completion handlers, and the
/// exception that the one CUDA check macro throws at the gpu/ boundary.
///
/// Completion handlers get a `std::error_code` first, Asio style. Its category
/// says where it came from:
/// - `gpu_category()`: our own conditions (`errc::cancelled` at shutdown, a failed
///   stand-in stream, no device);
/// - `cuda_category()`: a CUDA runtime error; the value is the `cudaError_t` and
///   `message()` names it, e.g. `cudaErrorIllegalAddress: an illegal memory access
///   was encountered`;
/// - `cublas_category()`: a cuBLAS status, named the same way.
/// `errc::cancelled` compares equal to `std::errc::operation_canceled`.

#include <string>
#include <system_error>

namespace nerve::gpu {

/// Conditions raised by nerve::gpu itself.
enum class errc {
  cancelled = 1,        ///< the device shut down before the work completed
  stream_failed,        ///< a stand-in stream's host function threw; later work on it is skipped
  no_device,            ///< no device could be opened
  not_supported,        ///< this backend cannot do that
  invalid_argument,     ///< a shape, size or option is wrong
};

/// The category of `errc`. Thread-safe.
const std::error_category& gpu_category() noexcept;
/// The category of CUDA runtime errors (value = `cudaError_t`). Thread-safe.
const std::error_category& cuda_category() noexcept;
/// The category of cuBLAS statuses (value = `cublasStatus_t`). Thread-safe.
const std::error_category& cublas_category() noexcept;

/// Makes an error code of `gpu_category()`.
std::error_code make_error_code(errc e) noexcept;

/// What a failed call of the gpu/ boundary throws: the code, and the call, file
/// and line where the status was checked.
class error : public std::system_error {
 public:
  /// `call` is the checked expression as written, e.g. `cudaMallocAsync(&p, n, s)`.
  error(std::error_code code, std::string call, const char* file, int line);
  /// Without a call site (for conditions nerve::gpu raises itself).
  error(std::error_code code, const std::string& what);

  const std::string& call() const noexcept { return call_; }
  const char* file() const noexcept { return file_; }
  int line() const noexcept { return line_; }

 private:
  std::string call_;
  const char* file_ = "";
  int line_ = 0;
};

}  // namespace nerve::gpu

template <>
struct std::is_error_code_enum<nerve::gpu::errc> : std::true_type {};

#pragma once
// The ops' argument check, shared by layers/ops.cpp and op_run.cpp (internal).
#include <stdexcept>
#include <string>

namespace nerve::layers::detail {

/// Throws `std::invalid_argument("ops: " + what)` unless `ok`.
inline void ops_require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("ops: " + what);
}

}  // namespace nerve::layers::detail

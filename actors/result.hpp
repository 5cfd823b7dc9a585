#pragma once
/// \file
/// `result<R>`: the answer to a request, a value or the error that replaced it.

#include <exception>
#include <optional>
#include <utility>

namespace nerve::actors {

/// A value of type R, or the error (timeout, the receiver's failure, a stopped receiver).
template <class R>
class result {
 public:
  explicit result(R v) : value_(std::move(v)) {}
  explicit result(std::exception_ptr e) : error_(std::move(e)) {}
  /// True when there is a value.
  explicit operator bool() const noexcept { return !error_; }
  /// The error; null when there is a value.
  const std::exception_ptr& error() const noexcept { return error_; }
  /// The value; rethrows the error when there is none.
  R& value() & {
    if (error_) std::rethrow_exception(error_);
    return *value_;
  }
  R&& value() && {
    if (error_) std::rethrow_exception(error_);
    return std::move(*value_);
  }
  R& operator*() & { return value(); }
  R* operator->() { return &value(); }

 private:
  std::optional<R> value_;
  std::exception_ptr error_;
};

template <>
class result<void> {
 public:
  result() = default;
  explicit result(std::exception_ptr e) : error_(std::move(e)) {}
  explicit operator bool() const noexcept { return !error_; }
  const std::exception_ptr& error() const noexcept { return error_; }
  void value() const {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::exception_ptr error_;
};

}  // namespace nerve::actors

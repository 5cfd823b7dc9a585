#pragma once
/// \file
/// A move-only `std::function` (C++23's `std::move_only_function` is not in C++20).

#include <memory>
#include <type_traits>
#include <utility>

namespace nerve::gpu::detail {

template <class Signature>
class unique_function;

/// Owns any callable with signature `R(Args...)`, move-only captures included.
/// Not thread-safe: one owner at a time, like any value.
template <class R, class... Args>
class unique_function<R(Args...)> {
 public:
  unique_function() noexcept = default;
  unique_function(std::nullptr_t) noexcept {}

  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, unique_function> &&
                                              std::is_invocable_r_v<R, std::decay_t<F>&, Args...>>>
  unique_function(F&& f) : impl_(std::make_unique<model<std::decay_t<F>>>(std::forward<F>(f))) {}

  unique_function(unique_function&&) noexcept = default;
  unique_function& operator=(unique_function&&) noexcept = default;

  /// Calls the target; calling an empty one is undefined, as for a null pointer.
  R operator()(Args... args) { return impl_->call(std::forward<Args>(args)...); }

  explicit operator bool() const noexcept { return static_cast<bool>(impl_); }

 private:
  struct concept_ {
    virtual ~concept_() = default;
    virtual R call(Args... args) = 0;
  };
  template <class F>
  struct model final : concept_ {
    explicit model(F&& f) : f_(std::move(f)) {}
    explicit model(const F& f) : f_(f) {}
    R call(Args... args) override { return f_(std::forward<Args>(args)...); }
    F f_;
  };
  std::unique_ptr<concept_> impl_;
};

}  // namespace nerve::gpu::detail

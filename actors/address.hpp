#pragma once
/// \file
/// `address`: a copyable, thread-safe handle to an actor.

#include <cstddef>
#include <functional>
#include <string_view>
#include <utility>

#include "actors/message.hpp"

namespace nerve::actors {

class actor;

namespace detail {
void retain(actor* a) noexcept;
void release(actor* a) noexcept;
}

/// A handle to an actor: send to it, compare it, keep it. Holding an address keeps the
/// actor's memory alive (so sends to a stopped actor fail cleanly with `send_status::closed`)
/// but not the actor running. Copying is thread-safe (an atomic reference count).
class address {
 public:
  address() noexcept = default;
  explicit address(actor* a) noexcept : a_(a) {
    if (a_) detail::retain(a_);
  }
  address(const address& o) noexcept : address(o.a_) {}
  address(address&& o) noexcept : a_(std::exchange(o.a_, nullptr)) {}
  address& operator=(address o) noexcept {
    std::swap(a_, o.a_);
    return *this;
  }
  ~address() {
    if (a_) detail::release(a_);
  }

  /// The actor's id; 0 for an empty address.
  actor_id id() const noexcept;
  /// The actor's name (stable for its lifetime).
  std::string_view name() const noexcept;
  /// The index of the loop the actor lives on.
  unsigned loop() const noexcept;
  /// True when the actor has stopped (or failed): sends will be refused.
  bool stopped() const noexcept;

  explicit operator bool() const noexcept { return a_ != nullptr; }
  /// The actor object. Only for the runtime and for code running on the actor's own loop.
  actor* get() const noexcept { return a_; }

  friend bool operator==(const address& a, const address& b) noexcept { return a.a_ == b.a_; }

 private:
  actor* a_ = nullptr;
};

}  // namespace nerve::actors

template <>
struct std::hash<nerve::actors::address> {
  std::size_t operator()(const nerve::actors::address& a) const noexcept {
    return std::hash<const void*>{}(a.get());
  }
};

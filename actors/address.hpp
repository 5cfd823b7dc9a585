#pragma once
/// \file
/// `address`: a copyable, thread-safe handle to an actor.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>
#include <utility>

#include "actors/message.hpp"

namespace nerve::actors {

class actor;
class runtime;

namespace detail {
/// What an address points to: the reference count of one actor, and the actor while it
/// exists. The cell outlives the actor when addresses outlive its runtime: the runtime
/// destroys every actor it spawned when it is destroyed (which frees actors that hold
/// each other's addresses: a pipeline's neighbours, a layer and its consumers), and an
/// address left over then reads as stopped.
struct actor_cell {
  std::atomic<std::uint32_t> refs{0};
  std::atomic<actor*> self{nullptr};          ///< null once the actor was destroyed
  std::atomic<runtime*> owner{nullptr};       ///< the runtime whose list holds the cell
  actor_cell* prev = nullptr;                 ///< that list, under the runtime's lock
  actor_cell* next = nullptr;
};
actor_cell* cell_of(actor* a) noexcept;
inline void retain(actor_cell* c) noexcept { c->refs.fetch_add(1, std::memory_order_relaxed); }
void release(actor_cell* c) noexcept;
/// Destroys a spawned actor and frees its storage (its runtime's arena, or the heap).
void destroy_actor(actor* a) noexcept;
/// The actor goes (unless its runtime already destroyed it), then the cell: the last
/// release, or the end of the drain of an actor it left doomed (`actor::doom`).
void destroy_cell(actor_cell* c) noexcept;
}  // namespace detail

/// A handle to an actor: send to it, compare it, keep it. Holding an address keeps the
/// actor's memory alive (so sends to a stopped actor fail cleanly with `send_status::closed`)
/// but not the actor running, and not beyond its runtime: when the runtime is destroyed it
/// destroys its actors, and an address still held reads as stopped with an empty `get()`.
/// Copying is thread-safe (an atomic reference count).
class address {
 public:
  address() noexcept = default;
  explicit address(actor* a) noexcept : c_(a ? detail::cell_of(a) : nullptr) {
    if (c_) detail::retain(c_);
  }
  address(const address& o) noexcept : c_(o.c_) {
    if (c_) detail::retain(c_);
  }
  address(address&& o) noexcept : c_(std::exchange(o.c_, nullptr)) {}
  address& operator=(address o) noexcept {
    std::swap(c_, o.c_);
    return *this;
  }
  ~address() {
    if (c_) detail::release(c_);
  }

  /// The actor's id; 0 for an empty address.
  actor_id id() const noexcept;
  /// The actor's name (stable for its lifetime).
  std::string_view name() const noexcept;
  /// The index of the loop the actor lives on.
  unsigned loop() const noexcept;
  /// True when the actor has stopped (or failed): sends will be refused.
  bool stopped() const noexcept;

  explicit operator bool() const noexcept { return c_ != nullptr; }
  /// The actor object (null once its runtime was destroyed). Only for the runtime and for
  /// code running on the actor's own loop.
  actor* get() const noexcept { return c_ ? c_->self.load(std::memory_order_relaxed) : nullptr; }

  /// Stable for the address's lifetime (the actor's cell): for hashing.
  const void* identity() const noexcept { return c_; }

  friend bool operator==(const address& a, const address& b) noexcept { return a.c_ == b.c_; }

 private:
  detail::actor_cell* c_ = nullptr;
};

}  // namespace nerve::actors

template <>
struct std::hash<nerve::actors::address> {
  std::size_t operator()(const nerve::actors::address& a) const noexcept {
    return std::hash<const void*>{}(a.identity());
  }
};

#pragma once
/// \file
/// `signal<T>`: a named, typed output of an actor. Emitting delivers the value to every
/// subscriber's mailbox: a clone to all but the last, which gets the value moved.
///
/// ```
///   fc1.out ──┬── port 0 ──► relu1          (clone)
///             └── port 1 ──► add1           (moved)
///   add1.grad[1] ── port 1 ──► fc1          (the gradient back up the same edge)
/// ```
/// A subscription is an edge: the subscriber and the *port* it arrives on. When T has a
/// `std::uint32_t port` member, delivery stamps it with the subscription's port, so one
/// output can feed several inputs of one consumer (both inputs of an Add) and the
/// receiver knows which. Values with a `clone()` member (tensors, messages that hold
/// them) are cloned with it; others are copied.
///
/// **Delivery.** In process, a delivery is a send into the subscriber's mailbox (normal
/// lane). A subscription may instead name an `endpoint<T>`: the seam where a transport
/// that leaves the process (MPI, bus/ of a later issue) takes the value; layers never
/// see the difference. Every delivery, local or through an endpoint, is counted
/// (`deliveries()`), so tests can assert exactly what crossed the bus.
///
/// Wiring happens before data flows: `subscribe` checks that the subscriber has a handler
/// for T, so a type mismatch is a `wiring_error` at wiring time, not a silent drop; emitting
/// on a signal with no subscribers is a `wiring_error` too.
///
/// Thread-safety: `subscribe` at wiring time (before messages flow, from any one thread);
/// `emit` from the owning actor's handlers only; `deliveries()` from any thread (a count
/// read while the owner emits may be behind by the emits in flight).

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "actors/actor.hpp"
#include "actors/errors.hpp"

namespace nerve::bus {

/// A subscriber reached through a transport instead of a local mailbox. `deliver` runs
/// on the emitting actor's loop, with the value already stamped with its port.
template <class T>
class endpoint {
 public:
  virtual ~endpoint() = default;
  /// Takes `value` away (into a send buffer, onto a wire). Throws to fail the emitter.
  virtual void deliver(actors::actor& from, T&& value) = 0;
  /// How errors and traces name the far end (`"rank 1: fc2"`).
  virtual std::string name() const = 0;
};

/// Untyped part of a signal (name, owner, subscriptions' addresses and ports, count).
class signal_base {
 public:
  signal_base(actors::actor& owner, std::string name) : owner_(&owner), name_(std::move(name)) {}
  signal_base(const signal_base&) = delete;
  signal_base& operator=(const signal_base&) = delete;

  /// "owner.signal", as errors and traces show it.
  std::string full_name() const { return owner_->name() + "." + name_; }
  const std::string& name() const noexcept { return name_; }
  std::size_t subscribers() const noexcept { return ports_.size(); }
  /// The local subscribers' addresses (an empty address where a subscription is an endpoint).
  const std::vector<actors::address>& targets() const noexcept { return subs_; }
  /// The port of each subscription, in subscription order.
  const std::vector<std::uint32_t>& ports() const noexcept { return ports_; }
  /// Values delivered so far (one per subscriber per emit).
  std::uint64_t deliveries() const noexcept { return delivered_.load(std::memory_order_relaxed); }

 protected:
  void add(const actors::address& to, std::uint32_t port, const actors::type_tag* tag);
  void add_endpoint(std::uint32_t port);
  [[noreturn]] void throw_unwired(const actors::type_tag* tag) const;
  // One writer (the owner's loop): a load and a store, not a locked read-modify-write.
  void count(std::size_t n) noexcept {
    delivered_.store(delivered_.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }

  actors::actor* owner_;
  std::string name_;
  std::vector<actors::address> subs_;
  std::vector<std::uint32_t> ports_;
  std::atomic<std::uint64_t> delivered_{0};
};

namespace detail {
template <class T>
concept has_port = requires(T& v) { v.port = std::uint32_t{}; };
template <class T>
concept has_clone = requires(const T& v) {
  { v.clone() } -> std::convertible_to<T>;
};
template <class T>
T duplicate(const T& v) {
  if constexpr (has_clone<T>)
    return v.clone();
  else
    return T(v);
}
}  // namespace detail

template <class T>
class signal : public signal_base {
 public:
  /// `owner` is the actor that emits; the signal must not outlive it.
  signal(actors::actor& owner, std::string name) : signal_base(owner, std::move(name)) {}

  /// Wiring: adds a subscriber on `port`. Throws `wiring_error` if `to` has no handler for
  /// T or is already subscribed on that port.
  void subscribe(const actors::address& to, std::uint32_t port = 0) {
    add(to, port, actors::tag_of<T>());
    remote_.emplace_back();
  }
  /// Wiring: adds a subscriber behind a transport (`e` takes every value emitted).
  void subscribe(std::shared_ptr<endpoint<T>> e, std::uint32_t port = 0) {
    if (!e) throw actors::wiring_error("signal '" + full_name() + "': subscribe with a null endpoint");
    add_endpoint(port);
    remote_.push_back(std::move(e));
  }

  /// From the owner's handlers: delivers `value` to every subscriber (normal lane; a local
  /// one that is full or stopped throws `send_error`, which fails the owner — bound the
  /// flow upstream with credits).
  void emit(T value) {
    const std::size_t n = ports_.size();
    if (n == 0) throw_unwired(actors::tag_of<T>());
    for (std::size_t i = 0; i + 1 < n; ++i) deliver(i, detail::duplicate(value));
    deliver(n - 1, std::move(value));
    count(n);
  }

 private:
  void deliver(std::size_t i, T&& v) {
    if constexpr (detail::has_port<T>) v.port = ports_[i];
    if (remote_[i])
      remote_[i]->deliver(*owner_, std::move(v));
    else
      owner_->send(subs_[i], std::move(v));
  }

  std::vector<std::shared_ptr<endpoint<T>>> remote_;  // null where the subscriber is local
};

}  // namespace nerve::bus

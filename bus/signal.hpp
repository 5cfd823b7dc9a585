#pragma once
/// \file
/// `signal<T>`: a named, typed output of an actor. Emitting delivers the value to every
/// subscriber's mailbox: copies to all but the last, which gets the value moved. For large
/// payloads shared read-only by several consumers, use `T = std::shared_ptr<const X>`.
///
/// Wiring happens before data flows: `subscribe` checks that the subscriber has a handler
/// for T, so a type mismatch is a `wiring_error` at wiring time, not a silent drop; emitting
/// on a signal with no subscribers is a `wiring_error` too.
///
/// Thread-safety: `subscribe` at wiring time (before messages flow, from any one thread);
/// `emit` from the owning actor's handlers only.

#include <string>
#include <vector>

#include "actors/actor.hpp"
#include "actors/errors.hpp"

namespace nerve::bus {

/// Untyped part of a signal (name, owner, subscribers).
class signal_base {
 public:
  signal_base(actors::actor& owner, std::string name) : owner_(&owner), name_(std::move(name)) {}
  /// "owner.signal", as errors and traces show it.
  std::string full_name() const { return owner_->name() + "." + name_; }
  const std::string& name() const noexcept { return name_; }
  std::size_t subscribers() const noexcept { return subs_.size(); }
  const std::vector<actors::address>& targets() const noexcept { return subs_; }

 protected:
  void add(const actors::address& to, const actors::type_tag* tag);
  [[noreturn]] void throw_unwired(const actors::type_tag* tag) const;

  actors::actor* owner_;
  std::string name_;
  std::vector<actors::address> subs_;
};

template <class T>
class signal : public signal_base {
 public:
  /// `owner` is the actor that emits; the signal must not outlive it.
  signal(actors::actor& owner, std::string name) : signal_base(owner, std::move(name)) {}

  /// Wiring: adds a subscriber. Throws `wiring_error` if `to` has no handler for T or is
  /// already subscribed.
  void subscribe(const actors::address& to) { add(to, actors::tag_of<T>()); }

  /// From the owner's handlers: delivers `value` to every subscriber (normal lane; throws
  /// `send_error` if one is full or stopped, which fails the owner — use credits upstream).
  void emit(T value) {
    if (subs_.empty()) throw_unwired(actors::tag_of<T>());
    for (std::size_t i = 0; i + 1 < subs_.size(); ++i) owner_->send(subs_[i], T(value));
    owner_->send(subs_.back(), std::move(value));
  }
};

}  // namespace nerve::bus

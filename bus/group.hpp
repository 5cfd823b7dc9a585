#pragma once
/// \file
/// `group`: a named, ordered set of actors (a network, a pipeline stage, the replicas of
/// data parallelism) with collective operations: broadcast, scatter, gather, all-reduce.
///
/// A member's rank is its position in the group. Collectives are sent by a *sender*: an
/// actor (from its handlers) or the runtime (from outside); both have `send(address, T)`.
/// Thread-safety: build the group at wiring time; afterwards it is read-only and may be
/// used from any thread.

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/runtime.hpp"

namespace nerve::bus {

template <class S, class T>
concept message_sender = requires(S& s, const actors::address& a, T m) { s.send(a, std::move(m)); };

class group {
 public:
  explicit group(std::string name, std::vector<actors::address> members = {});

  const std::string& name() const noexcept { return name_; }
  std::size_t size() const noexcept { return members_.size(); }
  const std::vector<actors::address>& members() const noexcept { return members_; }
  const actors::address& operator[](std::size_t rank) const { return members_.at(rank); }
  /// Adds a member (rank = the current size). Throws `wiring_error` on duplicates.
  void add(const actors::address& a);
  /// The rank of `a`, or -1.
  int rank_of(const actors::address& a) const noexcept;
  /// Throws `wiring_error` naming the first member without a handler for `tag`.
  void require_handler(const actors::type_tag* tag) const;

  /// Sends a copy of `msg` to every member.
  template <class T, message_sender<T> S>
  void broadcast(S& from, const T& msg) const {
    require_nonempty("broadcast");
    for (auto& m : members_) from.send(m, T(msg));
  }

  /// Sends `parts[r]` to the member of rank r. `parts.size()` must equal `size()`.
  template <class T, message_sender<T> S>
  void scatter(S& from, std::vector<T> parts) const {
    require_nonempty("scatter");
    if (parts.size() != members_.size())
      throw actors::wiring_error("group '" + name_ + "': scatter of " + std::to_string(parts.size()) +
                                 " parts to " + std::to_string(members_.size()) + " members");
    for (std::size_t r = 0; r < parts.size(); ++r) from.send(members_[r], std::move(parts[r]));
  }

  /// From an actor's handler: sends `req` to every member as a request; once all answered,
  /// `done(std::vector<actors::result<R>>)` runs on `self`'s loop, results in rank order.
  template <class R, class T, class F>
  void gather(actors::actor& self, const T& req, std::chrono::nanoseconds timeout, F&& done) const {
    require_nonempty("gather");
    struct state {
      std::vector<std::optional<actors::result<R>>> got;
      std::size_t left;
      std::decay_t<F> done;
    };
    auto st = std::make_shared<state>(state{std::vector<std::optional<actors::result<R>>>(members_.size()),
                                            members_.size(), std::forward<F>(done)});
    for (std::size_t r = 0; r < members_.size(); ++r) {
      self.request<R>(members_[r], T(req), timeout, [st, r](actors::result<R> res) {
        st->got[r].emplace(std::move(res));
        if (--st->left == 0) {
          std::vector<actors::result<R>> out;
          out.reserve(st->got.size());
          for (auto& g : st->got) out.push_back(std::move(*g));
          st->done(std::move(out));
        }
      });
    }
  }

  /// From outside the runtime: asks every member and waits; results in rank order.
  /// Rethrows the first error (timeout, a member's failure).
  template <class R, class T>
  std::vector<R> gather(actors::runtime& rt, const T& req, std::chrono::nanoseconds timeout) const {
    require_nonempty("gather");
    std::vector<std::future<R>> fs;
    for (auto& m : members_) fs.push_back(rt.ask<R>(m, T(req), timeout));
    std::vector<R> out;
    for (auto& f : fs) out.push_back(f.get());
    return out;
  }

 private:
  void require_nonempty(const char* op) const;
  std::string name_;
  std::vector<actors::address> members_;
};

}  // namespace nerve::bus

#pragma once
/// \file
/// All-reduce (sum of float buffers) over a group, in process.
///
/// Members send `contribution`s to the `all_reduce` actor; each round is named by a key the
/// members agree on (e.g. step * buckets + bucket), so several rounds (gradient buckets)
/// can be in flight at once and start while backward is still running. When all members
/// have contributed to a key, the actor sums the buffers in rank order (so the result is
/// the same bits whatever the arrival order) and sends every member a `reduced` message
/// holding one shared, read-only sum.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "actors/actor.hpp"
#include "bus/group.hpp"

namespace nerve::bus {

/// Member `rank`'s buffer for round `key`.
struct contribution {
  static constexpr std::string_view kind = "contribution";
  std::uint64_t key = 0;
  unsigned rank = 0;
  std::vector<float> data;
  std::size_t payload_bytes() const noexcept { return data.size() * sizeof(float); }
};

/// The element-wise sum of round `key`, sent to every member.
struct reduced {
  static constexpr std::string_view kind = "reduced";
  std::uint64_t key = 0;
  std::shared_ptr<const std::vector<float>> sum;
  std::size_t payload_bytes() const noexcept { return sum ? sum->size() * sizeof(float) : 0; }
};

class all_reduce : public actors::actor {
 public:
  /// `members` must all handle `reduced` (checked here: spawn the members first).
  all_reduce(std::string name, group members);

  /// Rounds completed so far (read after `synchronize`).
  std::uint64_t rounds() const noexcept { return rounds_; }

 private:
  void on_contribution(contribution& c);

  group members_;
  struct round {
    std::vector<std::vector<float>> parts;
    std::vector<char> have;
    std::size_t got = 0;
  };
  std::map<std::uint64_t, round> open_;
  std::uint64_t rounds_ = 0;
};

}  // namespace nerve::bus

#include "bus/group.hpp"

namespace nerve::bus {

group::group(std::string name, std::vector<actors::address> members) : name_(std::move(name)) {
  for (auto& m : members) add(m);
}

void group::add(const actors::address& a) {
  if (!a) throw actors::wiring_error("group '" + name_ + "': add of an empty address");
  if (rank_of(a) >= 0)
    throw actors::wiring_error("group '" + name_ + "': actor '" + std::string(a.name()) + "' is already a member");
  members_.push_back(a);
}

int group::rank_of(const actors::address& a) const noexcept {
  for (std::size_t i = 0; i < members_.size(); ++i)
    if (members_[i] == a) return static_cast<int>(i);
  return -1;
}

void group::require_handler(const actors::type_tag* tag) const {
  for (auto& m : members_)
    if (!m.get()->accepts(tag))
      throw actors::wiring_error("group '" + name_ + "': member '" + std::string(m.name()) + "' has no handler for '" +
                                 std::string(tag->name) + "'");
}

void group::require_nonempty(const char* op) const {
  if (members_.empty()) throw actors::wiring_error("group '" + name_ + "': " + op + " on an empty group");
}

}  // namespace nerve::bus

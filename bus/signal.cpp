#include "bus/signal.hpp"

namespace nerve::bus {

void signal_base::add(const actors::address& to, const actors::type_tag* tag) {
  if (!to) throw actors::wiring_error("signal '" + full_name() + "': subscribe with an empty address");
  if (!to.get()->accepts(tag))
    throw actors::wiring_error("signal '" + full_name() + "' carries '" + std::string(tag->name) + "' but actor '" +
                               std::string(to.name()) + "' has no handler for it");
  for (auto& s : subs_)
    if (s == to)
      throw actors::wiring_error("signal '" + full_name() + "': actor '" + std::string(to.name()) +
                                 "' is already subscribed");
  subs_.push_back(to);
}

void signal_base::throw_unwired(const actors::type_tag* tag) const {
  throw actors::wiring_error("signal '" + full_name() + "' emitted '" + std::string(tag->name) +
                             "' but has no subscribers");
}

}  // namespace nerve::bus

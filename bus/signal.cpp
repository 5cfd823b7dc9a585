#include "bus/signal.hpp"

namespace nerve::bus {

void signal_base::add(const actors::address& to, std::uint32_t port, const actors::type_tag* tag) {
  if (!to) throw actors::wiring_error("signal '" + full_name() + "': subscribe with an empty address");
  if (!to.get()->accepts(tag))
    throw actors::wiring_error("signal '" + full_name() + "' carries '" + std::string(tag->name) + "' but actor '" +
                               std::string(to.name()) + "' has no handler for it");
  for (std::size_t i = 0; i < subs_.size(); ++i)
    if (subs_[i] == to && ports_[i] == port)
      throw actors::wiring_error("signal '" + full_name() + "': actor '" + std::string(to.name()) +
                                 "' is already subscribed on port " + std::to_string(port));
  subs_.push_back(to);
  ports_.push_back(port);
}

void signal_base::add_endpoint(std::uint32_t port) {
  subs_.emplace_back();
  ports_.push_back(port);
}

void signal_base::throw_unwired(const actors::type_tag* tag) const {
  throw actors::wiring_error("signal '" + full_name() + "' emitted '" + std::string(tag->name) +
                             "' but has no subscribers");
}

}  // namespace nerve::bus

#include "bus/all_reduce.hpp"

namespace nerve::bus {

all_reduce::all_reduce(std::string name, group members) : actor(std::move(name)), members_(std::move(members)) {
  if (members_.size() == 0) throw actors::wiring_error("all_reduce '" + this->name() + "' over an empty group");
  members_.require_handler(actors::tag_of<reduced>());
  on<contribution>([this](contribution& c) { on_contribution(c); });
}

void all_reduce::on_contribution(contribution& c) {
  const auto n = members_.size();
  if (c.rank >= n)
    throw std::invalid_argument("all_reduce '" + name() + "': rank " + std::to_string(c.rank) + " in a group of " +
                                std::to_string(n));
  auto& r = open_[c.key];
  if (r.parts.empty()) {
    r.parts.resize(n);
    r.have.assign(n, 0);
  }
  if (r.have[c.rank])
    throw std::invalid_argument("all_reduce '" + name() + "': rank " + std::to_string(c.rank) +
                                " contributed twice to round " + std::to_string(c.key));
  for (std::size_t k = 0; k < n; ++k)
    if (r.have[k] && r.parts[k].size() != c.data.size())
      throw std::invalid_argument("all_reduce '" + name() + "': round " + std::to_string(c.key) + " got buffers of " +
                                  std::to_string(r.parts[k].size()) + " and " + std::to_string(c.data.size()) + " floats");
  r.parts[c.rank] = std::move(c.data);
  r.have[c.rank] = 1;
  if (++r.got < n) return;

  // Rank order, whatever the arrival order: every run gives the same bits.
  auto sum = std::make_shared<std::vector<float>>(std::move(r.parts[0]));
  for (std::size_t k = 1; k < n; ++k) {
    const auto& p = r.parts[k];
    for (std::size_t i = 0; i < sum->size(); ++i) (*sum)[i] += p[i];
  }
  std::shared_ptr<const std::vector<float>> shared = std::move(sum);
  const auto key = c.key;
  open_.erase(key);
  ++rounds_;
  for (auto& m : members_.members()) send(m, reduced{key, shared});
}

}  // namespace nerve::bus

#include "bus/mpi/all_reduce.hpp"

#include <stdexcept>

#include "actors/runtime.hpp"

namespace nerve::bus::mpi {

all_reduce::all_reduce(std::string name, transport& t, transport::channel ch, std::vector<int> ranks,
                       std::uint32_t me, actors::address local)
    : actor(std::move(name)), t_(t), ch_(ch), ranks_(std::move(ranks)), me_(me), local_(std::move(local)) {
  if (me_ >= ranks_.size())
    throw actors::wiring_error("mpi all_reduce '" + this->name() + "': member " + std::to_string(me_) + " of " +
                               std::to_string(ranks_.size()));
  if (ranks_[me_] != t_.rank())
    throw actors::wiring_error("mpi all_reduce '" + this->name() + "': member " + std::to_string(me_) +
                               " is on rank " + std::to_string(ranks_[me_]) + ", not on this rank " +
                               std::to_string(t_.rank()));
  for (auto r : ranks_)
    if (r < 0 || r >= t_.size())
      throw actors::wiring_error("mpi all_reduce '" + this->name() + "': rank " + std::to_string(r) + " of " +
                                 std::to_string(t_.size()));
  on<contribution>([this](contribution& c) {
    if (c.rank != me_)
      throw std::invalid_argument("mpi all_reduce '" + this->name() + "': a local contribution from member " +
                                  std::to_string(c.rank) + " (this rank's member is " + std::to_string(me_) + ")");
    auto data = std::make_shared<std::vector<float>>(std::move(c.data));
    for (std::uint32_t m = 0; m < ranks_.size(); ++m)
      if (m != me_) t_.send(this, ranks_[m], ch_, reduce_part{c.key, me_, data});  // the buffer itself goes
    add(c.key, me_, std::move(data));
  });
  on<reduce_part>([this](reduce_part& p) {
    if (p.member >= ranks_.size() || p.member == me_)
      throw std::invalid_argument("mpi all_reduce '" + this->name() + "': a part from member " + std::to_string(p.member) +
                                  " of " + std::to_string(ranks_.size()) + " over the wire");
    add(p.key, p.member, std::move(p.data));
  });
}

actors::address spawn_all_reduce(actors::runtime& rt, unsigned loop, transport& t, transport::channel ch,
                                 std::vector<int> ranks, std::uint32_t me, actors::address local, std::string name) {
  auto a = rt.spawn_on<all_reduce>(loop, std::move(name), t, ch, std::move(ranks), me, std::move(local));
  t.listen<reduce_part>(ch, a);
  return a;
}

void all_reduce::add(std::uint64_t key, std::uint32_t member, std::shared_ptr<std::vector<float>> data) {
  const auto n = ranks_.size();
  auto& r = open_[key];
  if (r.parts.empty()) r.parts.resize(n);
  if (r.parts[member])
    throw std::invalid_argument("mpi all_reduce '" + name() + "': member " + std::to_string(member) +
                                " contributed twice to round " + std::to_string(key));
  for (auto& p : r.parts)
    if (p && p->size() != data->size())
      throw std::invalid_argument("mpi all_reduce '" + name() + "': round " + std::to_string(key) +
                                  " got buffers of " + std::to_string(p->size()) + " and " +
                                  std::to_string(data->size()) + " floats");
  r.parts[member] = std::move(data);
  if (++r.got < n) return;
  // Member order from member 0's part, as bus::all_reduce sums: the same bits. This rank's
  // own part may still be on its way out (shared with a send), but a part that came over
  // the wire is this actor's alone, and member 0's or 1's is one of them: the sum goes into
  // it (each element read before it is written) instead of a fresh buffer each round.
  // (A group of one sends nothing: its own part is the sum.)
  auto sum = std::move(r.parts[n == 1 || me_ != 0 ? 0 : 1]);
  if (n > 1) {
    const float* p0 = r.parts[0] ? r.parts[0]->data() : sum->data();
    const float* p1 = r.parts[1] ? r.parts[1]->data() : sum->data();
    float* out = sum->data();
    const std::size_t count = sum->size();
    for (std::size_t i = 0; i < count; ++i) out[i] = p0[i] + p1[i];
    for (std::size_t k = 2; k < n; ++k) {
      const float* p = r.parts[k]->data();
      for (std::size_t i = 0; i < count; ++i) out[i] += p[i];
    }
  }
  open_.erase(key);
  ++rounds_;
  send(local_, reduced{key, std::shared_ptr<const std::vector<float>>(std::move(sum))});
}

}  // namespace nerve::bus::mpi

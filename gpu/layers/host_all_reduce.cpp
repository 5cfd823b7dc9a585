#include "gpu/layers/host_all_reduce.hpp"

#include "bus/all_reduce.hpp"
#include "gpu/layers/device_all_reduce.hpp"
#include "gpu/status.hpp"

#include <algorithm>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <utility>

namespace nerve::gpu {

host_all_reduce::host_all_reduce(std::string name, actors::address local, std::uint32_t me, device& dev, stream s)
    : actor(std::move(name)), local_(std::move(local)), me_(me), s_(std::move(s)), pool_(dev) {
  on<layers::device_contribution>([this](layers::device_contribution& c) { on_contribution(c); });
  on<bus::reduced>([this](bus::reduced& m) { on_reduced(m); });
  on<layers::backend_done>([](layers::backend_done& d) { layers::handle_backend_done(d); });
}

void host_all_reduce::on_contribution(layers::device_contribution& c) {
  if (c.rank != me_)
    throw std::invalid_argument("host all-reduce '" + name() + "': a contribution from member " +
                                std::to_string(c.rank) + " (this rank's member is " + std::to_string(me_) + ")");
  if (!ranks_) throw std::logic_error("host all-reduce '" + name() + "': no all-reduce across the ranks to send to");
  auto* g = dynamic_cast<device_gradients*>(c.grads.get());
  if (!g) throw std::logic_error("host all-reduce '" + name() + "': a contribution that is not on a device");
  // The member's gradients are complete once its event is: copy them, end to end in
  // parameter order, into a pinned block, then hand the floats to the ranks' all-reduce.
  const std::size_t n = g->floats();
  s_.wait(g->ready);
  auto block = std::make_shared<pinned_buffer>(pool_.take(n * sizeof(float)));
  std::size_t at = 0;
  for (auto& [p, count] : g->parts) {
    copy_async(s_, block->as<float>().data() + at, p, count * sizeof(float));
    at += count;
  }
  after_stream(*this, s_, "host all-reduce", [this, key = c.key, n, block] {
    const auto* f = block->as<float>().data();
    send(ranks_, bus::contribution{key, me_, std::vector<float>(f, f + n)});
    pool_.give(std::move(*block));
  }, {g->ready});
}

void host_all_reduce::on_reduced(bus::reduced& m) {
  const std::size_t n = m.sum->size();
  auto block = std::make_shared<pinned_buffer>(pool_.take(n * sizeof(float)));
  std::memcpy(block->data(), m.sum->data(), n * sizeof(float));
  auto out = std::make_shared<device_sum>();
  out->sum = std::make_shared<device_tensor>(s_, shape_t{std::max<std::size_t>(n, 1)});
  copy_async(s_, out->sum->data(), block->data(), n * sizeof(float));
  out->ready = s_.record();
  ++rounds_;
  send(local_, layers::device_reduced{m.key, std::move(out)});
  after_stream(*this, s_, "host all-reduce", [this, block] { pool_.give(std::move(*block)); });
}

}  // namespace nerve::gpu

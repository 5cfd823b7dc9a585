#include "gpu/layers/nccl_all_reduce.hpp"

#include "gpu/layers/device_all_reduce.hpp"
#include "gpu/status.hpp"

#include <stdexcept>

namespace nerve::gpu {

nccl_all_reduce::nccl_all_reduce(std::string name, bus::group members, std::vector<device*> devices,
                                 std::vector<stream> streams)
    : actor(std::move(name)), members_(std::move(members)), streams_(std::move(streams)) {
  if (members_.size() != devices.size() || streams_.size() != devices.size())
    throw actors::wiring_error("nccl_all_reduce '" + this->name() + "': " + std::to_string(members_.size()) +
                               " members on " + std::to_string(devices.size()) + " devices");
  members_.require_handler(actors::tag_of<layers::device_reduced>());
  comms_ = std::make_unique<nccl_comms>(devices);
  on<layers::device_contribution>([this](layers::device_contribution& c) { on_contribution(c); });
  on<layers::backend_done>([](layers::backend_done& d) { layers::handle_backend_done(d); });
}

void nccl_all_reduce::on_contribution(layers::device_contribution& c) {
  const auto n = members_.size();
  if (c.rank >= n)
    throw std::invalid_argument("nccl_all_reduce '" + name() + "': rank " + std::to_string(c.rank) + " in a group of " +
                                std::to_string(n));
  if (!dynamic_cast<device_gradients*>(c.grads.get()))
    throw std::logic_error("nccl_all_reduce '" + name() + "': a contribution that is not on a device");
  auto& r = open_[c.key];
  if (r.parts.empty()) r.parts.resize(n);
  if (r.parts[c.rank])
    throw std::invalid_argument("nccl_all_reduce '" + name() + "': rank " + std::to_string(c.rank) +
                                " contributed twice to round " + std::to_string(c.key));
  r.parts[c.rank] = std::move(c.grads);
  if (++r.got < n) return;

  auto parts = std::move(r.parts);
  open_.erase(c.key);
  std::vector<std::vector<std::pair<float*, std::size_t>>> buffers;
  std::vector<event> waited;
  for (std::size_t k = 0; k < n; ++k) {
    auto& g = static_cast<device_gradients&>(*parts[k]);
    streams_[k].wait(g.ready);
    waited.push_back(g.ready);
    buffers.push_back(g.parts);
  }
  comms_->all_reduce_sum(streams_, buffers);
  ++rounds_;
  for (std::size_t k = 0; k < n; ++k) {
    auto out = std::make_shared<device_sum>();
    out->in_place = true;
    out->ready = streams_[k].record();
    streams_[k].async_wait(executor(), [to = self(), keep = waited](std::error_code ec) {
      auto* a = to.get();
      if (!ec || !a) return;
      auto err = std::make_exception_ptr(error(ec, "NCCL all-reduce: '" + a->name() + "'"));
      (void)a->try_tell(layers::backend_done{std::move(err), [] {}}, actors::lane::urgent);
    });
    send(members_.members()[k], layers::device_reduced{c.key, std::move(out)});
  }
}

}  // namespace nerve::gpu

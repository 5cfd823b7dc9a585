#include "gpu/layers/nccl_all_reduce.hpp"

#include "gpu/layers/device_all_reduce.hpp"
#include "gpu/status.hpp"

#include <stdexcept>
#include <utility>

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

nccl_rank_group::nccl_rank_group(device& dev, std::uint32_t members, std::uint32_t me, const std::string& id, stream s)
    : id_(id), me_(me), s_(std::move(s)) {
  try {
    comms_ = std::make_unique<nccl_comms>(dev, int(members), int(me), id);
  } catch (const error& e) {
    throw error(e.code(), "NCCL across ranks: member " + std::to_string(me) + " of " + std::to_string(members) +
                              " on " + dev.name() + " (CUDA device " + std::to_string(dev.ordinal()) +
                              ") could not join its replicas' communicator: " + e.what() +
                              " (NCCL takes one GPU per rank: two ranks on one GPU are refused; give each rank its "
                              "own, e.g. with --devices or CUDA_VISIBLE_DEVICES)");
  }
}

void nccl_rank_group::ready(std::uint64_t key, std::size_t layer, std::function<void()> issue) {
  if (layer >= layers_) throw std::logic_error("nccl_rank_group: layer " + std::to_string(layer) + " was not added");
  if (!waiting_.empty() && issued_ > 0 && key < waiting_.begin()->first)
    throw std::logic_error("nccl_rank_group: round " + std::to_string(key) + " arrived after round " +
                           std::to_string(waiting_.begin()->first) + " began");
  auto& round = waiting_[key];
  if (round.empty()) round.resize(layers_);
  if (round[layer]) throw std::invalid_argument("nccl_rank_group: layer " + std::to_string(layer) + " twice in round " +
                                                std::to_string(key));
  round[layer] = std::move(issue);
  // The oldest round first, its layers last to first: the order on every rank.
  while (!waiting_.empty()) {
    auto& oldest = waiting_.begin()->second;
    auto& next = oldest[layers_ - 1 - issued_];
    if (!next) return;
    auto run = std::exchange(next, nullptr);
    if (++issued_ == layers_) {
      waiting_.erase(waiting_.begin());
      issued_ = 0;
    }
    run();
  }
}

nccl_all_reduce::nccl_all_reduce(std::string name, actors::address local, std::shared_ptr<nccl_rank_group> group)
    : actor(std::move(name)), members_(this->name() + " (this rank's member)"), group_(std::move(group)) {
  members_.add(std::move(local));
  members_.require_handler(actors::tag_of<layers::device_reduced>());
  layer_ = group_->add_layer();
  on<layers::device_contribution>([this](layers::device_contribution& c) { on_rank_contribution(c); });
  on<layers::backend_done>([](layers::backend_done& d) { layers::handle_backend_done(d); });
}

void nccl_all_reduce::on_rank_contribution(layers::device_contribution& c) {
  if (c.rank != group_->me())
    throw std::invalid_argument("nccl_all_reduce '" + name() + "': a contribution from member " +
                                std::to_string(c.rank) + " (this rank's member is " + std::to_string(group_->me()) + ")");
  if (!dynamic_cast<device_gradients*>(c.grads.get()))
    throw std::logic_error("nccl_all_reduce '" + name() + "': a contribution that is not on a device");
  // Enqueued in the group's order, maybe from another of its reducers' handlers (same
  // loop): the stream work there, the answer to the member from this actor.
  group_->ready(c.key, layer_, [this, key = c.key, grads = std::move(c.grads)] {
    auto& g = static_cast<device_gradients&>(*grads);
    auto& s = group_->reduce_stream();
    s.wait(g.ready);
    group_->comms().all_reduce_sum({s}, {g.parts});
    auto out = std::make_shared<device_sum>();
    out->in_place = true;
    out->ready = s.record();
    post([this, key, out, keep = g.ready]() mutable {
      ++rounds_;
      after_stream(*this, group_->reduce_stream(), "NCCL all-reduce", {}, {std::move(keep)});
      send(members_.members()[0], layers::device_reduced{key, std::move(out)});
    });
  });
}

void nccl_all_reduce::on_contribution(layers::device_contribution& c) {
  const auto parts = open_.add("nccl_all_reduce", name(), members_.size(), c, false);
  if (parts.empty()) return;
  const auto n = parts.size();
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
    after_stream(*this, streams_[k], "NCCL all-reduce", {}, waited);
    send(members_.members()[k], layers::device_reduced{c.key, std::move(out)});
  }
}

}  // namespace nerve::gpu

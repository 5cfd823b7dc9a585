#include "layers/pipeline/mpi_ranks.hpp"

#include <memory>
#include <stdexcept>
#include <utility>
#include <vector>

#include "bus/mpi/all_reduce.hpp"
#include "bus/mpi/trace.hpp"
#include "layers/wire/mpi_codecs.hpp"

namespace nerve::pipeline {

namespace {

class link : public rank_link {
 public:
  link(bus::mpi::transport& t, channel first) : t_(t), first_(first) {}
  // A link that owns its transport, with the ranks' clock offsets measured when it was made.
  link(actors::runtime& rt, unsigned loop)
      : own_(std::make_unique<bus::mpi::transport>(rt, loop)), t_(*own_), first_(0), offsets_(t_.clock_offsets()) {}

  int rank() const noexcept override { return t_.rank(); }
  int size() const noexcept override { return t_.size(); }

  std::shared_ptr<bus::endpoint<layers::forward_msg>> forward_to(int to, channel ch) override {
    return std::make_shared<bus::mpi::remote<layers::forward_msg>>(t_, to, first_ + ch);
  }
  std::shared_ptr<bus::endpoint<layers::backward_msg>> backward_to(int to, channel ch) override {
    return std::make_shared<bus::mpi::remote<layers::backward_msg>>(t_, to, first_ + ch);
  }
  void receive_forward(channel ch, actors::address to) override { t_.listen<layers::forward_msg>(first_ + ch, std::move(to)); }
  void receive_backward(channel ch, actors::address to) override {
    t_.listen<layers::backward_msg>(first_ + ch, std::move(to));
  }
  actors::address spawn_reducer(actors::runtime& rt, unsigned loop, channel ch, std::vector<int> ranks, std::uint32_t me,
                                actors::address local, std::string name) override {
    return bus::mpi::spawn_all_reduce(rt, loop, t_, first_ + ch, std::move(ranks), me, std::move(local), std::move(name));
  }
  std::vector<std::string> all_gather(const std::string& mine) override { return t_.all_gather(mine); }

  friend void pipeline::write_merged_trace(rank_link&, actors::runtime&, const std::string&, const nlohmann::json&);

 private:
  std::unique_ptr<bus::mpi::transport> own_;  // null: the transport is the caller's
  bus::mpi::transport& t_;
  channel first_;
  std::vector<bus::mpi::clock_offset> offsets_;
};

}  // namespace

std::shared_ptr<rank_link> mpi_ranks(bus::mpi::transport& t, bus::mpi::transport::channel first_channel) {
  return std::make_shared<link>(t, first_channel);
}

std::shared_ptr<rank_link> mpi_ranks_on(actors::runtime& rt, unsigned loop) { return std::make_shared<link>(rt, loop); }

void write_merged_trace(rank_link& l, actors::runtime& rt, const std::string& path, const nlohmann::json& extra) {
  auto* mine = dynamic_cast<link*>(&l);
  if (!mine || !mine->own_) throw std::invalid_argument("write_merged_trace: the link was not made by mpi_ranks_on");
  rt.synchronize();
  mine->t_.flush();
  bus::mpi::write_merged_trace(mine->t_, rt, path, extra, mine->offsets_);
}

}  // namespace nerve::pipeline

#include "gpu/layers/device_all_reduce.hpp"

#include "gpu/kernels.hpp"
#include "gpu/status.hpp"

#include <algorithm>
#include <numeric>
#include <stdexcept>

namespace nerve::gpu {

std::unique_ptr<layers::backend_data> device_gradients::clone() const {
  throw std::logic_error("device all-reduce: a contribution is not cloned");
}
std::size_t device_gradients::floats() const noexcept {
  return std::accumulate(parts.begin(), parts.end(), std::size_t{0},
                         [](std::size_t n, const auto& p) { return n + p.second; });
}
std::size_t device_gradients::payload_bytes() const noexcept { return floats() * sizeof(float); }
std::unique_ptr<layers::backend_data> device_sum::clone() const {
  throw std::logic_error("device all-reduce: a sum is not cloned");
}

device_all_reduce::device_all_reduce(std::string name, bus::group members, stream s)
    : actor(std::move(name)), members_(std::move(members)), s_(std::move(s)) {
  if (members_.size() == 0) throw actors::wiring_error("device_all_reduce '" + this->name() + "' over an empty group");
  members_.require_handler(actors::tag_of<layers::device_reduced>());
  on<layers::device_contribution>([this](layers::device_contribution& c) { on_contribution(c); });
  on<layers::backend_done>([](layers::backend_done& d) { layers::handle_backend_done(d); });
}

std::vector<std::shared_ptr<layers::backend_data>> replica_rounds::add(const char* kind, const std::string& name,
                                                                       std::size_t n, layers::device_contribution& c,
                                                                       bool one_device) {
  auto who = [&] { return std::string(kind) + " '" + name + "'"; };
  if (c.rank >= n)
    throw std::invalid_argument(who() + ": rank " + std::to_string(c.rank) + " in a group of " + std::to_string(n));
  auto* g = dynamic_cast<device_gradients*>(c.grads.get());
  if (!g) throw std::logic_error(who() + ": a contribution that is not on a device");
  auto& r = open_[c.key];
  if (r.empty()) r.resize(n);
  if (r[c.rank])
    throw std::invalid_argument(who() + ": rank " + std::to_string(c.rank) + " contributed twice to round " +
                                std::to_string(c.key));
  for (auto& p : r) {
    if (!p) continue;
    auto& q = static_cast<device_gradients&>(*p);
    if (q.parts.size() != g->parts.size() || q.floats() != g->floats() || (one_device && q.domain != g->domain))
      throw std::invalid_argument(who() + ": round " + std::to_string(c.key) + " got gradients of another shape or " +
                                  "device (" + std::to_string(q.floats()) + " and " + std::to_string(g->floats()) +
                                  " floats)");
  }
  r[c.rank] = std::move(c.grads);
  if (std::find(r.begin(), r.end(), nullptr) != r.end()) return {};
  auto parts = std::move(r);
  open_.erase(c.key);
  return parts;
}

void device_all_reduce::on_contribution(layers::device_contribution& c) {
  const auto parts = open_.add("device_all_reduce", name(), members_.size(), c, true);
  if (parts.empty()) return;
  // Every member's gradients are complete on the device once its event is: wait for all,
  // then sum in member order from member 0's (bus::all_reduce's association).
  std::vector<event> waited;
  for (auto& p : parts) {
    auto& q = static_cast<device_gradients&>(*p);
    s_.wait(q.ready);
    waited.push_back(q.ready);
  }
  const auto floats = static_cast<device_gradients&>(*parts[0]).floats();
  auto sum = std::make_shared<device_tensor>(s_, shape_t{std::max<std::size_t>(floats, 1)});
  for (std::size_t k = 0; k < parts.size(); ++k) {
    std::size_t at = 0;
    for (auto& [p, count] : static_cast<device_gradients&>(*parts[k]).parts) {
      if (k == 0)
        copy_async(s_, sum->data() + at, p, count * sizeof(float));
      else
        axpy(s_, count, 1.0f, p, sum->data() + at);
      at += count;
    }
  }
  auto out = std::make_shared<device_sum>();
  out->sum = std::move(sum);
  out->ready = s_.record();
  // The members' events stay recorded until this stream passed its waits; an error of the
  // sum fails this actor.
  after_stream(*this, s_, "device all-reduce", {}, std::move(waited));
  ++rounds_;
  const auto key = c.key;
  for (auto& m : members_.members()) send(m, layers::device_reduced{key, out});
}

void after_stream(actors::actor& a, stream& s, const char* what, std::function<void()> then, std::vector<event> keep,
                  const span_label& span) {
  auto done = [to = a.self(), what, then = std::move(then), keep = std::move(keep)](std::error_code ec) mutable {
    auto* actor = to.get();
    if (!actor || (!ec && !then)) return;  // the pipeline is gone, or nothing to run
    std::exception_ptr err;
    if (ec) err = std::make_exception_ptr(error(ec, std::string(what) + ": '" + actor->name() + "'"));
    (void)actor->try_tell(layers::backend_done{std::move(err), then ? std::move(then) : [] {}}, actors::lane::urgent);
  };
  s.async_wait(a.executor(), std::move(done), span);
}

}  // namespace nerve::gpu

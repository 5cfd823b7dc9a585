#include "gpu/device.hpp"

#include "gpu/detail/device_core.hpp"
#include "gpu/status.hpp"

#include "actors/recorder.hpp"

#include <string>

namespace nerve::gpu {
namespace detail {

device_core::device_core(const device_options& o) : options(o) {
  backend_kind k = o.backend;
  if (k == backend_kind::automatic) k = cuda_device_count() > 0 ? backend_kind::cuda : backend_kind::standin;
  impl = make_backend(k, o.ordinal);
  if (o.waits == wait_mode::poller)
    completions = make_poller(*impl, o.poller);
  else
    completions = make_blocking_waiter(*impl);
  impl->set_completion_hook([q = completions.get()] { q->wake(); });
}

device_core::~device_core() {
  if (completions) completions->shutdown();
  completions.reset();
  for (auto* e : free_events_) impl->destroy_event(e);
}

std::shared_ptr<event_impl> device_core::acquire_event() {
  event_impl* e = nullptr;
  {
    std::lock_guard lk(pool_mutex_);
    if (!free_events_.empty()) {
      e = free_events_.back();
      free_events_.pop_back();
    }
  }
  if (!e) {
    e = impl->create_event();
    std::lock_guard lk(pool_mutex_);
    ++created_;
  }
  // The deleter keeps the core (and so the backend) alive until the event is back.
  return std::shared_ptr<event_impl>(e, [core = shared_from_this()](event_impl* p) {
    std::lock_guard lk(core->pool_mutex_);
    core->free_events_.push_back(p);
  });
}

std::size_t device_core::events_created() const {
  std::lock_guard lk(pool_mutex_);
  return created_;
}

}  // namespace detail

device::device(const device_options& options) : core_(std::make_shared<detail::device_core>(options)) {
  if (auto* rec = options.recorder)
    rec->name_track(stream_track(ordinal(), 0), "gpu completions (" + name() + ")", 1'000'000'000L + stream_track(ordinal(), 0));
}

device::~device() { shutdown(); }

int device::cuda_device_count() noexcept { return detail::cuda_device_count(); }

backend_kind device::kind() const noexcept { return core_->impl->kind(); }
std::string device::name() const { return core_->impl->name(); }
int device::ordinal() const noexcept { return core_->impl->ordinal(); }

stream device::create_stream(const stream_options& options) {
  auto s = core_->impl->create_stream(options);
  s->id = core_->next_stream_id.fetch_add(1, std::memory_order_relaxed);
  s->core = core_;
  if (auto* rec = core_->options.recorder) {
    const auto track = stream_track(ordinal(), s->id);
    rec->name_track(track, "gpu stream " + std::to_string(s->id) + " (" + name() + ")", 1'000'000'000L + track);
  }
  return stream(std::move(s));
}

void device::shutdown() noexcept {
  core_->completions->shutdown();
}

}  // namespace nerve::gpu

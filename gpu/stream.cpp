#include "gpu/stream.hpp"

#include "gpu/detail/device_core.hpp"
#include "gpu/status.hpp"

#include "actors/recorder.hpp"
#include "actors/runtime.hpp"

#include <algorithm>

namespace nerve::gpu {

bool event::ready() const { return backend_->query(*impl_).ready; }

std::error_code event::status() const { return backend_->query(*impl_).error; }

void event::wait() const {
  if (auto ec = backend_->wait(*impl_)) throw error(ec, "event::wait");
}

std::uint64_t stream::id() const noexcept { return impl_->id; }
void* stream::native_handle() const noexcept { return impl_ ? impl_->native_handle() : nullptr; }

event stream::record() {
  auto& core = *impl_->core;
  auto e = core.acquire_event();
  core.impl->record(*e, *impl_);
  return event(std::move(e), core.impl.get());
}

void stream::wait(const event& e) { impl_->core->impl->stream_wait(*impl_, e.impl()); }

namespace {
/// A traced wait: the arrow from the enqueuing handler (the actor running on this
/// thread, or track 0 outside any actor) starts here; the span and the rest are recorded
/// when the completion is observed (detail::deliver).
void trace_wait(detail::waiter& w, detail::device_core& core, const span_label& label) {
  auto* rec = core.options.recorder;
  if (!rec || !rec->enabled()) return;
  const auto now = rec->now();
  const int ordinal = core.impl->ordinal();
  const actors::actor_id from = actors::current_actor();
  auto& t = w.trace;
  t.rec = rec;
  t.name = label.name ? label.name : "gpu";
  t.start_ns = label.start_ns >= 0 ? std::min(label.start_ns, now) : now;
  t.mb = label.mb;
  t.stream_track = stream_track(ordinal, w.stream->id);
  t.completion_track = from != 0 ? from : stream_track(ordinal, 0);
  t.stream = static_cast<std::int32_t>(w.stream->id);
  t.device = ordinal;
  t.flow_in = rec->next_flow();
  rec->flow(actors::record_kind::flow_start, from, t.name, t.flow_in, t.start_ns);
}
}  // namespace

void stream::async_wait(const boost::asio::any_io_executor& executor, completion_handler handler,
                        const span_label& label) {
  auto& core = *impl_->core;
  detail::waiter w;
  w.stream = impl_;
  w.executor = executor;
  w.handler = std::move(handler);
  trace_wait(w, core, label);
  if (core.options.counter.begin) core.options.counter.begin();
  w.token = detail::work_token(core.options.counter.end ? &core.options.counter : nullptr);
  // Record and submit under the stream's lock so waiters and records agree on order. If
  // the record throws (a CUDA error), the caller learns it here; the handler is dropped
  // and the token's destructor balances the counter.
  std::lock_guard lk(impl_->submit_mutex);
  w.event = core.acquire_event();
  core.impl->record(*w.event, *impl_);
  core.completions->submit(std::move(w));
}

void stream::synchronize() { impl_->core->impl->synchronize(*impl_); }

void stream::enqueue_host(detail::unique_function<void()> fn) { impl_->core->impl->enqueue_host(*impl_, std::move(fn)); }

}  // namespace nerve::gpu

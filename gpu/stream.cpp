#include "gpu/stream.hpp"

#include "gpu/detail/device_core.hpp"
#include "gpu/status.hpp"

namespace nerve::gpu {

bool event::ready() const { return backend_->query(*impl_).ready; }

std::error_code event::status() const { return backend_->query(*impl_).error; }

void event::wait() const {
  if (auto ec = backend_->wait(*impl_)) throw error(ec, "event::wait");
}

std::uint64_t stream::id() const noexcept { return impl_->id; }

event stream::record() {
  auto& core = *impl_->core;
  auto e = core.acquire_event();
  core.impl->record(*e, *impl_);
  return event(std::move(e), core.impl.get());
}

void stream::wait(const event& e) { impl_->core->impl->stream_wait(*impl_, e.impl()); }

void stream::async_wait(const boost::asio::any_io_executor& executor, completion_handler handler) {
  auto& core = *impl_->core;
  detail::waiter w;
  w.stream = impl_;
  w.executor = executor;
  w.handler = std::move(handler);
  if (core.options.counter.begin) core.options.counter.begin();
  w.token = detail::work_token(&core.options.counter);
  // Record and submit under the stream's lock so waiters and records agree on order.
  std::lock_guard lk(impl_->submit_mutex);
  // If the record throws (a CUDA error), the caller learns it here; the handler is
  // dropped and the token's destructor balances the counter.
  w.event = core.acquire_event();
  core.impl->record(*w.event, *impl_);
  core.completions->submit(std::move(w));
}

void stream::async_wait(const event& e, const boost::asio::any_io_executor& executor, completion_handler handler) {
  auto& core = *impl_->core;
  detail::waiter w;
  w.stream = impl_;
  w.event = e.shared_impl();
  w.executor = executor;
  w.handler = std::move(handler);
  if (core.options.counter.begin) core.options.counter.begin();
  w.token = detail::work_token(&core.options.counter);
  std::lock_guard lk(impl_->submit_mutex);
  core.completions->submit(std::move(w));
}

void stream::synchronize() { impl_->core->impl->synchronize(*impl_); }

void stream::enqueue_host(detail::unique_function<void()> fn) { impl_->core->impl->enqueue_host(*impl_, std::move(fn)); }

}  // namespace nerve::gpu

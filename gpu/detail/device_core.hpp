#pragma once
/// \file
/// What a device shares with its streams, events and buffers: the backend, the
/// event pool and the completion queue. Internal.

#include "gpu/detail/backend.hpp"
#include "gpu/detail/completion_queue.hpp"
#include "gpu/device.hpp"

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

namespace nerve::gpu::detail {

class device_core : public std::enable_shared_from_this<device_core> {
 public:
  explicit device_core(const device_options& o);
  ~device_core();

  /// A recycled (or new) event; returns to the pool when the last handle goes. Thread-safe.
  std::shared_ptr<event_impl> acquire_event();
  /// Events created so far (pool statistics, for tests). Thread-safe.
  std::size_t events_created() const;

  device_options options;
  std::unique_ptr<backend> impl;
  std::unique_ptr<completion_queue> completions;
  std::atomic<std::uint64_t> next_stream_id{1};

 private:
  mutable std::mutex pool_mutex_;
  std::vector<event_impl*> free_events_;
  std::size_t created_ = 0;
};

}  // namespace nerve::gpu::detail

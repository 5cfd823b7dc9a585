#include "gpu/memory.hpp"

#include "gpu/detail/device_core.hpp"
#include "gpu/device.hpp"

#include <algorithm>
#include <functional>
#include <numeric>
#include <utility>

namespace nerve::gpu {

device_buffer::device_buffer(stream& s, std::size_t bytes)
    : data_(bytes ? s.impl().core->impl->allocate(bytes, s.impl()) : nullptr, free_on_stream{s.shared_impl()}),
      bytes_(bytes) {}

void device_buffer::free_on_stream::operator()(void* p) noexcept { owner->core->impl->deallocate(p, *owner); }

std::size_t numel(const shape_t& shape) {
  return std::accumulate(shape.begin(), shape.end(), std::size_t{1}, std::multiplies<>());
}

device_tensor::device_tensor(stream& s, shape_t shape)
    : buffer_(s, numel(shape) * sizeof(float)), shape_(std::move(shape)), size_(numel(shape_)) {}

pinned_buffer::pinned_buffer(device& d, std::size_t bytes)
    : data_(d.core().impl->allocate_pinned(bytes), free_pinned{d.core().shared_from_this()}), bytes_(bytes) {}

void pinned_buffer::free_pinned::operator()(void* p) noexcept { core->impl->deallocate_pinned(p); }

pinned_buffer pinned_pool::take(std::size_t bytes) {
  {
    std::lock_guard lk(m_);
    if (auto it = spare_.lower_bound(bytes); it != spare_.end()) {
      auto b = std::move(it->second);
      spare_.erase(it);
      return b;
    }
  }
  return pinned_buffer(dev_, std::max<std::size_t>(bytes, 1));
}

void pinned_pool::give(pinned_buffer b) {
  std::lock_guard lk(m_);
  spare_.emplace(b.bytes(), std::move(b));
}

void copy_async(stream& s, void* dst, const void* src, std::size_t bytes) {
  if (bytes) s.impl().core->impl->copy(dst, src, bytes, s.impl());
}

void fill_zero_async(stream& s, void* dst, std::size_t bytes) {
  if (bytes) s.impl().core->impl->fill_zero(dst, bytes, s.impl());
}

device_tensor upload(stream& s, const float* host, shape_t shape) {
  device_tensor t(s, std::move(shape));
  copy_async(s, t.data(), host, t.bytes());
  s.synchronize();
  return t;
}

std::vector<float> download(stream& s, const device_tensor& t) {
  std::vector<float> v(t.size());
  copy_async(s, v.data(), t.data(), t.bytes());
  s.synchronize();
  return v;
}

}  // namespace nerve::gpu

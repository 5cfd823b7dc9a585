#include "gpu/memory.hpp"

#include "gpu/detail/device_core.hpp"
#include "gpu/device.hpp"

#include <utility>

namespace nerve::gpu {

device_buffer::device_buffer(stream& s, std::size_t bytes)
    : data_(bytes ? s.impl().core->impl->allocate(bytes, s.impl()) : nullptr),
      bytes_(bytes),
      owner_(s.shared_impl()) {}

device_buffer::device_buffer(device_buffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)), owner_(std::move(o.owner_)) {}

device_buffer& device_buffer::operator=(device_buffer&& o) noexcept {
  if (this != &o) {
    reset();
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    owner_ = std::move(o.owner_);
  }
  return *this;
}

void device_buffer::reset() noexcept {
  if (data_) owner_->core->impl->deallocate(data_, *owner_);
  data_ = nullptr;
  bytes_ = 0;
  owner_.reset();
}

namespace {
std::size_t element_count(const shape_t& shape) {
  std::size_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}
}  // namespace

device_tensor::device_tensor(stream& s, shape_t shape)
    : buffer_(s, element_count(shape) * sizeof(float)), shape_(std::move(shape)), size_(element_count(shape_)) {}

pinned_buffer::pinned_buffer(device& d, std::size_t bytes)
    : data_(d.core().impl->allocate_pinned(bytes)), bytes_(bytes), core_(d.core().shared_from_this()) {}

pinned_buffer::pinned_buffer(pinned_buffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)), core_(std::move(o.core_)) {}

pinned_buffer& pinned_buffer::operator=(pinned_buffer&& o) noexcept {
  if (this != &o) {
    reset();
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    core_ = std::move(o.core_);
  }
  return *this;
}

void pinned_buffer::reset() noexcept {
  if (data_) core_->impl->deallocate_pinned(data_);
  data_ = nullptr;
  bytes_ = 0;
  core_.reset();
}

void copy_async(stream& s, void* dst, const void* src, std::size_t bytes) {
  if (bytes) s.impl().core->impl->copy(dst, src, bytes, s.impl());
}

void fill_zero_async(stream& s, void* dst, std::size_t bytes) {
  if (bytes) s.impl().core->impl->fill_zero(dst, bytes, s.impl());
}

}  // namespace nerve::gpu

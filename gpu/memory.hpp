#pragma once
/// \file
/// Device memory, stream-ordered: allocation and free are enqueued on a stream
/// (`cudaMallocAsync`/`cudaFreeAsync` from the device's pool, which keeps freed
/// blocks cached for reuse), so neither blocks the calling loop. Pinned host
/// memory for asynchronous copies. Any thread, one at a time per object.

#include "gpu/stream.hpp"

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

namespace nerve::gpu {

class device;
namespace detail {
class device_core;
}

/// Bytes on a device, freed in stream order on the stream that owns it (after the work
/// enqueued on it) when the buffer goes or is assigned another. Move-only.
class device_buffer {
 public:
  device_buffer() = default;
  /// Allocates `bytes` in stream order on `s`: usable by work enqueued on `s` after this.
  device_buffer(stream& s, std::size_t bytes);

  void* data() const noexcept { return data_.get(); }
  std::size_t bytes() const noexcept { return data_ ? bytes_ : 0; }
  bool empty() const noexcept { return data_ == nullptr; }
  /// Makes `s` the owning stream, e.g. when the buffer was handed to another
  /// actor: that actor's stream waited on the producer's event, and the free
  /// must come after *its* work.
  void set_stream(const stream& s) noexcept { data_.get_deleter().owner = s.shared_impl(); }

 private:
  struct free_on_stream {
    std::shared_ptr<detail::stream_impl> owner;
    void operator()(void* p) noexcept;
  };
  std::unique_ptr<void, free_on_stream> data_;
  std::size_t bytes_ = 0;
};

/// Shape of a tensor, outermost first.
using shape_t = std::vector<std::size_t>;
/// The elements of a tensor of `shape` (1 for a scalar).
std::size_t numel(const shape_t& shape);

/// A float32 row-major tensor on a device: a buffer and its shape. Move-only.
class device_tensor {
 public:
  device_tensor() = default;
  device_tensor(stream& s, shape_t shape);

  float* data() noexcept { return static_cast<float*>(buffer_.data()); }
  const float* data() const noexcept { return static_cast<const float*>(buffer_.data()); }
  const shape_t& shape() const noexcept { return shape_; }
  /// Number of elements.
  std::size_t size() const noexcept { return size_; }
  std::size_t bytes() const noexcept { return size_ * sizeof(float); }
  /// No storage (default-constructed, moved from, or of zero elements).
  bool empty() const noexcept { return buffer_.empty(); }
  /// shape[0] (1 for a scalar): the batch.
  std::size_t rows() const noexcept { return shape_.empty() ? 1 : shape_[0]; }
  /// The product of the other dimensions: the row length of the 2-D view.
  std::size_t cols() const noexcept { return rows() ? size_ / rows() : 0; }
  device_buffer& buffer() noexcept { return buffer_; }

 private:
  device_buffer buffer_;
  shape_t shape_;
  std::size_t size_ = 0;
};

/// Page-locked host memory (`cudaMallocHost`; plain memory on the stand-in), the
/// staging area of asynchronous copies. Allocating and freeing it can block:
/// do it at setup, and reuse the buffer per micro-batch slot. Move-only.
class pinned_buffer {
 public:
  pinned_buffer() = default;
  pinned_buffer(device& d, std::size_t bytes);

  void* data() const noexcept { return data_.get(); }
  std::size_t bytes() const noexcept { return data_ ? bytes_ : 0; }
  template <class T>
  std::span<T> as() const noexcept {
    return {static_cast<T*>(data()), bytes() / sizeof(T)};
  }

 private:
  struct free_pinned {
    std::shared_ptr<detail::device_core> core;
    void operator()(void* p) noexcept;
  };
  std::unique_ptr<void, free_pinned> data_;
  std::size_t bytes_ = 0;
};

/// Pinned blocks kept for reuse: a copy into pageable memory would block the loop until
/// the stream reaches it, and freeing pinned memory waits for the whole device; either
/// stalls a loop behind a busy stream. Thread-safe.
class pinned_pool {
 public:
  explicit pinned_pool(device& d) : dev_(d) {}
  /// The smallest spare block of at least `bytes`, or a new one (of at least one byte).
  pinned_buffer take(std::size_t bytes);
  /// Keeps `b` for a later `take`.
  void give(pinned_buffer b);

 private:
  device& dev_;
  std::mutex m_;
  std::multimap<std::size_t, pinned_buffer> spare_;  // guarded by m_
};

/// Copies `bytes` from `src` to `dst` in stream order; host, pinned or device
/// memory on either side. With pageable host memory CUDA may block: copy
/// through a `pinned_buffer`. The source must stay alive until the copy is done.
void copy_async(stream& s, void* dst, const void* src, std::size_t bytes);
/// Sets `bytes` at `dst` (device memory) to zero in stream order.
void fill_zero_async(stream& s, void* dst, std::size_t bytes);

/// A tensor of `shape` on `s` filled from host memory (copied through the stream, then
/// waited for: setup and tests).
device_tensor upload(stream& s, const float* host, shape_t shape);
/// The contents of `t` on the host (waits: not on a loop).
std::vector<float> download(stream& s, const device_tensor& t);

}  // namespace nerve::gpu

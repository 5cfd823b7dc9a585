#pragma once
/// \file
/// `segmented_vector`: an append-only array in fixed-size segments. Growing never moves
/// an element (no reallocation, no copy of the whole array, no big free), so appending
/// costs the same at the 100,000th element as at the first; indexing is a shift and a mask.
/// Not thread-safe: the runtime guards its registry with a mutex.

#include <cstddef>
#include <memory>
#include <vector>

namespace nerve::actors::detail {

template <class T, std::size_t SegmentBits = 8>
class segmented_vector {
  static constexpr std::size_t segment = std::size_t{1} << SegmentBits;

 public:
  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }

  T& operator[](std::size_t i) noexcept { return segments_[i >> SegmentBits][i & (segment - 1)]; }
  const T& operator[](std::size_t i) const noexcept { return segments_[i >> SegmentBits][i & (segment - 1)]; }

  /// Makes room for the next `push_back` (a new segment, when the last one is full), so
  /// that it allocates nothing: a caller that must not fail halfway allocates first.
  /// Throws `std::bad_alloc`, leaving the contents as they were.
  void reserve_next() {
    if ((size_ >> SegmentBits) == segments_.size()) segments_.push_back(std::make_unique<T[]>(segment));
  }

  /// Appends `v`; a new segment (default-constructed elements) every `segment` elements.
  /// After `reserve_next`, it throws only what assigning `v` to an element throws.
  template <class V>
  T& push_back(V&& v) {
    reserve_next();
    T& slot = (*this)[size_];
    slot = std::forward<V>(v);
    ++size_;
    return slot;
  }

  /// Drops every element (and frees the segments).
  void clear() noexcept {
    segments_.clear();
    size_ = 0;
  }

  /// Moves the whole contents out (this one is left empty).
  segmented_vector take() noexcept {
    segmented_vector out;
    out.segments_.swap(segments_);
    out.size_ = size_;
    size_ = 0;
    return out;
  }

 private:
  std::vector<std::unique_ptr<T[]>> segments_;
  std::size_t size_ = 0;
};

}  // namespace nerve::actors::detail

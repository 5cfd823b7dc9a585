#pragma once
// Host tensors as op-set arrays and back, for the CPU's op set (the op layers' and the
// losses' calls on host tensors). Private to layers/.

#include <algorithm>
#include <utility>
#include <vector>

#include "layers/ops.hpp"

namespace nerve::layers::detail {

/// `t` as an array borrowing it, in its full shape.
template <class S>
basic_array<S> host_array(basic_tensor<S>& t) {
  return {t.full_shape(), t.data(), nullptr, -1};
}

/// The array as a tensor of its dims: its own tensor, moved, when nothing else holds it
/// (every owner of a CPU array is a tensor: `alloc`, an owning array); else a copy (the
/// tape or a kept array still reads it).
template <class S>
basic_tensor<S> to_tensor(basic_array<S>&& a) {
  std::vector<std::int64_t> sample(a.dims.begin() + (a.dims.empty() ? 0 : 1), a.dims.end());
  shape sample_shape(std::move(sample));
  if (a.owner && a.owner.use_count() == 1) {
    auto* own = static_cast<basic_tensor<S>*>(a.owner.get());
    if (own->data() == a.data && own->size() == a.size() && own->batch() == a.rows()) {
      basic_tensor<S> t = std::move(*own);
      t.reshape(std::move(sample_shape));
      a = {};
      return t;
    }
  }
  basic_tensor<S> t(a.rows(), std::move(sample_shape));
  std::copy(a.data, a.data + a.size(), t.data());
  return t;
}

}  // namespace nerve::layers::detail

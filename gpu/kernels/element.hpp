#pragma once
/// \file
/// What every header of element kernels needs (gpu/kernels/ops.hpp's contract): the
/// qualifier that compiles a function for both the GPU and the host, and the read of
/// memory no thread of a launch writes. C++17, no CUDA headers.

#ifdef __CUDACC__
#define NERVE_HOST_DEVICE __host__ __device__
#else
#define NERVE_HOST_DEVICE
#endif

namespace nerve::gpu::ops {

/// Reads memory that no thread of the launch writes: on a GPU through the read-only data
/// cache (`__ldg`, what a `const __restrict__` kernel parameter gives), on the host plainly.
template <class T>
NERVE_HOST_DEVICE T read_only(const T& v) {
#ifdef __CUDA_ARCH__
  return __ldg(&v);
#else
  return v;
#endif
}

}  // namespace nerve::gpu::ops

#pragma once
/// \file
/// What crosses into libnerve_gpu_nccl.so (gpu/cuda/nccl_module.cpp), the module built
/// where the CUDA toolkit has NCCL and opened the first time a collective across devices
/// is asked for (`gpu::nccl_comms`). Plain C types only: the module links NCCL and nothing
/// of nerve. Every function returns 0, or non-zero with a message in `err` (`errlen` bytes).

#include <cstddef>

extern "C" {

/// ncclCommInitAll over `n` CUDA device ordinals: one communicator per device in `comms`.
int nerve_nccl_init_all(int n, const int* ordinals, void** comms, char* err, std::size_t errlen);
/// ncclGetUniqueId into `id` (128 bytes, NCCL_UNIQUE_ID_BYTES).
int nerve_nccl_unique_id(void* id, char* err, std::size_t errlen);
/// ncclCommInitRank on device `ordinal` (cudaSetDevice first): rank `rank` of `nranks`.
int nerve_nccl_init_rank(void** comm, int nranks, const void* id, int rank, int ordinal, char* err,
                         std::size_t errlen);
/// One group call: for every communicator c and buffer b, an in-place ncclAllReduce (sum,
/// fp32) of `counts[b]` floats at `buffers[c * nbuffers + b]` on `streams[c]` (cudaStream_t).
int nerve_nccl_all_reduce_sum(int ncomms, void* const* comms, void* const* streams, int nbuffers,
                              float* const* buffers, const std::size_t* counts, char* err, std::size_t errlen);
/// ncclCommDestroy of each.
void nerve_nccl_destroy(int n, void* const* comms);
}

namespace nerve::gpu::detail {
inline constexpr const char* nccl_module_file = "libnerve_gpu_nccl.so";
inline constexpr const char* nccl_module_env = "NERVE_NCCL_MODULE";
inline constexpr std::size_t nccl_id_bytes = 128;
}  // namespace nerve::gpu::detail

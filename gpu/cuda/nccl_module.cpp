// libnerve_gpu_nccl.so: NCCL behind the plain C table of gpu/detail/nccl_module.hpp.
#include "gpu/detail/nccl_module.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <cstring>
#include <vector>

namespace {

int fail(char* err, std::size_t errlen, const char* call, const char* why) {
  if (err && errlen) std::snprintf(err, errlen, "%s: %s", call, why);
  return 1;
}
int check(ncclResult_t r, const char* call, char* err, std::size_t errlen) {
  return r == ncclSuccess ? 0 : fail(err, errlen, call, ncclGetErrorString(r));
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int nerve_nccl_init_all(int n, const int* ordinals, void** comms, char* err,
                                                               std::size_t errlen) {
  std::vector<ncclComm_t> c(std::size_t(n), nullptr);
  if (int e = check(ncclCommInitAll(c.data(), n, ordinals), "ncclCommInitAll", err, errlen)) return e;
  for (int i = 0; i < n; ++i) comms[i] = c[std::size_t(i)];
  return 0;
}

__attribute__((visibility("default"))) int nerve_nccl_unique_id(void* id, char* err, std::size_t errlen) {
  static_assert(sizeof(ncclUniqueId) == nerve::gpu::detail::nccl_id_bytes);
  ncclUniqueId u;
  if (int e = check(ncclGetUniqueId(&u), "ncclGetUniqueId", err, errlen)) return e;
  std::memcpy(id, &u, sizeof u);
  return 0;
}

__attribute__((visibility("default"))) int nerve_nccl_init_rank(void** comm, int nranks, const void* id, int rank,
                                                                int ordinal, char* err, std::size_t errlen) {
  if (cudaSetDevice(ordinal) != cudaSuccess) return fail(err, errlen, "cudaSetDevice", "failed");
  ncclUniqueId u;
  std::memcpy(&u, id, sizeof u);
  ncclComm_t c = nullptr;
  if (int e = check(ncclCommInitRank(&c, nranks, u, rank), "ncclCommInitRank", err, errlen)) return e;
  *comm = c;
  return 0;
}

__attribute__((visibility("default"))) int nerve_nccl_all_reduce_sum(int ncomms, void* const* comms,
                                                                     void* const* streams, int nbuffers,
                                                                     float* const* buffers, const std::size_t* counts,
                                                                     char* err, std::size_t errlen) {
  if (int e = check(ncclGroupStart(), "ncclGroupStart", err, errlen)) return e;
  int failed = 0;
  for (int c = 0; c < ncomms && !failed; ++c)
    for (int b = 0; b < nbuffers && !failed; ++b) {
      float* p = buffers[c * nbuffers + b];
      failed = check(ncclAllReduce(p, p, counts[b], ncclFloat, ncclSum, static_cast<ncclComm_t>(comms[c]),
                                   static_cast<cudaStream_t>(streams[c])),
                     "ncclAllReduce", err, errlen);
    }
  const int end = check(ncclGroupEnd(), "ncclGroupEnd", failed ? nullptr : err, errlen);
  return failed ? failed : end;
}

__attribute__((visibility("default"))) void nerve_nccl_destroy(int n, void* const* comms) {
  for (int i = 0; i < n; ++i)
    if (comms[i]) ncclCommDestroy(static_cast<ncclComm_t>(comms[i]));
}
}

#pragma once
/// \file
/// `nccl_comms`: NCCL communicators among CUDA devices — one per device in this process
/// (`ncclCommInitAll`), or this rank's of a job (`ncclCommInitRank`, its id broadcast by
/// the caller over MPI) — and the in-place sum of fp32 buffers across them, enqueued on
/// the given streams. NCCL lives in a module (libnerve_gpu_nccl.so) built where the CUDA
/// toolkit has it and opened on first use, so nothing else maps it.
///
/// NCCL chooses its own reduction order (rings, trees): its sum is not member order, so
/// it is not bitwise `bus::all_reduce`'s; within R·2⁻²⁴·Σ|gᵢ| of it (docs/distributed.md).
///
/// Thread safety: one owner; `all_reduce_sum` from one thread at a time.

#include "gpu/device.hpp"
#include "gpu/stream.hpp"

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace nerve::gpu {

class nccl_comms {
 public:
  /// Whether NCCL was built and its module loads; `why` says why not.
  static bool available(std::string* why = nullptr);
  /// Rank 0's id of a job's communicator (128 bytes), for the caller to send every rank.
  static std::string unique_id();

  /// One communicator per device (distinct CUDA devices of this process). Throws
  /// `gpu::error` (`not_supported` without NCCL or for a stand-in device).
  explicit nccl_comms(const std::vector<device*>& devices);
  /// This rank's communicator of a job of `nranks` (every rank passes rank 0's `id`).
  nccl_comms(device& dev, int nranks, int rank, const std::string& id);
  ~nccl_comms();
  nccl_comms(const nccl_comms&) = delete;
  nccl_comms& operator=(const nccl_comms&) = delete;

  std::size_t size() const noexcept { return comms_.size(); }
  /// One group call: `buffers[c]` (spans of equal counts for every c) summed in place over
  /// all communicators of the job, enqueued on `streams[c]` (a stream of communicator c's
  /// device). Throws `gpu::error` when NCCL refuses.
  void all_reduce_sum(const std::vector<stream>& streams,
                      const std::vector<std::vector<std::pair<float*, std::size_t>>>& buffers);

 private:
  std::vector<void*> comms_;
};

}  // namespace nerve::gpu

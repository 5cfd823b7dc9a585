#pragma once
/// \file
/// What `pipeline` and its stages say to each other: a step request per stage, the
/// stage's report, and the abort that ends a failed step everywhere. The stage is a
/// `stage_gate` with its layer actors, on whatever backend.

#include <cstdint>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "actors/address.hpp"
#include "layers/loss.hpp"
#include "layers/pipeline/pipeline.hpp"

namespace nerve::pipeline::detail {

/// Starts a step on a stage (a request; the stage answers with its `stage_report`).
struct step_msg {
  static constexpr std::string_view kind = "pipeline_step";
  std::uint64_t step = 0;
  double lr = -1;
  std::int64_t t0_ns = 0;  ///< the step's start on the recorder clock
  /// Every stage of every replica: replica r's stage s at r * S + s.
  std::shared_ptr<const std::vector<actors::address>> stages;
  std::uint32_t replica = 0;
  std::vector<layers::tensor> inputs;    ///< stage 0: one per micro-batch
  std::vector<layers::targets> targets;  ///< the last stage: one per micro-batch
  std::vector<double> shares;            ///< the last stage: nᵢ/N per micro-batch (N: all replicas' samples)
};

/// Another stage failed with `what`: end the step and stop. Carries text, not the
/// exception: every stage fails its own request with its own `stage_aborted`, so no
/// exception object is shared between loop threads and the caller.
struct abort_msg {
  static constexpr std::string_view kind = "abort";
  std::uint32_t from = 0;
  std::string what;
};

/// The error of a stage that stopped because another stage failed.
class stage_aborted : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown error";
  }
}

struct stage_report {
  std::vector<double> losses;  // last stage: per micro-batch
  std::vector<std::int64_t> correct;
  std::int64_t begin_ns = 0, end_ns = 0;
  std::int64_t busy_ns = 0, input_wait_ns = 0, backpressure_ns = 0, optimizer_ns = 0;
  std::size_t peak_stashed = 0, peak_bytes = 0;
  std::vector<timed_action> actions;  // seconds from the step's t0
};

inline const char* op_name(op o) { return o == op::F ? "F" : o == op::B ? "B" : "W"; }

}  // namespace nerve::pipeline::detail

#pragma once
/// \file
/// `pipeline_engine`: a pipeline as the one trainer's engine (`layers::train`). Its stages
/// and replicas run on the trainer's runtime; device stages on the devices named per stage
/// (layers/devices.hpp: `cpu`, `standin`, `cuda`, `cuda:N`); in a job of several ranks, each
/// rank's own stages (`pipeline_options::link`). Training, evaluation and prediction run on
/// the same layer actors. nerve-pipeline runs every pipeline through it, `nerve-train
/// --replicas R` its replicas (one stage each), and a user's program the same way:
///
/// ```
///   std::vector<nl::graph*> replicas{&g};
///   nerve::pipeline::engine_outcome out;
///   auto report = nl::train(g, o, {}, {}, [&](actors::runtime& rt, nl::graph&, const nl::train_options& opts) {
///     return std::make_unique<nerve::pipeline::pipeline_engine>(
///         rt, replicas, partition_by_parameters(g, 2), make_schedule("1f1b", 2, 4), opts, pipeline_options{},
///         std::vector<std::string>{"cpu", "standin"}, out);
///   });
/// ```

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "layers/devices.hpp"
#include "layers/pipeline/pipeline.hpp"
#include "layers/trainer.hpp"

namespace nerve::pipeline {

/// What a run leaves for its report, taken before the pipeline's actors go.
struct engine_outcome {
  std::vector<stage_metrics> metrics;
  std::string measured;               ///< the last step's timeline table
  std::vector<std::string> device_of; ///< per stage: "cpu", or the device and where it is
  double train_seconds = 0;           ///< in train_step, without data loading and evaluation
  std::int64_t trained = 0;           ///< samples
};

/// How the engine takes part in a job of several ranks (the apps' `job` gives both).
struct engine_job {
  /// Called with the error of a failed step or evaluation before it unwinds: across ranks
  /// a rank leaves at once there (unwinding would wait on ranks still in their step).
  std::function<void(const std::string&)> fail;
  /// Writes the job's one trace, merged from every rank's (every rank calls it).
  std::function<void(actors::runtime&, rank_link&, const std::string&, const nlohmann::json&)> write_trace;
  /// This rank's request to stop as a number above 0 (the apps: the signal it got); null: 1.
  std::function<int()> stop_code;
  /// Told which rank asked to stop first (the lowest) and its number, on every rank.
  std::function<void(int rank, int code)> stopped_by;
};

class pipeline_engine : public layers::train_engine {
 public:
  /// Builds the pipeline of `plan` over `pieces` on `rt`, one per graph of `graphs`
  /// (replicas; they start from replica 0's weights and buffers). `devices` names stage
  /// s's device at s (missing or `cpu`: the CPU); devices are opened once per name.
  /// `out` (which outlives the engine) gets the run's figures.
  pipeline_engine(actors::runtime& rt, const std::vector<layers::graph*>& graphs, const partition& pieces,
                  const schedule& plan, const layers::train_options& o, pipeline_options po,
                  const std::vector<std::string>& devices, engine_outcome& out, engine_job job = {});
  ~pipeline_engine() override;

  std::future<layers::step_result> train_step(layers::tensor x, layers::targets y, std::size_t micro_batches,
                                              std::uint64_t step, double lr) override;
  /// On the stages' own layer actors, in evaluation mode (a collective across ranks).
  std::future<layers::step_result> evaluate(layers::tensor x, layers::targets y) override;
  /// The same, the outputs in row order (a collective across ranks).
  std::future<layers::tensor> predict(layers::tensor x) override;
  std::size_t min_rows() const override { return min_rows_; }
  void finish() override;
  void trace_metadata(nlohmann::json& extra) const override;
  bool write_trace(actors::runtime& rt, const std::string& path, const nlohmann::json& extra) override;
  layers::optimizer_state optimizer_state_of() override;
  void load_optimizer_state(const layers::optimizer_state& state) override;
  void sync_weights() override;
  /// Across ranks a stop is the job's: before every step the ranks gather their requests
  /// over the link (as a checkpoint gathers the optimizer state) and all stop when any
  /// asked, so none is left waiting in a step the others never start. The trainer's
  /// thread, between steps; in one process, `local`.
  bool agree_stop(bool local) override;

  /// The pipeline itself (its stages, metrics, backends).
  pipeline& stages() noexcept { return *pipe_; }

 private:
  /// Runs `f`, reporting its error through `job_.fail` first.
  template <class F>
  std::future<layers::step_result> guarded(F&& f);

  actors::runtime& rt_;
  engine_outcome& out_;
  engine_job job_;
  // Devices open after the runtime and close before it: they post to its loops.
  std::map<std::string, std::unique_ptr<layers::device_handle>> opened_;
  std::unique_ptr<pipeline> pipe_;  // destroyed before the devices its stages use
  std::shared_ptr<rank_link> link_; // across ranks (null in one process)
  std::size_t min_rows_ = 1;
  bool downloaded_ = true;
};

}  // namespace nerve::pipeline

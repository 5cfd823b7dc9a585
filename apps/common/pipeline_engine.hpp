#pragma once
/// \file
/// The trainer's engine for a pipeline (`layers/trainer.hpp`): its stages and replicas on
/// the trainer's runtime, device stages on the devices named per stage, and, in a
/// multi-rank job, each rank's own stages (`pipeline_options::link`). nerve-pipeline runs
/// every pipeline through it; nerve-train runs data-parallel replicas through it (one
/// stage). Header-only; each app includes it once.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpu/device.hpp"
#include "gpu/layers/device_backend.hpp"
#include "gpu/nccl.hpp"
#include "layers/gemm.hpp"
#include "layers/pipeline/pipeline.hpp"
#include "layers/trainer.hpp"
#include "apps/common/job.hpp"

namespace nerve::apps {

namespace np = nerve::pipeline;
namespace nl = nerve::layers;

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// What the run leaves for the report, taken before the pipeline's actors go.
struct pipeline_outcome {
  std::vector<np::stage_metrics> metrics;
  std::string measured;  // the last step's timeline table
  std::vector<std::string> device_of;
  double train_seconds = 0;  // in train_step, without data loading and evaluation
  std::int64_t trained = 0;  // samples
};

/// The trainer's engine for a pipeline: its stages (and replicas) on the trainer's
/// runtime, device stages on the devices `devices` names.
class pipeline_engine : public nl::train_engine {
 public:
  pipeline_engine(actors::runtime& rt, const std::vector<nl::graph*>& graphs, const np::partition& pieces,
                  const np::schedule& plan, const nl::train_options& o, np::pipeline_options po,
                  const std::vector<std::string>& devices, pipeline_outcome& out, bool announce)
      : rt_(rt), out_(out) {
    // Replicas start from replica 0's weights: the trainer loaded --init or --resume there.
    for (std::size_t r = 1; r < graphs.size(); ++r) {
      auto from = graphs[0]->parameters(), to = graphs[r]->parameters();
      for (std::size_t i = 0; i < from.size(); ++i) to[i].value->matrix() = from[i].value->matrix();
      auto bf = graphs[0]->buffers(), bt = graphs[r]->buffers();
      for (std::size_t i = 0; i < bf.size(); ++i) bt[i].value->matrix() = bf[i].value->matrix();
    }
    const auto stages = plan.stages;
    out_.device_of.assign(stages, "cpu");
    // In a multi-rank job a rank opens the devices of its own stages only. In one process
    // every replica's stage s gets a backend of its own on stage s's device (the factory is
    // called once per replica): several replicas share a device, a stream each. Replicas
    // across ranks have an entry per replica's stage (replica r's stage s at r * S + s): a
    // rank's own open its device, the others' are never called but say where the stage
    // runs (all replicas of a stage on devices). A rank whose device names no ordinal
    // ("cuda") takes its local rank's, modulo the devices it sees: one GPU per rank.
    const int me = po.link ? po.link->rank() : 0;
    link_ = po.link;
    const auto replicas = std::uint32_t(graphs.size());
    const std::uint32_t entries = po.link && replicas > 1 ? stages * replicas : stages;
    for (std::uint32_t k = 0; k < entries && k % stages < devices.size(); ++k) {
      const std::uint32_t s = k % stages;
      int backend = 0, ordinal = 0;
      const int rank = po.link ? (po.ranks.empty() ? int(k) : po.ranks[k]) : 0;
      if (!gpu::parse_device(devices[s], backend, ordinal)) {
        po.backends.push_back(nullptr);
        continue;
      }
      if (rank != me) {
        if (k == s) out_.device_of[s] = devices[s] + " (rank " + std::to_string(rank) + ")";
        po.backends.push_back([](nl::graph&, const std::vector<std::size_t>&) -> std::shared_ptr<nl::backend> {
          throw std::logic_error("pipeline engine: a stage of another rank was asked for here");
        });
        continue;
      }
      if (po.link && devices[s] == "cuda") ordinal = cuda_ordinal_of_rank(entries > stages);
      auto& dev = opened_[{backend, ordinal}];
      if (!dev) {
        gpu::device_options d;
        d.backend = gpu::backend_kind(backend);
        d.ordinal = ordinal;
        if (rt.trace().enabled()) d.recorder = &rt.trace();  // GPU spans on a track per stream
        dev = std::make_unique<gpu::device>(d);
      }
      out_.device_of[s] = devices[s] + " (" + dev->name() + (po.link ? ", rank " + std::to_string(me) : "") + ")";
      gpu::device_backend_options so;
      so.optimizer = gpu::device_optimizer{o.optimizer, o.lr, o.momentum, o.weight_decay, o.nesterov};
      // The last stage's loss stages a batch's labels: a training batch's, or an evaluation's.
      so.max_batch = std::max({so.max_batch, o.batch, nl::evaluation_rows});
      po.backends.push_back([d = dev.get(), so](nl::graph& g, const std::vector<std::size_t>& nodes) mutable {
        so.nodes = nodes;
        return std::make_shared<gpu::device_backend>(*d, g, so);
      });
    }
    po.stall_timeout_s = o.stall_timeout;
    nl::set_gemm_threads(1);  // one product thread per stage loop
    pipe_ = std::make_unique<np::pipeline>(rt, graphs, pieces, plan, std::make_shared<nl::cross_entropy>(),
                                           nl::make_optimizer_factory(o), po);
    min_rows_ = std::size_t(plan.micro_batches) * pipe_->replicas();
    if (announce)
      for (std::uint32_t s = 0; s < stages; ++s) std::printf("stage %u on %s\n", s, out_.device_of[s].c_str());
  }

  /// The CUDA device of this rank when none is named: its local rank's, modulo the devices
  /// it sees. Replicas across ranks sum with NCCL where it is built, which refuses two
  /// ranks on one GPU: with more ranks on this machine than GPUs, say so before starting.
  static int cuda_ordinal_of_rank(bool replicas_across_ranks) {
    const int count = gpu::device::cuda_device_count(), local = job::local_rank(), here = job::local_size();
    if (count == 0) return 0;  // opening it says there is none
    if (replicas_across_ranks && here > count && gpu::nccl_comms::available())
      throw std::invalid_argument(std::to_string(here) + " ranks on this machine share its " + std::to_string(count) +
                                  " CUDA device(s): replicas across ranks sum with NCCL, which takes one GPU per rank "
                                  "(start at most " + std::to_string(count) + " ranks per machine)");
    return local % count;
  }

  /// In a multi-rank job (`j.size() > 1`): a failed step ends this rank at once (`job::fail`,
  /// as `app`), and the trace is the job's merged one. `j` outlives the engine.
  void join(const job& j, const char* app) {
    if (j.size() > 1) job_ = &j, app_ = app;
  }

  std::future<nl::step_result> train_step(nl::tensor x, nl::targets y, std::size_t, std::uint64_t step,
                                          double lr) override {
    std::promise<nl::step_result> p;
    try {
      const auto t0 = std::chrono::steady_clock::now();
      auto r = pipe_->train_step(std::move(x), y, step, lr);
      out_.train_seconds += seconds_since(t0);
      out_.trained += r.samples;
      p.set_value(r);
    } catch (const std::exception& e) {
      // Across ranks a failed step ends the process here, before any unwinding could wait
      // on ranks that are still in their step (see apps/common/job.hpp).
      if (job_) job_->fail(app_, e.what());
      p.set_exception(std::current_exception());
    }
    downloaded_ = false;
    return p.get_future();
  }

  /// Evaluation runs on the pipeline's own layer actors, in evaluation mode, on the
  /// stages' loops, devices and ranks (a collective across ranks).
  std::future<nl::step_result> evaluate(nl::tensor x, nl::targets y) override {
    std::promise<nl::step_result> p;
    try {
      p.set_value(pipe_->evaluate(std::move(x), y));
    } catch (const std::exception& e) {
      if (job_) job_->fail(app_, e.what());
      p.set_exception(std::current_exception());
    }
    return p.get_future();
  }
  std::size_t min_rows() const override { return min_rows_; }

  void finish() override {
    if (!downloaded_) pipe_->download();
    downloaded_ = true;
    out_.metrics = pipe_->metrics();
    out_.measured = np::measured_table(*pipe_);
    np::name_stage_tracks(rt_, *pipe_);  // one lane per stage in trace viewers
  }
  void trace_metadata(nlohmann::json& extra) const override { extra.update(pipe_->trace_metadata()); }
  /// Across ranks: the job's one merged trace (every rank calls it).
  bool write_trace(actors::runtime& rt, const std::string& path, const nlohmann::json& extra) override {
    if (!job_) return false;
    job_->write_trace(*link_, rt, path, extra);
    return true;
  }
  nl::optimizer_state optimizer_state_of() override { return pipe_->optimizer_state_of(); }
  void load_optimizer_state(const nl::optimizer_state& state) override { pipe_->load_optimizer_state(state); }
  void sync_weights() override {
    if (!downloaded_) pipe_->download();
    downloaded_ = true;
  }

 private:
  actors::runtime& rt_;
  pipeline_outcome& out_;
  // Devices open after the runtime and close before it: they post to its loops.
  std::map<std::pair<int, int>, std::unique_ptr<gpu::device>> opened_;
  std::unique_ptr<np::pipeline> pipe_;  // destroyed before the devices its stages use
  std::size_t min_rows_ = 1;
  bool downloaded_ = true;
  std::shared_ptr<np::rank_link> link_;  // across ranks (null in one process)
  const job* job_ = nullptr;            // set by `join` in a multi-rank job
  const char* app_ = "";
};


}  // namespace nerve::apps

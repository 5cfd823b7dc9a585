#include "layers/pipeline/engine.hpp"

#include <chrono>
#include <future>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "layers/gemm.hpp"

namespace nerve::pipeline {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

pipeline_engine::pipeline_engine(actors::runtime& rt, const std::vector<layers::graph*>& graphs,
                                 const partition& pieces, const schedule& plan, const layers::train_options& o,
                                 pipeline_options po, const std::vector<std::string>& devices, engine_outcome& out,
                                 engine_job job)
    : rt_(rt), out_(out), job_(std::move(job)) {
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
  // ("cuda") takes its local rank's (layers::device_request::ranked).
  const int me = po.link ? po.link->rank() : 0;
  link_ = po.link;
  const auto replicas = std::uint32_t(graphs.size());
  const std::uint32_t entries = po.link && replicas > 1 ? stages * replicas : stages;
  po.backends.clear();
  for (std::uint32_t k = 0; k < entries && k % stages < devices.size(); ++k) {
    const std::uint32_t s = k % stages;
    const auto spec = layers::parse_device(devices[s], "--devices");
    const int rank = po.link ? (po.ranks.empty() ? int(k) : po.ranks[k]) : 0;
    if (spec.cpu()) {
      po.backends.push_back(nullptr);
      continue;
    }
    if (rank != me) {
      if (k == s) out_.device_of[s] = devices[s] + " (rank " + std::to_string(rank) + ")";
      po.backends.push_back([](layers::graph&, const std::vector<std::size_t>&) -> std::shared_ptr<layers::backend> {
        throw std::logic_error("pipeline engine: a stage of another rank was asked for here");
      });
      continue;
    }
    auto& dev = opened_[spec.text];
    if (!dev)
      dev = layers::open_device(spec, layers::device_request{.rt = &rt, .replicas_across_ranks = entries > stages,
                                                             .ranked = po.link != nullptr});
    out_.device_of[s] = devices[s] + " (" + dev->name() + (po.link ? ", rank " + std::to_string(me) : "") + ")";
    // The last stage's loss stages a batch's labels: a training batch's, or an evaluation's.
    po.backends.push_back([d = dev.get(), settings = layers::optimizer_settings_of(o),
                           rows = std::max(o.batch, layers::evaluation_rows)](
                              layers::graph& g, const std::vector<std::size_t>& nodes) {
      return d->make_backend(g, nodes, settings, rows);
    });
  }
  po.stall_timeout_s = o.stall_timeout;
  layers::set_gemm_threads(1);  // one product thread per stage loop
  pipe_ = std::make_unique<pipeline>(rt, graphs, pieces, plan, std::make_shared<layers::cross_entropy>(),
                                     layers::make_optimizer_factory(o), po);
  min_rows_ = std::size_t(plan.micro_batches) * pipe_->replicas();
}

pipeline_engine::~pipeline_engine() = default;

template <class F>
std::future<layers::step_result> pipeline_engine::guarded(F&& f) {
  std::promise<layers::step_result> p;
  try {
    p.set_value(f());
  } catch (const std::exception& e) {
    // Across ranks a failure ends the process here, before any unwinding could wait on
    // ranks that are still in their step.
    if (job_.fail) job_.fail(e.what());
    p.set_exception(std::current_exception());
  }
  return p.get_future();
}

std::future<layers::step_result> pipeline_engine::train_step(layers::tensor x, layers::targets y, std::size_t,
                                                             std::uint64_t step, double lr) {
  downloaded_ = false;
  return guarded([&] {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = pipe_->train_step(std::move(x), y, step, lr);
    out_.train_seconds += seconds_since(t0);
    out_.trained += r.samples;
    return r;
  });
}

std::future<layers::step_result> pipeline_engine::evaluate(layers::tensor x, layers::targets y) {
  return guarded([&] { return pipe_->evaluate(std::move(x), y); });
}

std::future<layers::tensor> pipeline_engine::predict(layers::tensor x) {
  std::promise<layers::tensor> p;
  try {
    p.set_value(pipe_->predict(std::move(x)));
  } catch (const std::exception& e) {
    if (job_.fail) job_.fail(e.what());  // as `guarded`: across ranks, leave before unwinding
    p.set_exception(std::current_exception());
  }
  return p.get_future();
}

void pipeline_engine::sync_weights() {
  if (!downloaded_) pipe_->download();
  downloaded_ = true;
}

void pipeline_engine::finish() {
  sync_weights();
  out_.metrics = pipe_->metrics();
  out_.measured = measured_table(*pipe_);
  name_stage_tracks(rt_, *pipe_);  // one lane per stage in trace viewers
}

void pipeline_engine::trace_metadata(nlohmann::json& extra) const { extra.update(pipe_->trace_metadata()); }

bool pipeline_engine::write_trace(actors::runtime& rt, const std::string& path, const nlohmann::json& extra) {
  if (!link_ || !job_.write_trace) return false;
  job_.write_trace(rt, *link_, path, extra);
  return true;
}

bool pipeline_engine::agree_stop(bool local) {
  if (!link_) return local;
  const int mine = local ? (job_.stop_code ? job_.stop_code() : 1) : 0;
  // Watched: a rank stopped after its last gradient of a step lets the others finish that
  // step, and they would wait here for ever.
  const auto all = pipe_->gather_watched(std::to_string(mine), "the agreement on whether to stop before the next step");
  for (std::size_t r = 0; r < all.size(); ++r) {
    const int code = std::stoi(all[r]);
    if (code == 0) continue;
    if (job_.stopped_by) job_.stopped_by(int(r), code);
    return true;
  }
  return false;
}

layers::optimizer_state pipeline_engine::optimizer_state_of() { return pipe_->optimizer_state_of(); }
void pipeline_engine::load_optimizer_state(const layers::optimizer_state& state) { pipe_->load_optimizer_state(state); }

}  // namespace nerve::pipeline

#include "layers/trainer.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <tuple>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <system_error>

#include "actors/runtime.hpp"
#include "layers/checkpoint/atomic_file.hpp"
#include "layers/checkpoint/checkpoint.hpp"
#include "layers/data/batcher.hpp"
#include "layers/data/dataset.hpp"
#include "layers/data/detail/file_bytes.hpp"
#include "layers/detail/resume_check.hpp"
#include "layers/detail/train_state.hpp"
#include "layers/detail/vector_state.hpp"
#include "layers/early_stop.hpp"
#include "layers/gemm.hpp"
#include "layers/inference.hpp"
#include "layers/layer_actor.hpp"
#include "layers/lr_schedule.hpp"
#include "layers/presets.hpp"
#include "layers/run_files.hpp"
#include "layers/train_data.hpp"

#include <nlohmann/json.hpp>

namespace nerve::layers {

namespace {

/// A batch ready for the network.
struct prepared_batch {
  tensor x;
  targets y;
};

struct load_batch {
  static constexpr std::string_view kind = "load_batch";
  std::uint64_t epoch = 0;
  std::size_t index = 0;
};

/// Owns the training set's batcher; prepares batches (shuffled per epoch, seeded, then
/// augmented) on its own loop, so the next batch is copied while the network trains on the
/// current one.
class loader_actor : public actors::actor {
 public:
  loader_actor(std::shared_ptr<const data::dataset> ds, data::batcher_options opts, shape sample,
               data::augment_options augment = {})
      : actor("loader"), ds_(std::move(ds)), batcher_(ds_->size(), opts), sample_(std::move(sample)), augment_(augment) {
    on<load_batch>([this](load_batch& r) {
      if (batcher_.epoch() != r.epoch) batcher_.set_epoch(r.epoch);
      const auto rows = batcher_.indices(r.index).size();
      prepared_batch b{tensor(static_cast<std::int64_t>(rows), sample_), {}};
      b.y.labels.resize(rows * ds_->labels_per_sample);
      b.y.labels_per_sample = static_cast<std::int64_t>(ds_->labels_per_sample);
      const std::span<float> values(b.x.data(), static_cast<std::size_t>(b.x.size()));
      batcher_.gather(*ds_, r.index, values, b.y.labels);
      // Keyed on (seed, epoch, sample): a resumed run's batches are the uninterrupted run's.
      data::augment_batch(augment_, batcher_.options().seed, r.epoch, batcher_.indices(r.index), ds_->sample_shape,
                          ds_->zero_value(), values);
      return b;
    });
  }

 private:
  std::shared_ptr<const data::dataset> ds_;
  data::batcher batcher_;
  shape sample_;
  data::augment_options augment_;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

optimizer_factory make_optimizer_factory(const train_options& o) {
  auto make = [name = o.optimizer, lr = o.lr, momentum = o.momentum, decay = o.weight_decay, nesterov = o.nesterov,
               beta2 = o.beta2] {
    return make_optimizer<float>(name, lr, momentum, decay, nesterov, beta2);
  };
  (void)make();  // an unknown optimizer throws here, before a network is built
  return make;
}

using detail::read_state;
using detail::read_train_state;
using detail::run_position;
using detail::settings_of;
using detail::write_train_state;

namespace {

/// `train_options::metrics`: one JSON object a line. Each line goes out in one write(2)
/// on an O_APPEND descriptor, unbuffered: `tail -f` sees it at once, and a process killed
/// between two steps leaves only whole lines (no stdio buffer to lose or cut). A write
/// cut short (a full disk) is cut back off, and a resumed run first cuts a torn last
/// line (`end_at_last_line`), so its lines never continue a fragment.
class metrics_log {
 public:
  /// Opens `path` (its symlinks followed, a non-regular file refused), emptied unless `append`.
  metrics_log(const std::filesystem::path& path, bool append) : path_(path) {
    const auto target = checkpoint::replace_target(path);
    fd_ = ::open(target.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC | (append ? 0 : O_TRUNC), 0666);
    if (fd_ < 0) throw std::system_error(errno, std::generic_category(), "--metrics " + path.string() + ": cannot open it");
    if (append) end_at_last_line(fd_, "--metrics " + path.string());  // its next line starts a line
  }
  metrics_log(const metrics_log&) = delete;
  metrics_log& operator=(const metrics_log&) = delete;
  ~metrics_log() { ::close(fd_); }
  /// Writes `record` (ordered: `kind` first, for a reader of the raw file) as one line.
  void write(const nlohmann::ordered_json& record) {
    const auto line = record.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
    if (!append_whole_line(fd_, std::as_bytes(std::span(line))))
      throw std::system_error(errno, std::generic_category(), "--metrics " + path_.string() + ": cannot write");
  }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
};

/// JSON has no NaN or Inf: a non-finite figure (`--allow-nonfinite`) is written as null.
nlohmann::ordered_json finite_or_null(double v) {
  return std::isfinite(v) ? nlohmann::ordered_json(v) : nlohmann::ordered_json(nullptr);
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char b[32];
  std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return b;
}

/// What a resume may change of its run's limits: `epochs` and `steps` raised, never lowered
/// (the run would end before the point its checkpoint already passed, or be cut short
/// unseen); and with a schedule that spans the run's total of steps, not that total (the
/// rates of the steps already taken were those of the shorter run, so the extended one
/// would equal no run started with its settings). `planned_*` are the checkpoint's.
void check_resumed_limits(const train_options& o, int planned_epochs, std::int64_t planned_steps,
                          std::int64_t per_epoch, std::int64_t total_steps) {
  const std::string ck = " (--resume " + o.resume.string() + ")";
  if (o.epochs < planned_epochs)
    throw std::invalid_argument("--epochs " + std::to_string(o.epochs) + " is below the checkpoint's " +
                                std::to_string(planned_epochs) + ": a resumed run may be extended, not shortened" + ck);
  if (o.steps != planned_steps && o.steps != -1 && (planned_steps == -1 || o.steps < planned_steps))
    throw std::invalid_argument("--steps " + std::to_string(o.steps) + " is below the checkpoint's " +
                                (planned_steps == -1 ? std::string("limit (none: its epochs end it)")
                                                     : std::to_string(planned_steps)) +
                                ": a resumed run may be extended, not shortened" + ck);
  const std::int64_t planned_total = planned_steps >= 0 ? std::min(planned_steps, per_epoch * planned_epochs)
                                                        : per_epoch * planned_epochs;
  if (o.schedule != "none" && total_steps != planned_total)
    throw std::invalid_argument(
        (o.epochs != planned_epochs ? "--epochs " + std::to_string(o.epochs) : "--steps " + std::to_string(o.steps)) +
        " would extend the run from " + std::to_string(planned_total) + " to " + std::to_string(total_steps) +
        " steps, but its --schedule " + o.schedule + " spans the " + std::to_string(planned_total) +
        " steps it was started for: the steps taken had the shorter run's rates. Resume it as it was, or start a "
        "new run from its weights with --init " + o.resume.string());
}

/// `early_stop`, `save_best` and `lr_find`: each in its range and with what it needs.
void check_stopping_options(const train_options& o) {
  if (o.early_stop && *o.early_stop < 1)
    throw std::invalid_argument("--early-stop must be at least 1 evaluation without improvement (got " +
                                std::to_string(*o.early_stop) + ")");
  if (o.early_stop && !o.evaluate)
    throw std::invalid_argument("--early-stop watches the test loss after each epoch: it cannot be given with --no-eval");
  if (!o.save_best.empty() && !o.evaluate)
    throw std::invalid_argument("--save-best keeps the weights of the best evaluation: it cannot be given with --no-eval");
  if (!o.lr_find) return;
  check_lr_range(*o.lr_find);
  const std::pair<const char*, bool> excluded[] = {
      {"--resume", !o.resume.empty()},     {"--checkpoint", !o.checkpoint.empty()},
      {"--save", !o.save.empty()},         {"--save-best", !o.save_best.empty()},
      {"--early-stop", bool(o.early_stop)}, {"--steps", o.steps != -1},
      {"--schedule", o.schedule != "none"}};
  for (const auto& [flag, given] : excluded)
    if (given)
      throw std::invalid_argument(std::string(flag) + " cannot be given with --lr-find: the range test sets the rate "
                                  "of every step and its weights are those of a run driven to diverge");
}

}  // namespace

train_options resume_options(const std::filesystem::path& path) {
  const auto d = checkpoint::load_checkpoint(path);
  const auto j = read_state(d, path);
  try {
    const auto& s = j.at("settings");
    detail::check_settings_json(s, path.string());
    auto o = s.get<train_options>();
    o.app_settings = s.at("app");
    if (s.contains("beta2")) o.beta2 = s["beta2"].get<double>();
    if (s.contains("normalize")) o.normalize = data::normalization{s["normalize"].at(0), s["normalize"].at(1)};
    for (const auto& [key, files] : {std::pair{"train_data", &o.train_data}, std::pair{"test_data", &o.test_data}})
      if (s.contains(key))
        *files = {s[key].at(0).get<std::string>(), s[key].at(1).get<std::string>()};
    if (s.contains("augment")) {
      try {
        o.augment = data::parse_augment(s["augment"].get<std::string>());
      } catch (const std::invalid_argument& e) {
        throw std::invalid_argument("--resume " + path.string() + ": settings: augment: " + e.what());
      }
    }
    o.resume = path;
    o.checkpoint = path;  // a resumed run goes on saving its state where it was
    detail::check_restored_settings(o, path.string());
    return o;
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument("--resume " + path.string() + ": unreadable settings: " + e.what());
  }
}

void check_options(const train_options& o) {
  auto num = [](double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", v);
    return std::string(b);
  };
  auto refuse = [](const std::string& what) { throw std::invalid_argument(what); };
  if (o.epochs < 1) refuse("--epochs must be at least 1 (got " + std::to_string(o.epochs) + ")");
  if (o.steps != -1 && o.steps < 1) refuse("--steps must be at least 1 (got " + std::to_string(o.steps) + ")");
  if (o.batch == 0) refuse("--batch must be at least 1 (got 0)");
  if (o.micro_batches == 0 || o.micro_batches > o.batch)
    refuse("--microbatches must be between 1 and the batch size " + std::to_string(o.batch) + " (got " +
           std::to_string(o.micro_batches) + ")");
  // Written so that NaN fails every test: it compares false with everything.
  if (!(std::isfinite(o.lr) && o.lr > 0)) refuse("--lr must be a finite number above 0 (got " + num(o.lr) + ")");
  if (!(o.momentum >= 0 && o.momentum < 1)) refuse("--momentum must be in [0, 1) (got " + num(o.momentum) + ")");
  if (!(std::isfinite(o.weight_decay) && o.weight_decay >= 0))
    refuse("--weight-decay must be a finite number, 0 or more (got " + num(o.weight_decay) + ")");
  if (!(o.beta2 >= 0 && o.beta2 < 1)) refuse("beta2 (Adam's second-moment decay) must be in [0, 1) (got " + num(o.beta2) + ")");
  if (o.optimizer != "sgd" && o.optimizer != "adam" && o.optimizer != "adamw")
    refuse("unknown --optimizer '" + o.optimizer + "' (sgd, adam, adamw)");
  if (o.nesterov && o.optimizer == "sgd" && o.momentum == 0)
    refuse("--nesterov needs a --momentum above 0 (as torch.optim.SGD)");
  if (o.schedule != "none" && o.schedule != "step" && o.schedule != "cosine")
    refuse("unknown --schedule '" + o.schedule + "' (none, step, cosine)");
  if (o.normalize && (!std::isfinite(o.normalize->mean) || !std::isfinite(o.normalize->std) || !(o.normalize->std > 0)))
    refuse("--normalize MEAN,STD must be finite numbers with STD above 0 (got " + num(o.normalize->mean) + "," +
           num(o.normalize->std) + ")");
  if (!(std::isfinite(o.stall_timeout) && o.stall_timeout >= 0))
    refuse("--stall-timeout must be 0 (no watch) or a positive number of seconds (got " + num(o.stall_timeout) + ")");
  if (o.threads < 1 || o.threads > max_threads)
    refuse("--threads must be between 1 and " + std::to_string(max_threads) + " (got " + std::to_string(o.threads) +
           "): each is an event loop with its own thread and memory");
  check_stopping_options(o);
  for (const auto& [flag, files] : {std::pair{"--train-data", &o.train_data}, std::pair{"--test-data", &o.test_data}})
    if (!files->empty() && (files->inputs.empty() || files->labels.empty()))
      refuse(std::string(flag) + " needs two files, INPUTS.npy,LABELS.npy");
  const bool own_train = o.train_set || !o.train_data.empty(), own_test = o.test_set || !o.test_data.empty();
  if (own_train && !own_test && o.evaluate && !o.lr_find)
    refuse("--train-data needs --test-data INPUTS.npy,LABELS.npy to evaluate on (or --no-eval)");
  if (!o.lead) return;  // the files are the lead's, on its machine
  // Before a long run, not after it: a FIFO, a device or a directory that is not there is
  // refused (atomic_file).
  for (const auto* target : {&o.save, &o.trace, &o.checkpoint, &o.metrics, &o.save_best})
    if (!target->empty()) checkpoint::replace_target(*target);
  // Before anything is written: one file under two options would be overwritten by one.
  check_distinct_files(o);
}

train_report train(graph& g, const train_options& o, const std::function<void(const train_progress&)>& on_progress,
                   const std::function<void(const epoch_stats&)>& on_epoch, engine_factory make_engine) {
  check_options(o);
  // Held to the end of the run: a second run given the same checkpoint or metrics is refused.
  const run_files claimed(o);
  if (!make_engine) make_engine = engine_for(o.device);

  optimizer_state resumed_opt;
  run_position pos;
  if (!o.resume.empty())
    std::tie(resumed_opt, pos) = read_train_state(o.resume, g, o.allow_nonfinite);
  else if (!o.init.empty())
    load_weights(g, o.init, o.allow_nonfinite);
  // Your own data's labels must name one of the graph's outputs.
  const std::size_t classes = output_classes(g);
  auto train_set = run_training_set(o, classes);
  std::shared_ptr<const data::dataset> test_set;
  if (o.evaluate && !o.lr_find)  // a range test only trains
    test_set = run_test_set(o, classes);
  // Files are checked as they load (naming the file and the sample); sets in memory here.
  for (const auto* set : {&train_set, &test_set})
    if (*set && *set == (set == &train_set ? o.train_set : o.test_set) && (*set)->classes > classes)
      throw std::invalid_argument("the " + std::string(set == &train_set ? "training" : "test") + " set has " +
                                  std::to_string((*set)->classes) + " classes but " +
                                  (is_preset(g, o.model) ? "model '" + o.model + "'" : "your graph") + " has " +
                                  std::to_string(classes) + " outputs");

  const auto& in_node = g.nodes()[g.inputs()[0]];
  const shape sample = in_node.output_shape;
  // `o.model` keeps its default under a user's own graph: it names the graph only when it is that preset.
  if (static_cast<std::size_t>(sample.numel()) != train_set->features())
    throw std::invalid_argument(
        (is_preset(g, o.model) ? "model '" + o.model + "'" : "your graph's input '" + in_node.name + "'") +
        " takes samples of " + sample.to_string() + " but the data has " + std::to_string(train_set->features()) +
        " features");
  if (test_set) check_test_samples(*train_set, *test_set, o);
  data::check_augment(o.augment, train_set->sample_shape);

  set_gemm_threads(static_cast<int>(o.threads));
  actors::runtime rt({.loops = o.threads,
                      .record = !o.trace.empty(),
                      .record_timing = o.trace_exact ? actors::recorder::timing::exact : actors::recorder::timing::shared});
  // The loader sits on the last loop: with 2+ loops it prepares batches beside the network.
  auto loader = rt.spawn_on<loader_actor>(o.threads - 1, train_set,
                                          data::batcher_options{o.batch, o.shuffle, o.seed, false}, sample, o.augment);
  // Declared after the runtime, so destroyed before it: a device engine's completions
  // post to the runtime's loops.
  // A range test goes on through non-finite gradients: its loss says when it diverged.
  train_options engine_options = o;
  if (o.lr_find) engine_options.allow_nonfinite = true;
  auto engine = make_engine(rt, g, engine_options);
  if (!o.resume.empty()) engine->load_optimizer_state(resumed_opt);
  auto save_state = [&](const run_position& at) {
    engine->sync_weights();
    auto state = engine->optimizer_state_of();  // on every rank: across ranks it is gathered
    if (o.lead) write_train_state(o.checkpoint, g, state, o, at);
  };
  const std::size_t batches = (train_set->size() + o.batch - 1) / o.batch;
  // The run ends at the first limit reached, epochs or steps, and the schedule spans the
  // steps it will take: a last batch smaller than the engine takes is no step.
  const std::size_t full = train_set->size() / o.batch, tail = train_set->size() % o.batch;
  const std::int64_t per_epoch = std::int64_t(o.batch >= engine->min_rows() ? full : 0) +
                                 (tail > 0 && tail >= engine->min_rows() ? 1 : 0);
  if (per_epoch == 0)
    throw std::invalid_argument("--batch " + std::to_string(o.batch) + ": the " + std::to_string(train_set->size()) +
                                " training rows make no batch of the " + std::to_string(engine->min_rows()) +
                                " rows or more this engine needs");
  // A range test takes its steps whatever the epochs: as many epochs as they need.
  const int epochs = o.lr_find ? int((o.lr_find->steps + per_epoch - 1) / per_epoch) : o.epochs;
  const std::int64_t total_steps = o.lr_find ? o.lr_find->steps
                                   : o.steps >= 0 ? std::min(o.steps, per_epoch * o.epochs)
                                                  : per_epoch * o.epochs;
  std::optional<lr_finder> finder;
  if (o.lr_find) finder.emplace(*o.lr_find);
  auto lr_at = [&](std::int64_t t) {
    if (o.lr_find) return lr_range_rate(*o.lr_find, t);
    if (o.schedule == "none") return o.lr;
    if (o.schedule == "step") return step_lr{o.lr, std::max<std::int64_t>(1, total_steps / 3)}(t);
    if (o.schedule == "cosine") return cosine_lr{o.lr, std::max<std::int64_t>(1, total_steps)}(t);
    throw std::invalid_argument("unknown --schedule '" + o.schedule + "' (none, step, cosine)");
  };

  if (!o.resume.empty()) {
    std::int64_t steps_done = 0;
    for (const auto& e : pos.done)  // saturating: a forged count must not overflow before it is refused
      steps_done = e.steps > std::numeric_limits<std::int64_t>::max() - steps_done ? std::numeric_limits<std::int64_t>::max()
                                                                                    : steps_done + e.steps;
    check_resumed_limits(o, pos.planned_epochs, pos.planned_steps, per_epoch, total_steps);
    detail::check_resumed_position({pos.step, pos.epoch, pos.batch, pos.loss_sum, pos.correct, pos.seen,
                                    pos.epoch_steps, pos.done.size(), steps_done},
                                   resumed_opt.counters, o, {total_steps, batches});
  }

  train_report report;
  report.parameters = g.parameter_count();
  report.epochs = pos.done;
  // A resumed run's best and patience go on from its checkpoint's evaluations.
  best_evaluation best(o.early_stop);
  for (const auto& e : pos.done)
    if (o.evaluate && !e.interrupted) best.add(e.epoch, e.test_loss);
  std::int64_t step = pos.step;
  // Accuracy is over labels: a sample's, or each of a sequence's tokens (`gpt`).
  const double labels_each = double(train_set->labels_per_sample);
  if (!o.resume.empty() && !(pos.epoch < o.epochs && step < total_steps)) {
    // The checkpoint's run is at its end: nothing to train, and no record of a run that
    // did not happen (metrics, checkpoint, trace). --save still writes its weights.
    report.nothing_left = true;
    report.steps = step;
    engine->finish();
    rt.synchronize();
    if (!o.save.empty() && o.lead) save_weights(g, o.save, o.model);
    return report;
  }
  // Opened only now, with the run about to start: a run refused above leaves the old file.
  std::optional<metrics_log> metrics;
  if (!o.metrics.empty() && o.lead) {
    metrics.emplace(o.metrics, !o.resume.empty());
    nlohmann::ordered_json run = {{"kind", "run"},
                                  {"format", "nerve-metrics-1"},
                                  {"time", utc_now()},
                                  {"parameters", report.parameters},
                                  {"total_steps", total_steps},
                                  {"steps_per_epoch", per_epoch},
                                  {"batches_per_epoch", batches},
                                  {"settings", nlohmann::ordered_json(settings_of(o))}};
    // What the resumed run replays: the steps from here on, the epoch under way.
    if (!o.resume.empty()) run["resume"] = {{"step", pos.step}, {"epoch", pos.epoch + 1}};
    // A range test: `nerve-trace curves` draws its losses against its rates.
    if (o.lr_find)
      run["lr_find"] = {{"min_lr", o.lr_find->min_lr}, {"max_lr", o.lr_find->max_lr}, {"steps", o.lr_find->steps}};
    metrics->write(run);
  }
  // Asked on every rank at the same points (the engine agrees across ranks).
  auto stop_requested = [&] { return engine->agree_stop(o.stop && o.stop->load(std::memory_order_relaxed)); };
  bool evaluated = false;  // an epoch of this process ended with an evaluation
  report.early_stopped = best.exhausted();  // a resumed run that had stopped early stays stopped
  bool diverged = false;                    // the range test's loss diverged
  for (int epoch = pos.epoch; epoch < epochs && step < total_steps && !report.interrupted && !report.early_stopped &&
                              !diverged;
       ++epoch) {
    const auto t0 = std::chrono::steady_clock::now();
    const bool resumed = epoch == pos.epoch;  // a checkpoint's epoch goes on where it stood
    const std::size_t first_batch = resumed ? pos.batch : 0;
    epoch_stats st;
    st.epoch = epoch + 1;
    st.steps = resumed ? pos.epoch_steps : 0;
    double loss_sum = resumed ? pos.loss_sum : 0;
    std::int64_t correct = resumed ? pos.correct : 0, seen = resumed ? pos.seen : 0;
    const std::int64_t seen_before = seen;  // samples/s counts this process's samples only
    std::size_t stopped_at = batches;      // the next batch, when a stop request ends the epoch
    auto step_began = t0;                  // a step's time includes waiting for its batch
    std::future<prepared_batch> next;
    if (first_batch < batches)
      next = rt.ask<prepared_batch>(loader, load_batch{std::uint64_t(epoch), first_batch}, std::chrono::nanoseconds::max());
    // Up to `depth` steps run at once (a device enqueues the next while it runs one); their
    // figures are read in order. Nothing is in flight at a checkpoint or a stop.
    struct flying_step {
      std::future<step_result> result;
      std::size_t batch;
      double lr;
    };
    std::deque<flying_step> flying;
    const std::size_t depth = std::max<std::size_t>(1, engine->steps_in_flight());
    // A step that stalls ends the run, keeping the trace so far: this process's part,
    // written without waiting for the loops (a blocked one may never answer).
    auto keeping_trace = [&](auto&& run) -> decltype(run()) {
      try {
        return run();
      } catch (const stall_error&) {
        if (!o.trace.empty() && o.lead) {
          nlohmann::json extra = {{"model", o.model}, {"device", o.device}, {"stalled", true}};
          engine->trace_metadata(extra);
          rt.write_trace(o.trace.string(), extra);
        }
        throw;
      }
    };
    auto settle = [&] {
      auto f = std::move(flying.front());
      flying.pop_front();
      const std::size_t b = f.batch;
      auto r = keeping_trace([&] { return f.result.get(); });
      if (metrics) {  // before the loss check: the curve of a diverged run shows its last step
        const auto now = std::chrono::steady_clock::now();
        const double s = std::chrono::duration<double>(now - step_began).count();
        step_began = now;
        metrics->write({{"kind", "step"}, {"step", step}, {"epoch", epoch + 1}, {"batch", b + 1},
                        {"loss", finite_or_null(r.loss)},
                        {"accuracy", r.samples ? double(r.correct) / (double(r.samples) * labels_each) : 0.0},
                        {"lr", f.lr},
                        {"samples", r.samples}, {"seconds", s},
                        {"samples_per_s", s > 0 ? double(r.samples) / s : 0.0}});
      }
      if (finder && !finder->add(f.lr, r.loss)) diverged = true;  // the range test ends here
      if (!std::isfinite(r.loss) && !o.allow_nonfinite && !finder)
        throw std::runtime_error("step " + std::to_string(step) + " (epoch " + std::to_string(epoch + 1) + ", batch " +
                                 std::to_string(b + 1) + "): the loss is " + (std::isnan(r.loss) ? "nan" : "inf") +
                                 " (on the output of layer '" + g.nodes()[g.output()].name +
                                 "'): training diverged (a lower --lr may help; --allow-nonfinite goes on regardless)");
      ++step;
      ++st.steps;
      loss_sum += r.loss * double(r.samples);
      correct += r.correct;
      seen += r.samples;
      if (on_progress) {
        detail::enter_user_code();
        on_progress({epoch + 1, b + 1, batches, loss_sum / double(seen), double(seen - seen_before) / seconds_since(t0)});
      }
      if (!o.checkpoint.empty() && o.checkpoint_every > 0 && step % o.checkpoint_every == 0)
        save_state({step, epoch, b + 1, loss_sum, correct, seen, st.steps, report.epochs});
    };
    std::size_t b = first_batch;  // after the loop: the epoch's next batch, where a step limit cut it
    for (; b < batches && step + std::int64_t(flying.size()) < total_steps && !diverged; ++b) {
      if (stop_requested()) {
        while (!flying.empty()) settle();
        st.interrupted = report.interrupted = true;
        stopped_at = b;
        break;
      }
      auto cur = next.get();
      if (b + 1 < batches)  // prefetch: the loader copies the next batch while this one trains
        next = rt.ask<prepared_batch>(loader, load_batch{std::uint64_t(epoch), b + 1}, std::chrono::nanoseconds::max());
      const auto rows = static_cast<std::size_t>(cur.x.batch());
      if (rows < engine->min_rows()) continue;  // a last batch too small to split as the engine must
      const std::int64_t n = step + std::int64_t(flying.size());  // this step's number
      // A checkpoint after the step before this one sees no later step begun.
      if (!o.checkpoint.empty() && o.checkpoint_every > 0 && n % o.checkpoint_every == 0)
        while (!flying.empty()) settle();
      const double lr = lr_at(n);
      flying.push_back({keeping_trace([&] {
                          return engine->train_step(std::move(cur.x), std::move(cur.y),
                                                    std::min(o.micro_batches, rows), std::uint64_t(n), lr);
                        }),
                        b, lr});
      if (flying.size() >= depth) settle();
    }
    while (!flying.empty()) settle();
    if (next.valid()) next.wait();  // a prefetched batch nobody needs
    if (!report.interrupted && stop_requested()) st.interrupted = report.interrupted = true;
    if (st.interrupted && st.steps == 0) break;  // nothing of this epoch to report
    st.seconds = seconds_since(t0);
    st.train_loss = seen ? loss_sum / double(seen) : 0;
    st.train_accuracy = seen ? double(correct) / (double(seen) * labels_each) : 0;
    st.samples_per_s = st.seconds > 0 ? double(seen - seen_before) / st.seconds : 0;
    if (test_set && !st.interrupted) {
      const auto began = rt.trace().now();
      const auto f = evaluate_set(*engine, *test_set, sample);
      // Its slice on track 0 beside the steps': the viewer counts it apart from the bubbles.
      if (rt.trace().enabled())
        rt.trace().span(0, "evaluation", "evaluate", began, rt.trace().now(), -1, nullptr, -1, -1, st.epoch);
      st.test_loss = f.loss;
      st.test_accuracy = f.accuracy;
      evaluated = true;
      if (best.add(st.epoch, st.test_loss) && !o.save_best.empty()) {
        engine->sync_weights();
        if (o.lead) save_weights(g, o.save_best, o.model);
      }
      if (best.exhausted()) report.early_stopped = true;
    }
    report.epochs.push_back(st);
    if (!o.checkpoint.empty()) {
      // Stopped mid-epoch, or cut by the step limit: a resume goes on with its next batch,
      // this epoch not done (a run extended by --steps then takes the batches the longer
      // run would have, in the same epoch).
      if (st.interrupted || b < batches)
        save_state({step, epoch, st.interrupted ? stopped_at : b, loss_sum, correct, seen, st.steps,
                    std::vector(report.epochs.begin(), report.epochs.end() - 1)});
      else
        save_state({step, epoch + 1, 0, 0, 0, 0, 0, report.epochs});
    }
    if (metrics) {  // after the checkpoint, so a resume starts at or after this line's step
      const bool tested = test_set && !st.interrupted;
      metrics->write({{"kind", "epoch"}, {"epoch", st.epoch}, {"step", step}, {"steps", st.steps},
                      {"train_loss", finite_or_null(st.train_loss)}, {"train_accuracy", st.train_accuracy},
                      {"test_loss", tested ? finite_or_null(st.test_loss) : nullptr},
                      {"test_accuracy", tested ? nlohmann::ordered_json(st.test_accuracy) : nullptr},
                      {"seconds", st.seconds}, {"samples_per_s", st.samples_per_s}, {"interrupted", st.interrupted}});
    }
    if (on_epoch) {
      detail::enter_user_code();
      on_epoch(st);
    }
  }
  report.steps = step;
  report.best_epoch = best.best_epoch();
  report.best_test_loss = best.best_loss();
  if (finder) report.lr_find = finder->result();
  // The last evaluation's predictions by class, on the same engine and weights.
  if (o.class_figures && evaluated && !report.interrupted) report.classes = count_classes(*engine, *test_set, sample);
  engine->finish();
  rt.synchronize();
  if (!o.trace.empty()) {
    nlohmann::json extra = {{"model", o.model}, {"device", o.device}};
    engine->trace_metadata(extra);
    if (!engine->write_trace(rt, o.trace.string(), extra) && o.lead) rt.write_trace(o.trace.string(), extra);
  }
  // A stopped run's weights too: those of its last step (`train_options::stop`).
  if (!o.save.empty() && o.lead) save_weights(g, o.save, o.model);
  return report;
}

train_report train(const train_options& o, const std::function<void(const train_progress&)>& on_progress,
                   const std::function<void(const epoch_stats&)>& on_epoch) {
  auto own = o;
  load_own_data(own);  // a text model's corpus sets its vocabulary and context
  auto g = make_preset_for(own);
  return train(g, own, on_progress, on_epoch);
}

}  // namespace nerve::layers

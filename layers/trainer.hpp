#pragma once
/// \file
/// `train`: the one training driver, behind `nerve-train` and `nerve-pipeline` on every
/// device and behind a user's own graph: Fashion-MNIST or your own data, a loader actor
/// that prepares the next batch while the network trains on the current one, the
/// learning-rate schedule, per-epoch evaluation, progress, trace and checkpoints.
///
/// ```
///   trainer thread          runtime (loops)                       train_engine
///   epoch loop ──ask──► loader actor (last loop): batch b+1
///        └──────────────── batch b ──────────────────────────► train_step (actors | device | stages)
///        ◄────────────────────────────── future<step_result> ◄──┘
/// ```
/// What differs by device or parallelism is the *engine* (`train_engine`): the layer
/// actors of a `network`, their kernels the CPU's or a device's (`train_options::device`,
/// a name of the one device registry, layers/devices.hpp), or a pipeline's stages
/// (`pipeline::pipeline_engine`, which nerve-pipeline and `nerve-train --replicas` hand
/// in). This file names no device.

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <future>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/runtime.hpp"
#include "layers/data/augment.hpp"
#include "layers/data/dataset.hpp"
#include "layers/devices.hpp"
#include "layers/graph.hpp"
#include "layers/lr_find.hpp"
#include "layers/network.hpp"
#include "layers/optimizer.hpp"

// The whole of nlohmann::json, not its forward declaration: an engine of a user's own
// fills `trace_metadata`'s object (tests/headers/user_engine.cpp).
#include <nlohmann/json.hpp>

namespace nerve::layers {

/// The most event loops (`train_options::threads`) a run may ask for: each loop is a
/// thread with its own arena, and past a few per core they cost start-up time and memory
/// without adding speed (docs/errors.md has what 10,000 cost).
inline constexpr unsigned max_threads = 256;

/// Everything a training run is told. `train` checks it first (`check_options`).
///
/// `epochs` and `steps` are both limits: the run ends at the first one reached, and the
/// learning-rate schedule spans the steps the run will take (a last batch too small for
/// the engine, `train_engine::min_rows`, is no step).
struct train_options {
  std::string model = "mlp";
  int epochs = 1;                   ///< at least 1
  std::int64_t steps = -1;          ///< stop after this many optimizer steps (-1: no limit; else at least 1)
  std::size_t batch = 256;
  std::size_t micro_batches = 1;
  std::string optimizer = "sgd";    ///< sgd, adam, adamw
  double lr = 0.1;
  double momentum = 0.0;
  bool nesterov = false;
  double weight_decay = 0.0;
  double beta2 = 0.999;             ///< adam, adamw: the second moment's decay (β₁ is 0.9)
  std::string schedule = "none";    ///< none, step (÷10 every third of the run), cosine
  std::string device = "cpu";       ///< where the layers' kernels run (layers/devices.hpp): cpu, cuda, cuda:N, standin
  unsigned threads = 1;             ///< event loops, and threads per matrix product
  bool spread = false;              ///< spread layers over the loops (else all on loop 0)
  std::uint64_t seed = 0;
  bool shuffle = true;
  std::filesystem::path data = "/usr/share/datasets/fashion-mnist";
  /// Your own data in place of Fashion-MNIST's under `data` (`nerve-train --train-data
  /// X.npy,Y.npy --test-data X.npy,Y.npy`): the training set's `.npy` inputs and labels
  /// (`data::load_npy_pair`), and the test set's, needed with `evaluate`. Kept in checkpoints.
  data::npy_files train_data, test_data;
  /// The training and test sets in memory (your own tensors, `data::make_dataset`, or the
  /// files above loaded once by the app), in place of `train_data`, `test_data` and
  /// `data`. Kept in no checkpoint: a resumed run is given them again.
  std::shared_ptr<const data::dataset> train_set, test_set;
  /// Augmentation of the training batches (layers/data/augment.hpp), keyed on (`seed`,
  /// epoch, sample): a resumed run augments as the uninterrupted one. Never evaluation's.
  data::augment_options augment;
  /// Inputs become `(x - mean) / std` after scaling to [0, 1], for the training and the
  /// test set alike (torchvision's `Normalize`); none: pixels in [0, 1], nothing else.
  std::optional<data::normalization> normalize;
  std::filesystem::path init;       ///< start from these weights (safetensors)
  std::filesystem::path save;       ///< write the weights here at the end (safetensors, atomic)
  std::filesystem::path trace;      ///< write the message trace here (Chrome trace JSON)
  bool trace_exact = false;         ///< time every handler run alone (recorder::timing::exact)
  bool evaluate = true;             ///< test accuracy after every epoch
  /// Write the full training state here (weights, optimizer state, position, settings;
  /// atomically, see `write_train_state`) every `checkpoint_every` steps and after every epoch.
  std::filesystem::path checkpoint;
  std::int64_t checkpoint_every = 0;  ///< steps between checkpoints (0: after every epoch only)
  /// Continue the run saved in this checkpoint (`resume_options` reads its settings).
  /// `epochs` and `steps` may be raised above the checkpoint's to extend the run (never
  /// lowered: refused naming both); with a schedule other than `none`, only where the run's
  /// total of steps stays the same, since the rates of the steps taken spanned that total.
  /// A run already at its end does nothing (`train_report::nothing_left`).
  std::filesystem::path resume;
  /// Write the training curves here as JSON lines (docs/trace.md, "Training curves"): a
  /// `run` line with the settings, then a `step` line per optimizer step and an `epoch`
  /// line per epoch, each written whole and at once, so `tail -f` follows the run and a
  /// stopped or killed run keeps complete lines. A fresh run replaces the file; a resumed
  /// run (`resume`) appends to it (`nerve-trace curves` keeps the later run's records of
  /// the steps it replays). Like `save`, it must be a regular file or none yet.
  std::filesystem::path metrics;
  /// An app's own settings (JSON text), kept in checkpoints and given back on resume.
  std::string app_settings;
  /// Go on through a non-finite loss or gradient, and load non-finite `init` weights
  /// (default: stop the run with an error naming the step and the layer, or the tensor).
  bool allow_nonfinite = false;
  /// Seconds a step may go with no layer or stage handling a message before the run ends
  /// with a `stall_error` saying who waits on whom; the trace so far is written (0: no watch).
  double stall_timeout = 60;
  /// When set and true, the run stops before its next step: the epoch so far is reported
  /// (`epoch_stats::interrupted`), the engine finishes, the trace is written, and so are
  /// the weights (`save`): those of the last step taken, the work the run did.
  /// A signal handler may set it (a lock-free atomic store is async-signal-safe).
  const std::atomic<bool>* stop = nullptr;
  /// After the run's last evaluation, runs the test set through `train_engine::predict`
  /// too and counts its classes (`train_report::classes`): one more pass over the test set.
  bool class_figures = false;
  /// Early stopping: the run ends after the epoch whose evaluation is the `early_stop`-th
  /// in a row not to improve on the best test loss (layers/early_stop.hpp; at least 1;
  /// needs `evaluate`). Unset: the run goes to its epochs and steps. `save` is written.
  /// A resumed run counts its checkpoint's evaluations too.
  std::optional<int> early_stop;
  /// Write the weights after each evaluation that is the best so far (lowest test loss)
  /// here (safetensors like `save`, atomic); needs `evaluate`.
  std::filesystem::path save_best;
  /// A learning-rate range test instead of training (layers/lr_find.hpp): `lr_find->steps`
  /// steps at rates rising geometrically, no evaluation, stopped when the loss diverges;
  /// `train_report::lr_find` holds the rates, losses and the suggested rate, and `metrics`
  /// a step line for each. Not with `resume`, `checkpoint`, `save`, `save_best`,
  /// `early_stop`, `steps` or a `schedule`: its weights are those of a run driven to diverge.
  std::optional<lr_range> lr_find;
  /// This process writes the run's files (`save`, `metrics`, `checkpoint`, and `trace`
  /// unless the engine writes it). The other ranks of a multi-rank run say false: they take
  /// the same steps, checkpoints included (their parts are gathered), and write nothing.
  bool lead = true;
};

/// Throws `std::invalid_argument` naming the option (as its command-line flag) and the
/// allowed range for the first value out of range: epochs and steps, batch and
/// micro-batches, a finite lr above 0, momentum in [0, 1), a finite weight decay of 0 or
/// more, a known optimizer and schedule, 1 to `max_threads` threads, a finite `normalize`
/// with its std above 0, a `stall_timeout` of 0 or more seconds, and `save`, `trace`,
/// `checkpoint` and `metrics` naming regular files (or none yet) in directories that take
/// new files, and no two of the run's files one file (`check_distinct_files`); an
/// `early_stop` of 1 or more and `save_best` only with `evaluate`, and `lr_find`'s range
/// (`check_lr_range`) without the options it excludes; `train_data` and `test_data` with
/// both files each, and a test set beside your own training set where the run evaluates.
/// Any thread.
void check_options(const train_options& options);

/// Rows per evaluation call (the test set goes through in chunks of this size).
inline constexpr std::size_t evaluation_rows = 1000;

/// Defaults that reach the accuracy targets for a preset (batch, lr, momentum, epochs),
/// applied before the user's explicit choices. With `optimizer_name` adam or adamw, PyTorch's
/// defaults for it instead of SGD's rate: lr 0.001, no momentum, and for adamw weight decay
/// 0.01 (at SGD's rate Adam's weights diverge within a few steps). Empty: the preset's own
/// choice (AdamW with weight decay 0.05 for `vit`, SGD for the others). Another name: the
/// SGD defaults (`check_options` names it).
train_options preset_defaults(std::string_view model, std::string_view optimizer_name = "");

/// One epoch's figures.
struct epoch_stats {
  int epoch = 0;
  std::int64_t steps = 0;
  double train_loss = 0;
  double train_accuracy = 0;
  double test_loss = 0;
  double test_accuracy = 0;
  double seconds = 0;
  double samples_per_s = 0;
  bool interrupted = false;  ///< the run stopped inside this epoch (`train_options::stop`); no test figures
};

/// Progress inside an epoch, for a progress bar.
struct train_progress {
  int epoch = 0;
  std::size_t batch = 0, batches = 0;
  double loss = 0;  ///< running mean of this epoch so far
  double samples_per_s = 0;
};

/// A test set's predictions counted by class: `confusion[t][p]` samples of true class `t`
/// predicted as `p` (the first largest output, as the loss counts a correct one).
struct class_counts {
  std::vector<std::vector<std::int64_t>> confusion;
  /// Per true class: its samples predicted right over its samples (0 for a class with none).
  std::vector<double> accuracy() const;
  /// The samples of each true class (a row of `confusion` summed).
  std::vector<std::int64_t> samples() const;
};

struct train_report {
  std::vector<epoch_stats> epochs;
  std::int64_t parameters = 0;
  std::int64_t steps = 0;
  bool interrupted = false;  ///< stopped on request (`train_options::stop`) before its last step
  /// A resumed run whose checkpoint had reached its end (its epochs and steps): nothing
  /// ran, no trace, metrics or checkpoint was written (`save` was, when asked).
  bool nothing_left = false;
  /// `train_options::early_stop` ended the run (after `epochs.back()`).
  bool early_stopped = false;
  /// The epoch of the best evaluation (lowest test loss; 0: no evaluation) and its loss.
  int best_epoch = 0;
  double best_test_loss = 0;
  /// `train_options::lr_find`'s rates, losses and suggestion.
  lr_find_result lr_find;
  /// With `train_options::class_figures`, after the last evaluation (empty otherwise, or
  /// when no epoch finished).
  class_counts classes;
};

/// A network being trained, however it runs. The trainer calls it from one thread (its
/// own), one step after another; a step may still run on the engine's loops or device
/// while the trainer prepares the next batch.
class train_engine {
 public:
  virtual ~train_engine() = default;
  /// Starts one optimizer step on `x` (with `y`) split into `micro_batches`, at learning
  /// rate `lr`. The future holds the step's figures (or its error).
  virtual std::future<step_result> train_step(tensor x, targets y, std::size_t micro_batches, std::uint64_t step,
                                              double lr) = 0;
  /// Loss and correct count of a batch in evaluation mode, no update.
  virtual std::future<step_result> evaluate(tensor x, targets y) = 0;
  /// The network's output for a batch (a row per sample), in evaluation mode. The
  /// default throws: the engine cannot predict.
  virtual std::future<tensor> predict(tensor x);
  /// The fewest rows a training batch must have (a smaller last batch is skipped).
  virtual std::size_t min_rows() const { return 1; }
  /// Steps the trainer may ask for before the first of them answers (a device's
  /// network enqueues the next step while the device runs one).
  virtual std::size_t steps_in_flight() const { return 1; }
  /// Everything started has run and the graph holds the trained weights (a device
  /// engine downloads them). Between steps, never on a loop.
  virtual void finish() {}
  /// The optimizer state of every layer (checkpoints), named as the graph names the
  /// parameters. Between steps. The default says the engine cannot checkpoint.
  virtual optimizer_state optimizer_state_of();
  /// Restores what `optimizer_state_of` returned (resume). Between steps, before the first.
  virtual void load_optimizer_state(const optimizer_state& state);
  /// Brings the weights into the graph without ending the run (checkpoints). Between steps.
  virtual void sync_weights() {}
  /// Whether the run stops before its next step, given this process's request `local`
  /// (`train_options::stop`). The trainer asks before every step and once after an epoch's
  /// last, between steps. An engine across ranks combines every rank's request (a
  /// collective: every rank asks at the same points), so all stop before the same step; a
  /// rank that stopped alone would leave the others waiting in that step for ever. The
  /// default: `local`.
  virtual bool agree_stop(bool local) { return local; }
  /// Adds what the trace's `nerve` metadata should say besides the runtime's (device,
  /// stages, schedule) to the object `extra`.
  virtual void trace_metadata(nlohmann::json& /*extra*/) const {}
  /// Writes the trace itself (an engine across ranks merges every rank's into one file),
  /// on every rank; false: the trainer writes `rt`'s trace where `train_options::lead`.
  virtual bool write_trace(actors::runtime& /*rt*/, const std::string& /*path*/, const nlohmann::json& /*extra*/) {
    return false;
  }
};

/// Makes the engine that trains `g` on `rt`'s loops as `options` say.
using engine_factory =
    std::function<std::unique_ptr<train_engine>(actors::runtime& rt, graph& g, const train_options& options)>;

/// The engine for a `--device` value (layers/devices.hpp): the layer actors of a
/// `network` with the CPU's kernels for `cpu`, or with a backend of the device it names
/// (opened when the factory is called). Throws `std::invalid_argument` naming the value and
/// the device kinds of this build when it names none.
engine_factory engine_for(const std::string& device);

/// The layer actors of a `network` on the runtime's loops, the CPU's kernels: the `cpu` engine.
std::unique_ptr<train_engine> make_network_engine(actors::runtime& rt, graph& g, const train_options& options);

/// The optimizer settings of `options`, for a device backend's own optimizer.
optimizer_settings optimizer_settings_of(const train_options& options);

/// Trains `g` (a user's own graph, or a preset) with `engine` (default: the one
/// `options.device` names) on Fashion-MNIST or `options`' own data. `on_progress` is called
/// from the calling thread after each step; `on_epoch` after each epoch. Writes the trace
/// and the weights when asked. Holds its checkpoint and metrics files for the run
/// (`run_files`: a second run given either is refused). Throws on bad options, bad data
/// files, files in use by another run, and failures of the run (a layer's exception, named).
train_report train(graph& g, const train_options& options,
                   const std::function<void(const train_progress&)>& on_progress = {},
                   const std::function<void(const epoch_stats&)>& on_epoch = {}, engine_factory engine = {});

/// The settings a checkpoint was written with, `resume` set to `path`: what an app starts
/// from on `--resume` before it applies the outputs the user gives again (`--save`,
/// `--trace`, `--checkpoint`). Throws naming the file when it holds no training state.
train_options resume_options(const std::filesystem::path& path);

/// Trains the preset `options.model` (see `train(graph&, ...)`).
train_report train(const train_options& options, const std::function<void(const train_progress&)>& on_progress = {},
                   const std::function<void(const epoch_stats&)>& on_epoch = {});

/// The optimizer `options` asks for, as a factory (one per layer actor).
optimizer_factory make_optimizer_factory(const train_options& options);

/// A graph's parameters and buffers as a PyTorch-named state dict, and back (strict: the
/// names must match exactly, shapes are checked).
/// `load_weights` also takes a checkpoint (`train_options::checkpoint`): its weights and
/// buffers, without its optimizer state and position. It refuses a file holding NaN or
/// Inf among what it loads (naming the tensor and the element) unless `allow_nonfinite`.
void save_weights(graph& g, const std::filesystem::path& path, const std::string& model);
void load_weights(graph& g, const std::filesystem::path& path, bool allow_nonfinite = false);

}  // namespace nerve::layers

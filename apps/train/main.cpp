// nerve-train: train a preset network on Fashion-MNIST with its layers running as actors.
//
//   loader ──batch──► coordinator ──forward──► fc1 ─► relu1 ─► fc2 ─► loss
//                          ▲                    ◄──── backward ────────┘
//                          └──────── node_done (every layer, after its optimizer step)
//
// The epochs, batches and evaluation are the one trainer's (layers/trainer.hpp); --device
// picks its engine: the layer actors on the CPU, or a device network (cuda, standin).
// --replicas R trains R data-parallel replicas (each a one-stage pipeline of layer actors,
// gradients all-reduced per layer while backward goes on): in this process, or one per
// rank under `mpirun -np R`.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "gpu/layers/train.hpp"
#include "layers/inference.hpp"
#include "layers/presets.hpp"
#include "layers/summary.hpp"
#include "layers/train_data.hpp"
#include "layers/trainer.hpp"
#include "apps/common/app_settings.hpp"
#include "apps/common/data_options.hpp"
#include "apps/common/job.hpp"
#include "apps/common/model_report.hpp"
#include "apps/common/options.hpp"
#include "layers/pipeline/engine.hpp"
#include "apps/common/run_control.hpp"
#include "apps/common/stopping_options.hpp"

using namespace nerve::layers;

using nerve::apps::install_stop_handlers;
using nerve::apps::progress_bar;
using nerve::apps::stop_requested;
using nerve::apps::stop_signal;

namespace {

std::string fmt_g(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

/// What `--evaluate` and `--predict` read of the command line.
struct evaluation_request {
  std::string model, init, predict, data, device, trace;
  std::vector<double> normalize;
  unsigned threads = 1;
  bool spread = false;
  unsigned long long seed = 0;
  bool trace_exact = false, allow_nonfinite = false;
  double stall_timeout = 60;
  bool json = false, evaluate_flag = false;
};

/// `--evaluate` / `--predict`: the --init weights through the test set on the engine
/// `--device` names; nothing is trained. Returns the exit status.
int evaluate_weights(CLI::App& app, const evaluation_request& r, const nerve::apps::own_data_options& own,
                     const nerve::apps::job& ranks) {
  const std::string mode = r.evaluate_flag ? "--evaluate" : "--predict";
  nerve::apps::refuse_beside(app, mode, nerve::apps::training_only);
  nerve::apps::own_data_options::refuse_for_evaluation(app, mode);
  if (app.count("--replicas"))
    throw std::invalid_argument("--replicas cannot be given with " + mode +
                                ": the test set runs through one network (on any --device)");
  if (ranks.size() > 1)
    throw std::invalid_argument(mode + " runs in one process, not under mpirun (" + std::to_string(ranks.size()) +
                                " ranks)");
  if (r.init.empty())
    throw std::invalid_argument(mode + " needs --init FILE: the weights to evaluate (a --save file, or a --checkpoint)");
  auto o = preset_defaults(r.model);
  o.init = r.init;
  o.data = r.data;
  o.normalize = nerve::apps::normalization_of(r.normalize);
  o.threads = r.threads;
  o.spread = r.spread;
  o.seed = r.seed;
  o.device = r.device;
  o.trace = r.trace;
  o.trace_exact = r.trace_exact;
  o.allow_nonfinite = r.allow_nonfinite;
  o.stall_timeout = r.stall_timeout;
  own.apply_for_evaluation(app, o);
  nerve::gpu::register_devices();  // --device cuda, cuda:N, standin beside the built-in cpu
  auto g = make_preset_for(o);
  const auto e = evaluate(g, o, r.predict);
  if (!r.json)
    std::printf("nerve-train: %s with the weights of %s on %s\n", o.model.c_str(), o.init.c_str(), o.device.c_str());
  if (r.json) {
    nlohmann::json j;
    j["model"] = o.model;
    j["device"] = o.device;
    j["weights"] = o.init;
    nerve::apps::add_evaluation_json(j, e, r.predict);
    if (!r.trace.empty()) j["trace"] = r.trace;
    std::cout << j.dump(2) << "\n";
  } else {
    std::printf("%s\n", nerve::apps::test_line(e.test.loss, e.test.accuracy, e.test.correct, e.test.samples).c_str());
    if (!r.predict.empty()) std::printf("predictions written to %s\n", r.predict.c_str());
    if (!r.trace.empty()) std::printf("trace written to %s\n", r.trace.c_str());
  }
  return 0;
}

/// The model of a run as `--summary` and the banner show it: stashes per micro-batch of
/// the batch split over the replicas and micro-batches (the largest part), places as the
/// engine puts the layers.
model_summary summary_of(const train_options& o, std::uint32_t replicas, const std::string& device) {
  auto g = make_preset_for(o);
  summary_options so;
  const std::size_t parts = o.micro_batches * replicas;
  so.micro_batch = std::int64_t((o.batch + parts - 1) / parts);
  if (replicas > 1)
    so.places.assign(g.nodes().size(), "stage 0 of each replica" + (device == "cpu" ? std::string() : " on " + device));
  else
    so.places = places_on_loops(g, o.threads, o.spread, device);
  return summary(g, so);
}



}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"nerve-train: train a network on Fashion-MNIST, each layer an actor on an event loop"};
  std::string model = "mlp";
  app.add_option("--model", model, "Preset: mlp, deep-mlp, lenet, resmlp, vit, gpt (a character model of the fortunes corpus)");
  // Parse the model first so its defaults can be shown and then overridden.
  train_options o;
  int epochs = -1;
  long long steps = -1;
  long long batch = -1;
  double lr = -1, momentum = -1, weight_decay = -1;
  std::string device = "cpu";
  std::string optimizer, schedule = "none", data = "/usr/share/datasets/fashion-mnist", init, save, trace;
  unsigned threads = 1;
  unsigned long long seed = 0;
  std::size_t micro = 1;
  bool no_shuffle = false, json = false, spread = false, nesterov = false, quiet = false, no_eval = false;
  nerve::apps::add_whole(app, "--epochs", epochs, "Epochs (default: the preset's)");
  nerve::apps::add_whole(app, "--steps", steps, "Stop after N optimizer steps");
  nerve::apps::add_whole(app, "--batch", batch, "Mini-batch size (default: the preset's)");
  nerve::apps::add_whole(app, "--microbatches", micro, "Split each batch into M micro-batches (gradients accumulate)");
  app.add_option("--lr", lr, "Learning rate (default: the preset's, or 0.001 for adam and adamw)");
  app.add_option("--optimizer", optimizer,
                 "sgd, adam or adamw (default: sgd); adam and adamw start from PyTorch's defaults, lr 0.001 and for "
                 "adamw weight decay 0.01, not the preset's SGD rate");
  app.add_option("--momentum", momentum, "SGD momentum (default: the preset's)");
  app.add_flag("--nesterov", nesterov, "Nesterov momentum");
  app.add_option("--weight-decay", weight_decay, "Weight decay (L2 for sgd/adam, decoupled for adamw)");
  app.add_option("--schedule", schedule, "Learning-rate schedule: none, step, cosine");
  nerve::apps::add_whole(app, "--threads", threads, "Event loops, and threads per matrix product");
  app.add_flag("--spread", spread, "Spread layer actors over the loops (default: all on one loop)");
  nerve::apps::add_whole(app, "--seed", seed, "Seed for initialisation and shuffling");
  app.add_flag("--no-shuffle", no_shuffle, "Batches in file order");
  std::vector<double> normalize;
  nerve::apps::add_normalize(app, normalize);
  double stall_timeout = 60;
  nerve::apps::add_stall_timeout(app, stall_timeout);
  app.add_option("--data", data,
                 "Directory with the Fashion-MNIST IDX files (gpt: the text corpus, default /usr/share/games/fortunes)");
  nerve::apps::own_data_options own_data;
  own_data.add_to(app);
  app.add_option("--init", init, "Start from these weights (safetensors: weights, or the weights of a checkpoint)");
  nerve::apps::model_actions actions;
  nerve::apps::add_model_actions(app, actions, "", "where it runs");
  bool& evaluate_only = actions.evaluate;
  bool& show_summary = actions.summary;
  std::string& predict = actions.predict;
  app.add_option("--save", save, "Write the final weights here (safetensors, PyTorch names)");
  app.add_option("--trace", trace, "Record every message and write a Chrome trace here");
  bool trace_exact = false;
  app.add_flag("--trace-exact", trace_exact,
               "Time every handler run with a clock read of its own (default: short runs in a row share one; docs/trace.md)");
  app.add_flag("--no-eval", no_eval, "Skip the test-set evaluation after each epoch");
  app.add_option("--device", device, "Where the network runs: cpu, cuda, cuda:N or standin (the CPU stand-in of a GPU)");
  bool allow_nonfinite = false;
  app.add_flag("--allow-nonfinite", allow_nonfinite,
               "Go on through a NaN or Inf loss or gradient, and load NaN or Inf --init weights (default: stop with "
               "an error naming the step and the layer, or the tensor)");
  nerve::apps::run_state_options state;
  state.add_to(app);
  nerve::apps::stopping_options stopping;
  stopping.add_to(app, true);
  long long replicas_in = 1;
  nerve::apps::add_whole(app, "--replicas", replicas_in,
                 "Data-parallel replicas, 1 to 256: the batch splits over them and every layer's gradients are "
                 "summed across them; under mpirun -np R, one replica per rank")
      ->capture_default_str();
  app.add_flag("--json", json, "Print one JSON object with the results on stdout");
  app.add_flag("--quiet", quiet, "No progress bar");
  if (const int status = nerve::apps::parse_command_line(app, argc, argv, "nerve-train"); status >= 0) return status;

  std::optional<nerve::apps::job> ranks;  // the processes of the run: one, or mpirun's ranks
  std::string banner_totals;
  try {
    ranks.emplace(argc, argv);
    const bool speak = ranks->lead();  // rank 0 speaks for the job
    if (replicas_in < 1 || replicas_in > long(max_threads))
      throw std::invalid_argument("--replicas must be between 1 and " + std::to_string(max_threads) + " (got " +
                                  std::to_string(replicas_in) + "): each replica is a group of layer actors");
    auto replicas = std::uint32_t(replicas_in);
    if ((evaluate_only || !predict.empty()) && !show_summary)
      return evaluate_weights(app, {model, init, predict, data, device, trace, normalize, threads, spread, seed,
                                    trace_exact, allow_nonfinite, stall_timeout, json, evaluate_only},
                              own_data, *ranks);
    if (!state.resume.empty()) {
      // The checkpoint's settings hold: a training option given beside --resume would be ignored.
      // Where the data lies may change (a run moved to another machine), and so may the
      // loops of replicas (checked below).
      // --epochs and --steps may raise the run's limits (train: check_resumed_limits).
      for (const char* opt : {"--model", "--batch", "--microbatches", "--lr", "--optimizer",
                              "--momentum", "--nesterov", "--weight-decay", "--schedule", "--spread",
                              "--seed", "--no-shuffle", "--normalize", "--init", "--device", "--no-eval", "--allow-nonfinite",
                              "--augment"})
        if (app.count(opt) > 0)
          throw std::invalid_argument(std::string(opt) + " cannot be given with --resume: the run goes on with the "
                                      "settings its checkpoint holds");
      o = resume_options(state.resume);
      model = o.model;
      if (app.count("--epochs")) o.epochs = epochs;
      if (app.count("--steps")) {
        if (steps < 1) throw std::invalid_argument("--steps must be at least 1 (got " + std::to_string(steps) + ")");
        o.steps = steps;
      }
      if (app.count("--replicas"))
        throw std::invalid_argument("--replicas cannot be given with --resume: the run goes on with the settings its "
                                    "checkpoint holds");
      const nerve::apps::resumed_app_settings a(o);
      a.expect_writer("nerve-train", true);
      replicas = a.whole("replicas", 1, max_threads, 1);
      if (app.count("--data")) o.data = data;
      // Replicas run their products on one thread each (pipeline_engine): their loops change
      // no bit. One replica's threads also cut every matrix product into blocks, and blocks
      // of another size round differently (layers/gemm.cpp): another run, not this one's.
      if (app.count("--threads") && threads != o.threads && replicas == 1)
        throw std::invalid_argument("--threads " + std::to_string(threads) + " cannot replace the checkpoint's " +
                                    std::to_string(o.threads) + " for one replica: its threads also cut each matrix "
                                    "product, and another cut rounds differently (the run would not end as it "
                                    "would have); give --threads " + std::to_string(o.threads) + " or none");
      if (app.count("--threads")) o.threads = threads;
      device = o.device;
      o.save = save;
      o.trace = trace;
      o.trace_exact = trace_exact;
      o.stop = &stop_requested;
    } else {
      o = preset_defaults(model, optimizer);
      // What the user gave replaces the preset's, whatever it is: check_options refuses
      // what is out of range rather than the preset's value standing in for it unseen.
      if (app.count("--epochs")) o.epochs = epochs;
      if (app.count("--steps")) {  // -1 is the options' "no limit", not a value to give
        if (steps < 1) throw std::invalid_argument("--steps must be at least 1 (got " + std::to_string(steps) + ")");
        o.steps = steps;
      }
      if (app.count("--batch")) {
        if (batch < 1) throw std::invalid_argument("--batch must be at least 1 (got " + std::to_string(batch) + ")");
        o.batch = static_cast<std::size_t>(batch);
      }
      if (app.count("--lr")) o.lr = lr;
      if (!optimizer.empty()) o.optimizer = optimizer;
      if (app.count("--momentum")) o.momentum = momentum;
      if (app.count("--weight-decay")) o.weight_decay = weight_decay;
      if (o.optimizer != "sgd" && (app.count("--momentum") || nesterov))
        std::fprintf(stderr, "nerve-train: warning: --momentum and --nesterov apply to sgd; %s ignores them\n",
                     o.optimizer.c_str());
      o.nesterov = nesterov;
      o.micro_batches = micro;
      o.schedule = schedule;
      o.threads = threads;
      o.spread = spread;
      o.seed = seed;
      o.shuffle = !no_shuffle;
      o.normalize = nerve::apps::normalization_of(normalize);
      o.data = data;
      o.init = init;
      o.save = save;
      o.trace = trace;
      o.trace_exact = trace_exact;
      o.evaluate = !no_eval;
      o.device = device;
      o.allow_nonfinite = allow_nonfinite;
      o.stop = &stop_requested;
    }
    own_data.apply(app, o, !state.resume.empty());
    state.apply(app, o);
    stopping.apply(app, o);
    o.stall_timeout = stall_timeout;
    if (ranks->size() > 1 && ranks->size() != int(replicas))
      throw std::invalid_argument("--replicas " + std::to_string(replicas) + " places one replica on each rank: start " +
                                  std::to_string(replicas) + " ranks (mpirun -np " + std::to_string(replicas) +
                                  "), not " + std::to_string(ranks->size()));
    const bool data_parallel = replicas > 1;
    if (data_parallel) {
      if (o.batch < std::size_t(replicas) * o.micro_batches)
        throw std::invalid_argument("--batch " + std::to_string(o.batch) + " cannot split into " +
                                    std::to_string(replicas) + " replicas x " + std::to_string(o.micro_batches) +
                                    " micro-batches");
      // One loop per replica in this process (unless --threads says), one per rank across ranks.
      if (!app.count("--threads") && state.resume.empty()) o.threads = ranks->size() > 1 ? 1 : replicas;
    }
    o.app_settings = nlohmann::json{{"app", "nerve-train"}, {"replicas", replicas}}.dump();
    o.lead = speak;
    // The class counts cost one more pass over the test set: for --json, in one process.
    o.class_figures = json && o.evaluate && ranks->size() == 1 && !reads_text(o.model);
    check_options(o);  // before the banner and the data: a bad value costs nothing
    load_own_data(o);  // once: the preset takes its input shape and classes from it
    if (show_summary || (!json && speak)) {
      const auto s = summary_of(o, replicas, device);
      if (show_summary) {
        if (speak) std::cout << (json ? nerve::apps::summary_json(s).dump(2) + "\n" : to_text(s));
        return 0;
      }
      banner_totals = "model: " + totals_line(s);
    }
    ranks->agree_inputs(o);  // across ranks: the same data and checkpoint bytes on every rank

    if (!json && speak && o.lr_find) {
      std::printf("nerve-train: %s, learning-rate range test: %lld steps at rates from %g to %g, batch %zu, %s\n",
                  o.model.c_str(), static_cast<long long>(o.lr_find->steps), o.lr_find->min_lr, o.lr_find->max_lr,
                  o.batch, o.optimizer.c_str());
    } else if (!json && speak) {
      const std::string knobs = (o.momentum > 0 && o.optimizer == "sgd" ? " momentum " + fmt_g(o.momentum) : "") +
                                (o.weight_decay > 0 ? " weight decay " + fmt_g(o.weight_decay) : "");
      std::printf("nerve-train: %s, %s, batch %zu, %s lr %g%s, %u thread%s\n", o.model.c_str(),
                  (std::to_string(o.epochs) + (o.epochs == 1 ? " epoch" : " epochs") +
                   (o.steps > 0 ? ", " + std::to_string(o.steps) + " steps at most" : ""))
                      .c_str(),
                  o.batch, o.optimizer.c_str(), o.lr, knobs.c_str(), o.threads, o.threads == 1 ? "" : "s");
    }
    if (!json && speak) std::printf("%s\n", banner_totals.c_str());
    if (const auto line = nerve::apps::own_data_options::banner_line(o); !json && speak && !line.empty())
      std::printf("%s\n", line.c_str());
    if (!json && speak && data_parallel)
      std::printf("%u replicas%s\n", replicas, ranks->size() > 1 ? ", one per rank" : " in this process");
    progress_bar bar(quiet || !speak);
    install_stop_handlers();
    nerve::gpu::register_devices();  // --device cuda, cuda:N, standin beside the built-in cpu
    // Data parallelism: the replicas are a one-stage pipeline each (nerve-pipeline's engine).
    std::vector<graph> graphs;
    for (std::uint32_t r = 0; r < replicas; ++r) graphs.push_back(make_preset_for(o));
    std::vector<graph*> replica_graphs;
    for (auto& rg : graphs) replica_graphs.push_back(&rg);
    nerve::pipeline::engine_outcome outcome;
    engine_factory make_engine;
    if (data_parallel)
      make_engine = [&](nerve::actors::runtime& rt, graph& g0, const train_options& opts) {
        namespace np = nerve::pipeline;
        const auto plan = np::make_schedule("1f1b", 1, std::uint32_t(opts.micro_batches));
        np::pipeline_options po;
        for (std::uint32_t r = 0; r < replicas; ++r) po.loops.push_back(r % opts.threads);
        if (ranks->size() > 1) po.link = ranks->link_on(rt, 0);
        po.on_stall = ranks->on_stall(rt, opts.trace.string(), "nerve-train");
        auto inner = opts;
        inner.micro_batches = 1;
        // --device cuda or standin: in one process every replica on that device, each on a
        // stream of its own, their gradients summed there; across ranks each rank's replica
        // on its own device, summed among the ranks (layers/pipeline: replicas of device stages).
        return std::make_unique<np::pipeline_engine>(rt, replica_graphs, np::partition_by_parameters(g0, 1), plan,
                                                     inner, po, std::vector<std::string>{device}, outcome,
                                                     ranks->for_engine("nerve-train"));
      };
    auto report = train(
        graphs[0], o, [&](const train_progress& p) { bar(p); },
        [&](const epoch_stats& e) {
          if (!json && speak) {
            const bool tested = o.evaluate && !e.interrupted;  // else no test figures to show
            char test[32] = "      -";
            if (tested) std::snprintf(test, sizeof test, "%6.2f%%", 100 * e.test_accuracy);
            if (reads_text(o.model)) {  // a language model: the validation part's loss per token
              char val[32] = "     -";
              if (tested) std::snprintf(val, sizeof val, "%.4f", e.test_loss);
              std::printf("epoch %2d  train loss %.4f  val loss %s  val token acc %s  %6.2f s  %8.0f windows/s%s\n",
                          e.epoch, e.train_loss, val, test, e.seconds, e.samples_per_s,
                          e.interrupted ? "  (interrupted)" : "");
            } else {
              std::printf("epoch %2d  train loss %.4f  train acc %6.2f%%  test acc %s  %6.2f s  %8.0f samples/s%s\n",
                          e.epoch, e.train_loss, 100 * e.train_accuracy, test, e.seconds, e.samples_per_s,
                          e.interrupted ? "  (interrupted)" : "");
            }
          }
          std::fflush(stdout);
        },
        make_engine);
    if (report.nothing_left && speak && !json)
      std::printf("nerve-train: the run in %s has ended (%d epoch%s, %lld steps): nothing left to do; --epochs or "
                  "--steps above its own extend it\n",
                  o.resume.c_str(), o.epochs, o.epochs == 1 ? "" : "s", static_cast<long long>(report.steps));
    if (!speak) {
    } else if (json) {
      nlohmann::json j;
      j["model"] = o.model;
      j["device"] = device;
      j["parameters"] = report.parameters;
      j["steps"] = report.steps;
      j["batch"] = o.batch;
      j["optimizer"] = o.optimizer;
      j["lr"] = o.lr;
      j["threads"] = o.threads;
      j["seed"] = o.seed;
      j["replicas"] = replicas;
      j["ranks"] = ranks->size();
      j["interrupted"] = report.interrupted;
      if (report.nothing_left) j["nothing_left"] = true;
      if (o.early_stop) j["early_stopped"] = report.early_stopped;
      if (report.best_epoch > 0) j["best_epoch"] = report.best_epoch;
      if (o.lr_find) {
        auto& f = j["lr_find"];
        f["lr"] = nlohmann::json::array();
        f["loss"] = nlohmann::json::array();
        for (const auto& p : report.lr_find.points) {
          f["lr"].push_back(p.lr);
          f["loss"].push_back(std::isfinite(p.loss) ? nlohmann::json(p.loss) : nlohmann::json(nullptr));
        }
        f["diverged"] = report.lr_find.diverged;
        f["suggested_lr"] = report.lr_find.suggested_lr;
        f["suggestion"] = "a tenth of the rate at the lowest loss";
      }
      if (!report.classes.confusion.empty()) j["classes"] = nerve::apps::classes_json(report.classes);
      j["epochs"] = nlohmann::json::array();
      for (auto& e : report.epochs)
        j["epochs"].push_back({{"epoch", e.epoch},
                               {"interrupted", e.interrupted},
                               {"steps", e.steps},
                               {"train_loss", e.train_loss},
                               {"train_accuracy", e.train_accuracy},
                               {"test_loss", e.test_loss},
                               {"test_accuracy", e.test_accuracy},
                               {"seconds", e.seconds},
                               {"samples_per_s", e.samples_per_s}});
      std::cout << j.dump(2) << "\n";
    } else {
      if (o.lr_find) nerve::apps::print_lr_find(report.lr_find);
      if (report.early_stopped)
        std::printf("stopped early after epoch %d: the test loss has not improved on epoch %d's for %d evaluations "
                    "(--early-stop)\n",
                    report.epochs.empty() ? 0 : report.epochs.back().epoch, report.best_epoch, *o.early_stop);
      if (!o.save_best.empty() && report.best_epoch > 0)
        std::printf("best weights (epoch %d) written to %s\n", report.best_epoch, o.save_best.c_str());
      if (!o.save.empty()) std::printf("weights written to %s\n", o.save.c_str());
      if (!o.trace.empty() && !report.nothing_left) std::printf("trace written to %s\n", o.trace.c_str());
      if (!o.metrics.empty() && !report.nothing_left) std::printf("metrics written to %s\n", o.metrics.c_str());
    }
    if (report.interrupted) {
      if (speak)  // every rank stopped at the same step; rank 0 speaks for the job
        std::fprintf(stderr, "nerve-train: interrupted by %s after %lld steps%s\n",
                     nerve::apps::stop_cause().c_str(), static_cast<long long>(report.steps),
                     o.save.empty() ? "" : ("; the weights of its last step were written to " + o.save.string()).c_str());
      return 128 + (stop_signal ? int(stop_signal) : SIGINT);
    }
  } catch (const std::exception& e) {
    if (ranks) ranks->fail("nerve-train", e.what());  // in a multi-rank job: leaves at once
    else std::fprintf(stderr, "nerve-train: %s\n", e.what());
    return 1;
  }
  return 0;
}

// nerve-pipeline: train a preset network on Fashion-MNIST (or your own .npy data) cut into
// pipeline stages, each stage an actor on its own event loop, micro-batches flowing between
// them as messages.
//
//   batch ──split──► stage 0 ──activations──► stage 1 ──► … ──► stage S-1 ─► loss
//                      ▲ ◄──────gradients──────────┘ ◄──────────────┘
//                      └─ each stage steps its own optimizer once per mini-batch
//
// --devices cpu,cuda:0,cuda:0 puts stages on GPUs (one stream each; several stages may share
// a GPU): between two stages of one GPU the tensors stay on the device (docs/gpu.md).
// Epochs, batches, evaluation, trace and checkpoint are the one trainer's (layers/trainer.hpp);
// this app hands it a pipeline as its engine.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <future>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <sstream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "gpu/layers/train.hpp"
#include "layers/executor.hpp"
#include "layers/gemm.hpp"
#include "layers/pipeline/pipeline.hpp"
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

using namespace nerve;
namespace np = nerve::pipeline;
namespace nl = nerve::layers;

using nerve::apps::install_stop_handlers;
using nerve::apps::progress_bar;
using nerve::apps::stop_requested;
using nerve::apps::stop_signal;

namespace {


std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> v;
  std::stringstream in(s);
  std::string w;
  while (std::getline(in, w, ','))
    if (!w.empty()) v.push_back(w);
  return v;
}


/// `value` of option `name` as an unsigned 32-bit count in [lo, hi]; throws naming both.
/// (`hi` < 0: no bound of its own but what 32 bits hold.)
std::uint32_t count_in_range(const char* name, long long value, long long lo, long long hi, const char* why = "") {
  const long long top = hi < 0 ? std::numeric_limits<std::uint32_t>::max() : hi;
  if (value < lo || value > top)
    throw std::invalid_argument(std::string(name) + " must be " +
                                (hi < 0 ? "at least " + std::to_string(lo)
                                        : "between " + std::to_string(lo) + " and " + std::to_string(hi)) +
                                " (got " + std::to_string(value) + ")" + why);
  return static_cast<std::uint32_t>(value);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"nerve-pipeline: pipeline-parallel training on Fashion-MNIST or your own .npy data, one event loop "
               "per stage"};
  std::string model = "deep-mlp", schedule_name = "1f1b", partition = "params", data = "/usr/share/datasets/fashion-mnist";
  std::string init, save, trace, load_schedule_file, write_schedule_file, devices;
  std::uint32_t stages = 2, micro = 8, chunks = 2, replicas = 1, credits = 0;
  unsigned threads = 0;
  // Read as wide signed numbers so that 0, -1 or 10000 get this app's message, not a
  // conversion error or CLI11's range of 300 digits.
  long long stages_in = stages, micro_in = micro, chunks_in = chunks, replicas_in = replicas, credits_in = credits,
            threads_in = threads;
  int epochs = -1;
  long long steps = -1, batch = -1;
  double lr = -1, momentum = -1;
  unsigned long long seed = 0;
  bool no_shuffle = false, json = false, print_schedule = false, quiet = false, no_eval = false;
  app.add_option("--model", model, "Preset: mlp, deep-mlp, lenet, resmlp, vit, gpt")->capture_default_str();
  nerve::apps::add_whole(app, "--stages", stages_in, "Pipeline stages (S), 1 to 256")->capture_default_str();
  nerve::apps::add_whole(app, "--microbatches", micro_in, "Micro-batches per mini-batch (M), 1 to the batch size")->capture_default_str();
  app.add_option("--schedule", schedule_name, "gpipe, 1f1b, interleaved, zb-h1 or emergent")->capture_default_str();
  nerve::apps::add_whole(app, "--chunks", chunks_in, "Model chunks per stage for interleaved (v), 1 to 256")->capture_default_str();
  nerve::apps::add_whole(app, "--credits", credits_in, "emergent: micro-batches in flight per stage (0: S - s, 1F1B's bound)");
  nerve::apps::add_whole(app, "--replicas", replicas_in,
                 "Data-parallel replicas of the pipeline (R): the batch splits over them, gradients are all-reduced "
                 "per layer")
      ->capture_default_str();
  app.add_option("--partition", partition,
                 "params (balance parameters), cost (profile, then balance time), or the first layer of each stage "
                 "after the first, comma-separated (fc3 or fc2,fc4)")
      ->capture_default_str();
  app.add_option("--schedule-file", load_schedule_file, "Run the schedule in this file (text form; see --write-schedule)");
  app.add_option("--write-schedule", write_schedule_file, "Write the planned schedule to this file");
  app.add_option("--devices", devices,
                 "One device per stage, comma-separated: cpu, cuda, cuda:N or standin (the CPU stand-in of a GPU); "
                 "default: every stage on the CPU")
      ->capture_default_str();
  nerve::apps::add_whole(app, "--epochs", epochs, "Epochs (default: the preset's)");
  nerve::apps::add_whole(app, "--steps", steps, "Stop after N optimizer steps");
  nerve::apps::add_whole(app, "--batch", batch, "Mini-batch size; it splits into the micro-batches (default: the preset's)");
  app.add_option("--lr", lr, "Learning rate (default: the preset's)");
  app.add_option("--momentum", momentum, "SGD momentum (default: the preset's)");
  nerve::apps::add_whole(app, "--threads", threads_in, "Event loops, 1 to 256 (default: one per stage)");
  nerve::apps::add_whole(app, "--seed", seed, "Seed for initialisation and shuffling");
  app.add_flag("--no-shuffle", no_shuffle, "Batches in file order");
  std::vector<double> normalize;
  nerve::apps::add_normalize(app, normalize);
  double stall_timeout = 60;
  nerve::apps::add_stall_timeout(app, stall_timeout);
  app.add_option("--data", data, "Directory with the Fashion-MNIST IDX files")->capture_default_str();
  nerve::apps::own_data_options own_data;
  own_data.add_to(app);
  app.add_option("--init", init, "Start from these weights (safetensors: weights, or the weights of a checkpoint)");
  nerve::apps::model_actions actions;
  nerve::apps::add_model_actions(app, actions, " through the pipeline's stages", "stage");
  bool& evaluate_only = actions.evaluate;
  bool& show_summary = actions.summary;
  std::string& predict = actions.predict;
  app.add_option("--save", save, "Write the final weights here (safetensors, PyTorch names)");
  app.add_option("--trace", trace, "Record every message, stage action and idle span; write a Chrome trace here");
  bool trace_exact = false;
  app.add_flag("--trace-exact", trace_exact,
               "Time every handler run with a clock read of its own (default: short runs in a row share one; docs/trace.md)");
  app.add_flag("--print-schedule", print_schedule, "Print the planned schedule (stage x time and stage x step) and exit");
  app.add_flag("--no-eval", no_eval, "Skip the test-set evaluation after each epoch");
  bool allow_nonfinite = false;
  app.add_flag("--allow-nonfinite", allow_nonfinite,
               "Go on through a NaN or Inf loss, and load NaN or Inf --init weights (default: stop with an error "
               "naming the step, or the tensor)");
  nerve::apps::run_state_options state;
  state.add_to(app);
  nerve::apps::stopping_options stopping;
  stopping.add_to(app, false);  // --early-stop, --save-best; the rate range test is nerve-train's
  const auto& resume = state.resume;
  const auto& metrics_file = state.metrics;
  app.add_flag("--json", json, "Print one JSON object with the results on stdout");
  app.add_flag("--quiet", quiet, "No progress bar");
  if (const int status = nerve::apps::parse_command_line(app, argc, argv, "nerve-pipeline"); status >= 0) return status;

  std::optional<nerve::apps::job> ranks;  // the processes of the run: one, or mpirun's ranks
  try {
    ranks.emplace(argc, argv);
    // Rank 0 speaks for the job: the others print nothing but their own errors.
    const bool speak = ranks->lead();
    const auto loops = static_cast<long long>(nl::max_threads);
    const char* per_loop = ": each stage of each replica is an actor, by default on its own event loop";
    stages = count_in_range("--stages", stages_in, 1, loops, per_loop);
    replicas = count_in_range("--replicas", replicas_in, 1, loops, per_loop);
    if (stages * replicas > nl::max_threads)
      throw std::invalid_argument("--stages x --replicas must be at most " + std::to_string(nl::max_threads) +
                                  " (got " + std::to_string(stages) + " x " + std::to_string(replicas) + ")" + per_loop);
    micro = count_in_range("--microbatches", micro_in, 1, -1);
    chunks = count_in_range("--chunks", chunks_in, 1, loops);
    credits = count_in_range("--credits", credits_in, 0, -1);
    if (app.count("--threads")) threads = count_in_range("--threads", threads_in, 1, loops, ": one event loop each");
    nl::train_options resumed;
    std::string resumed_plan;
    np::schedule plan;
    if (!resume.empty()) {
      // The checkpoint's settings hold: a training option given beside --resume would be ignored.
      // Where the data lies and how many loops run the stages may change (a run moved to
      // another machine): neither changes the bits.
      // --epochs and --steps may raise the run's limits (train: check_resumed_limits).
      for (const char* opt : {"--model", "--stages", "--microbatches", "--schedule", "--chunks", "--credits",
                              "--replicas", "--partition", "--schedule-file", "--devices",
                              "--batch", "--lr", "--momentum", "--seed", "--no-shuffle", "--normalize",
                              "--init", "--no-eval", "--allow-nonfinite", "--augment"})
        if (app.count(opt) > 0)
          throw std::invalid_argument(std::string(opt) + " cannot be given with --resume: the run goes on with the "
                                      "settings its checkpoint holds");
      resumed = nl::resume_options(resume);
      // Each as its option would be checked: a number out of range is refused naming the field.
      const nerve::apps::resumed_app_settings a(resumed);
      a.expect_writer("nerve-pipeline", false);
      model = resumed.model;
      schedule_name = a.text("schedule");
      resumed_plan = a.text("plan");
      replicas = a.whole("replicas", 1, loops);
      credits = a.whole("credits", 0, std::numeric_limits<std::uint32_t>::max());
      devices = a.text("devices");
      partition = a.text("cut");
      if (!app.count("--threads")) threads = resumed.threads;
      if (app.count("--data")) resumed.data = data;
      seed = resumed.seed;
      try {
        plan = np::parse_schedule(resumed_plan);
        np::validate(plan);
      } catch (const std::exception& e) {
        throw std::invalid_argument(a.where() + "setting 'plan' is refused: " + e.what());
      }
      if (plan.stages < 1 || std::uint64_t(plan.stages) * replicas > nl::max_threads)
        throw std::invalid_argument(a.where() + "setting 'plan' has " + std::to_string(plan.stages) +
                                    " stages for " + std::to_string(replicas) + " replicas: stages x replicas must "
                                    "be 1 to " + std::to_string(nl::max_threads) + per_loop);
    }
    const bool emergent = schedule_name == "emergent";
    // Options the chosen schedule does not read: say so rather than drop them unseen.
    auto ignored = [&](const char* option, const std::string& by) {
      if (app.count(option)) std::fprintf(stderr, "nerve-pipeline: warning: %s is ignored by %s\n", option, by.c_str());
    };
    if (!resume.empty()) {  // the checkpoint's plan, checked above
      stages = plan.stages;
      micro = plan.micro_batches;
      chunks = plan.chunks;
    } else if (!load_schedule_file.empty()) {
      const std::string file = "--schedule-file '" + load_schedule_file + "'";
      for (auto* option : {"--schedule", "--stages", "--microbatches", "--chunks"}) ignored(option, file + " (it sets them)");
      try {
        if (std::filesystem::exists(load_schedule_file) && std::filesystem::is_empty(load_schedule_file))
          throw std::invalid_argument("the file is empty");
        plan = np::load_schedule(load_schedule_file);
        np::validate(plan);
      } catch (const std::exception& e) {
        throw std::invalid_argument(file + ": " + e.what());
      }
      stages = plan.stages;
      micro = plan.micro_batches;
      chunks = plan.chunks;
    } else {
      if (schedule_name != "interleaved") ignored("--chunks", "--schedule " + schedule_name + " (interleaved only)");
      if (schedule_name != "interleaved") chunks = 1;
      plan = np::make_schedule(emergent ? "1f1b" : schedule_name, stages, micro, chunks);
    }
    if (!emergent) ignored("--credits", (load_schedule_file.empty() ? "--schedule " + schedule_name : std::string("a schedule file")) + " (emergent only)");
    if (!write_schedule_file.empty()) np::save_schedule(plan, write_schedule_file);
    if (print_schedule && !speak) return 0;
    if (print_schedule) {
      if (emergent)
        std::printf("emergent: no list; per-edge credits and backward-first priority. With S-s credits on stage s "
                    "it runs as 1f1b:\n");
      std::printf("%s\n%s", np::to_table(plan).c_str(), np::to_step_table(plan).c_str());
      std::printf("bubble theory: %.1f%%\n", 100 * np::bubble_theory(plan));
      return 0;
    }

    auto o = resume.empty() ? nl::preset_defaults(model) : resumed;
    const bool inference = evaluate_only || !predict.empty();
    const std::string mode = evaluate_only ? "--evaluate" : "--predict";
    if (inference) {
      nerve::apps::refuse_beside(app, mode, {"--epochs", "--steps", "--batch", "--lr", "--momentum", "--no-shuffle",
                                             "--save", "--checkpoint", "--checkpoint-every", "--resume", "--metrics",
                                             "--no-eval"});
      nerve::apps::own_data_options::refuse_for_evaluation(app, mode);
      if (init.empty())
        throw std::invalid_argument(mode + " needs --init FILE: the weights to evaluate (a --save file, or a --checkpoint)");
    }
    if (!resume.empty()) {
      if (app.count("--epochs")) o.epochs = epochs;
      if (app.count("--steps")) {
        if (steps < 1) throw std::invalid_argument("--steps must be at least 1 (got " + std::to_string(steps) + ")");
        o.steps = steps;
      }
    }
    if (resume.empty()) {
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
      if (app.count("--momentum")) o.momentum = momentum;
      o.seed = seed;
      o.shuffle = !no_shuffle;
      o.normalize = nerve::apps::normalization_of(normalize);
      o.data = data;
      o.evaluate = !no_eval;
      o.allow_nonfinite = allow_nonfinite;
    }
    if (inference) {
      o.init = init;  // the weights' classes size the preset for --test-data
      own_data.apply_for_evaluation(app, o);
    } else {
      own_data.apply(app, o, !resume.empty());
    }
    state.apply(app, o);
    stopping.apply(app, o);
    o.stall_timeout = stall_timeout;
    if (o.batch < std::size_t(micro) * replicas)
      throw std::invalid_argument("--batch " + std::to_string(o.batch) + " cannot split into " +
                                  std::to_string(replicas) + " x " + std::to_string(micro) + " micro-batches");
    if (ranks->size() > 1 && ranks->size() != int(stages * replicas))
      throw std::invalid_argument("--stages " + std::to_string(stages) + " x --replicas " + std::to_string(replicas) +
                                  " place one stage of one replica on each rank: start " +
                                  std::to_string(stages * replicas) + " ranks (mpirun -np " +
                                  std::to_string(stages * replicas) + "), not " + std::to_string(ranks->size()));
    // One loop per stage here: across ranks, a rank runs one.
    if (threads == 0) threads = ranks->size() > 1 ? 1 : stages * replicas;
    o.model = model;
    o.init = init;  // for check_options to compare with the outputs; loaded below, not by the trainer
    o.save = save;
    o.trace = trace;
    o.trace_exact = trace_exact;
    o.threads = threads;
    o.micro_batches = 1;  // the schedule's M splits each replica's part, not the trainer
    o.stop = &stop_requested;
    o.lead = speak;
    nl::check_options(o);  // before the replicas, the partition and the data
    o.init.clear();
    nl::load_own_data(o);  // once: the preset takes its input shape and classes from it
    ranks->agree_inputs(o);  // across ranks: the same data and checkpoint bytes on every rank

    std::vector<nl::graph> graphs;
    for (std::uint32_t r = 0; r < replicas; ++r) {
      graphs.push_back(nl::make_preset_for(o));
      if (!init.empty()) nl::load_weights(graphs.back(), init, allow_nonfinite);  // every replica: the trainer's --init is not used
    }
    std::vector<nl::graph*> replica_graphs;
    for (auto& rg : graphs) replica_graphs.push_back(&rg);
    auto& g = graphs[0];
    np::partition pieces;
    const std::size_t n_pieces = plan.pieces();
    nl::set_gemm_threads(1);  // one product thread per stage loop
    if (partition == "params") pieces = np::partition_by_parameters(g, n_pieces);
    else if (partition == "cost")
      pieces = np::partition_by_cost(g, np::profile_layers(g, std::int64_t(o.batch / micro / replicas), 3, seed),
                                     n_pieces);
    else try {
      pieces = np::partition_at(g, split_list(partition));
      if (pieces.size() != n_pieces)
        throw std::invalid_argument("--partition '" + partition + "' makes " + std::to_string(pieces.size()) +
                                    " pieces; the schedule needs " + std::to_string(n_pieces));
    } catch (const std::exception& e) {
      if (resume.empty()) throw;  // a resume cuts where its checkpoint says: name that
      throw std::invalid_argument("--resume " + resume + ": the checkpoint's setting 'cut' is refused: " + e.what());
    }

    std::string cut;      // the first layer of each piece after the first: how a resume cuts again
    for (std::size_t k = 1; k < pieces.size(); ++k) cut += (k > 1 ? "," : "") + g.nodes()[pieces[k][0]].name;
    o.app_settings = nlohmann::json{{"app", "nerve-pipeline"}, {"schedule", schedule_name}, {"plan", np::to_text(plan)},
                                    {"replicas", replicas}, {"credits", credits}, {"devices", devices}, {"cut", cut}}
                         .dump();

    std::vector<std::string> device_list(stages, "cpu");
    if (!devices.empty()) {
      device_list = split_list(devices);
      if (device_list.size() != stages)
        throw std::invalid_argument((resume.empty() ? "--devices" : "--resume " + resume + ": the checkpoint's setting 'devices'") +
                                    " names " + std::to_string(device_list.size()) + " devices for " +
                                    std::to_string(stages) + " stages");
    }
    std::string banner_totals;
    if (show_summary || (!json && speak && !inference)) {
      // On a graph of its own: the summary's forward calls leave the run's graphs untouched.
      auto sg = nl::make_preset_for(o);
      nl::summary_options so;
      const std::size_t parts = std::size_t(micro) * replicas;
      so.micro_batch = std::int64_t((o.batch + parts - 1) / parts);
      so.places.assign(sg.nodes().size(), "");
      for (std::size_t k = 0; k < pieces.size(); ++k)
        for (std::size_t i : pieces[k])
          so.places[i] = "stage " + std::to_string(k % stages) + " (" + device_list[k % stages] + ")";
      const auto s = nl::summary(sg, so);
      if (show_summary) {
        if (speak) std::cout << (json ? nerve::apps::summary_json(s).dump(2) + "\n" : nl::to_text(s));
        return 0;
      }
      banner_totals = "model: " + nl::totals_line(s) + "\n";
    }
    if (!json && speak && !inference)
      std::printf("nerve-pipeline: %s, %u stages x %u replica%s, %s, %u micro-batches of ~%zu (batch %zu), %s lr %g, "
                  "%u loops\npieces: %s\n%s",
                  model.c_str(), stages, replicas, replicas == 1 ? "" : "s", emergent ? "emergent" : plan.name.c_str(),
                  micro, o.batch / micro / replicas, o.batch, o.optimizer.c_str(), o.lr, threads,
                  np::to_string(g, pieces).c_str(), banner_totals.c_str());
    if (const auto line = nerve::apps::own_data_options::banner_line(o); !json && speak && !inference && !line.empty())
      std::printf("%s\n", line.c_str());

    np::pipeline_options po;
    po.emergent = emergent;
    po.credits = credits;

    for (std::uint32_t s = 0; s < stages * replicas; ++s) po.loops.push_back(s % threads);
    nerve::gpu::register_devices();  // cuda, cuda:N, standin beside the built-in cpu
    for (const auto& d : device_list) (void)nl::parse_device(d, "--devices");  // before the data: a typo costs nothing
    np::engine_outcome outcome;
    auto make_engine = [&](actors::runtime& rt, nl::graph&, const nl::train_options& opts) {
      // Across ranks: the link's poller on this rank's stage loop.
      // (A copy: the link lives no longer than the engine, on whose runtime its poller runs.)
      auto here = po;
      if (ranks->size() > 1) here.link = ranks->link_on(rt, po.loops[std::size_t(ranks->rank())]);
      here.on_stall = ranks->on_stall(rt, opts.trace.string(), "nerve-pipeline");
      auto e = std::make_unique<np::pipeline_engine>(rt, replica_graphs, pieces, plan, opts, here, device_list, outcome,
                                                     ranks->for_engine("nerve-pipeline"));
      if (!json && speak && !devices.empty())
        for (std::uint32_t s = 0; s < stages; ++s) std::printf("stage %u on %s\n", s, outcome.device_of[s].c_str());
      return e;
    };
    if (inference) {
      o.init = init;  // every replica has it already; the stages start from replica 0's
      const auto e = nl::evaluate(g, o, predict, make_engine);
      if (!speak) return 0;
      if (!json)
        std::printf("nerve-pipeline: %s with the weights of %s on %u stages x %u replica%s\n", model.c_str(),
                    init.c_str(), stages, replicas, replicas == 1 ? "" : "s");
      if (json) {
        nlohmann::json j;
        j["model"] = model;
        j["weights"] = init;
        j["stages"] = stages;
        j["replicas"] = replicas;
        j["ranks"] = ranks->size();
        j["devices"] = outcome.device_of;
        nerve::apps::add_evaluation_json(j, e, predict);
        std::cout << j.dump(2) << "\n";
      } else {
        std::printf("%s\n", nerve::apps::test_line(e.test.loss, e.test.accuracy, e.test.correct, e.test.samples).c_str());
        if (!predict.empty()) std::printf("predictions written to %s\n", predict.c_str());
        if (!trace.empty()) std::printf("trace written to %s\n", trace.c_str());
      }
      return 0;
    }
    progress_bar bar(quiet || json || !speak);
    install_stop_handlers();
    nlohmann::json epochs_json = nlohmann::json::array();
    auto report = nl::train(
        g, o, [&](const nl::train_progress& p) { bar(p); },
        [&](const nl::epoch_stats& e) {
          epochs_json.push_back({{"epoch", e.epoch},
                                 {"interrupted", e.interrupted},
                                 {"train_loss", e.train_loss},
                                 {"train_accuracy", e.train_accuracy},
                                 {"test_loss", e.test_loss},
                                 {"test_accuracy", e.test_accuracy},
                                 {"seconds", e.seconds},
                                 {"samples_per_s", e.samples_per_s}});
          if (!json && speak) {
            std::printf("epoch %2d  train loss %.4f  train acc %6.2f%%", e.epoch, e.train_loss, 100 * e.train_accuracy);
            // A language model's evaluation is its validation part's loss per token.
            if (o.evaluate && !e.interrupted && nl::reads_text(o.model))
              std::printf("  val loss %.4f  val token acc %6.2f%%", e.test_loss, 100 * e.test_accuracy);
            else if (o.evaluate && !e.interrupted)
              std::printf("  test acc %6.2f%%", 100 * e.test_accuracy);
            std::printf("  %6.2f s  %8.0f samples/s%s\n", e.seconds, e.samples_per_s, e.interrupted ? "  (interrupted)" : "");
            std::fflush(stdout);
          }
        },
        make_engine);
    const std::int64_t step = report.steps;
    if (report.nothing_left && speak && !json)
      std::printf("nerve-pipeline: the run in %s has ended (%d epoch%s, %lld steps): nothing left to do; --epochs "
                  "or --steps above its own extend it\n",
                  resume.c_str(), o.epochs, o.epochs == 1 ? "" : "s", static_cast<long long>(step));
    if (report.nothing_left) {  // no stage ran: no figures to show
      if (speak && json)
        std::cout << nlohmann::json{{"model", model}, {"steps", step}, {"nothing_left", true}, {"epochs", epochs_json}}.dump(2)
                  << "\n";
      if (speak && !json && !save.empty()) std::printf("weights written to %s\n", save.c_str());
      return 0;
    }
    const double train_seconds = outcome.train_seconds;
    const std::int64_t trained = outcome.trained;
    const auto& device_of = outcome.device_of;

    const double theory = np::bubble_theory(plan);
    const auto& metrics = outcome.metrics;
    const auto predicted = np::predicted_bubbles(plan, metrics);
    if (!speak) {
    } else if (json) {
      nlohmann::json j;
      j["model"] = model;
      j["schedule"] = emergent ? "emergent" : plan.name;
      j["stages"] = stages;
      j["microbatches"] = micro;
      j["chunks"] = plan.chunks;
      j["replicas"] = replicas;
      j["ranks"] = ranks->size();
      j["batch"] = o.batch;
      j["lr"] = o.lr;
      j["threads"] = threads;
      j["seed"] = seed;
      j["steps"] = step;
      j["interrupted"] = report.interrupted;
      j["pieces"] = np::to_string(g, pieces);
      j["devices"] = device_of;
      j["samples_per_s"] = train_seconds > 0 ? double(trained) / train_seconds : 0;
      j["epochs"] = epochs_json;
      j["stages_detail"] = nlohmann::json::array();
      for (std::size_t s = 0; s < metrics.size(); ++s) {
        const auto& m = metrics[s];
        j["stages_detail"].push_back({{"stage", m.stage},
                                      {"busy_s", m.busy_s},
                                      {"idle_s", m.idle_s},
                                      {"idle_input_s", m.idle_input_s},
                                      {"idle_backpressure_s", m.idle_backpressure_s},
                                      {"idle_optimizer_s", m.idle_optimizer_s},
                                      {"bubble_fraction", m.bubble_fraction()},
                                      {"bubble_theory", theory},
                                      {"bubble_predicted", predicted[s]},
                                      {"peak_stashed_microbatches", m.peak_stashed},
                                      {"peak_stash_bytes", m.peak_stash_bytes}});
      }
      j["per_stage"] = j["stages_detail"];
      j.erase("stages_detail");
      if (!trace.empty()) j["trace"] = trace;
      if (!metrics_file.empty()) j["metrics"] = metrics_file;
      std::cout << j.dump(2) << "\n";
    } else {
      std::printf("\n%-6s %10s %10s %10s %10s %10s %8s %8s %8s %8s %10s\n", "stage", "busy s", "idle s", "input s",
                  "backpr. s", "optim. s", "bubble", "theory", "this cut", "peak mb", "peak MiB");
      for (const auto& m : metrics)
        std::printf("%-6u %10.3f %10.3f %10.3f %10.3f %10.3f %7.1f%% %7.1f%% %7.1f%% %8zu %10.2f\n", m.stage, m.busy_s,
                    m.idle_s, m.idle_input_s, m.idle_backpressure_s, m.idle_optimizer_s, 100 * m.bubble_fraction(),
                    100 * theory, 100 * predicted[m.stage], m.peak_stashed, double(m.peak_stash_bytes) / (1 << 20));
      std::printf("theory: equal stages, (S-1)/(M+S-1) for gpipe and 1f1b; this cut: the schedule simulated with each "
                  "stage's measured action times\n");
      std::printf("\nplanned (%s):\n%s\n%s", emergent ? "emergent runs without a list; 1f1b shown" : plan.name.c_str(),
                  np::to_table(plan).c_str(), outcome.measured.c_str());
      std::printf("%.0f samples/s over %lld steps\n", train_seconds > 0 ? double(trained) / train_seconds : 0,
                  static_cast<long long>(step));
      if (!save.empty()) std::printf("weights written to %s\n", save.c_str());
      if (!trace.empty()) std::printf("trace written to %s\n", trace.c_str());
      if (!metrics_file.empty()) std::printf("metrics written to %s\n", metrics_file.c_str());
    }
    if (report.interrupted) {
      if (speak)  // every rank stopped at the same step; rank 0 speaks for the job
        std::fprintf(stderr, "nerve-pipeline: interrupted by %s after %lld steps%s\n",
                     nerve::apps::stop_cause().c_str(), static_cast<long long>(step),
                     save.empty() ? "" : ("; the weights of its last step were written to " + save).c_str());
      return 128 + (stop_signal ? int(stop_signal) : SIGINT);
    }
  } catch (const std::exception& e) {
    if (ranks) ranks->fail("nerve-pipeline", e.what());  // in a multi-rank job: leaves at once
    else std::fprintf(stderr, "nerve-pipeline: %s\n", e.what());
    return 1;
  }
  return 0;
}

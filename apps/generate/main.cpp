// nerve-generate: text from a trained `gpt` preset, one byte at a time, on the engine that
// trains it (the layer actors on the CPU, or a device network).
//
//   prompt ─► tokens ─► window [1, 64] ─► engine.predict ─► logits [1, 64, vocab]
//                ▲        (the last 64 tokens,                     │ the last real position
//                │         token 0 after them)                     ▼
//                └──────────────── next token ◄── sampler (temperature, top-k, seed)
//
// The weights do not hold the vocabulary: the corpus does (--data, as nerve-train read it).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <span>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "actors/runtime.hpp"
#include "apps/common/options.hpp"
#include "apps/generate/sampler.hpp"
#include "gpu/layers/train.hpp"
#include "layers/checkpoint/checkpoint.hpp"
#include "layers/data/text.hpp"
#include "layers/gemm.hpp"
#include "layers/presets.hpp"
#include "layers/trainer.hpp"

using namespace nerve::layers;

namespace {

/// What the command line asked for.
struct generate_request {
  std::string init, prompt, data = std::string(nerve::data::fortunes_default_dir), device = "cpu";
  std::string temperature_text = "1";
  long long tokens = -1;
  std::size_t top_k = 0;
  unsigned long long seed = 0;
  unsigned threads = 1;
  bool json = false, tokens_given = false;
};

/// A byte as a message names it: `'a' (\x61)`, or `\x0A` alone when it does not print.
std::string byte_name(unsigned char b) {
  char hex[8];
  std::snprintf(hex, sizeof hex, "\\x%02X", unsigned(b));
  if (b >= 0x20 && b < 0x7f) return "'" + std::string(1, char(b)) + "' (" + hex + ")";
  return hex;
}

/// The weights of `path` (a --save file or a checkpoint), checked to be a `gpt`'s over
/// `vocab` tokens before the network is built: the errors a user can act on, in the
/// user's words, rather than a name-by-name mismatch.
void check_weights(const std::filesystem::path& path, const nerve::data::text_corpus& corpus,
                   const std::string& data) {
  const auto d = [&] {
    try {
      return nerve::checkpoint::load_checkpoint(path);
    } catch (const std::exception& e) {
      throw std::invalid_argument("--init: " + std::string(e.what()));
    }
  }();
  const auto model = d.metadata.find("model");
  if (model != d.metadata.end() && model->second != "gpt")
    throw std::invalid_argument("--init " + path.string() + " holds the weights of model '" + model->second +
                                "': nerve-generate samples text from a 'gpt' (nerve-train --model gpt --save FILE)");
  if (!d.contains("wte.weight"))
    throw std::invalid_argument("--init " + path.string() +
                                " holds no wte.weight (the token embedding): not the weights of a 'gpt'");
  const auto& wte = d.at("wte.weight").shape;
  if (wte.size() != 2)
    throw std::invalid_argument("--init " + path.string() + ": wte.weight has " + std::to_string(wte.size()) +
                                " dimensions, not 2 (tokens x width)");
  if (wte[0] != corpus.vocab_size())
    throw std::invalid_argument("--init " + path.string() + " has " + std::to_string(wte[0]) +
                                " tokens (wte.weight rows) but the corpus in " + data + " has " +
                                std::to_string(corpus.vocab_size()) +
                                ": the weights were trained on another text (give its folder with --data)");
  // A NaN or Inf weight samples noise; said here, where --allow-nonfinite is no option.
  for (const auto& [name, t] : d.tensors()) {
    if (t.is_integer || name.starts_with("optimizer.")) continue;
    for (std::size_t i = 0; i < t.floats.size(); ++i)
      if (!std::isfinite(t.floats[i]))
        throw std::invalid_argument("--init " + path.string() + ": " + name + " element " + std::to_string(i) +
                                    " is " + std::to_string(t.floats[i]) + ": its text would be noise");
  }
}

/// The prompt's tokens; throws naming the first byte the vocabulary lacks.
std::vector<std::int64_t> tokens_of(const std::string& prompt, const nerve::data::text_corpus& corpus,
                                    const std::string& data) {
  std::vector<std::int64_t> t;
  for (std::size_t i = 0; i < prompt.size(); ++i) {
    const auto b = static_cast<unsigned char>(prompt[i]);
    if (corpus.token_of[b] < 0)
      throw std::invalid_argument("--prompt: byte " + byte_name(b) + " at position " + std::to_string(i) +
                                  " is not in the vocabulary of the corpus in " + data + " (" +
                                  std::to_string(corpus.vocab_size()) + " tokens)");
    t.push_back(corpus.token_of[b]);
  }
  return t;
}

int generate(const generate_request& r) {
  if (r.init.empty())
    throw std::invalid_argument(
        "--init FILE is required: the weights of a 'gpt' (nerve-train --model gpt --save FILE)");
  if (r.prompt.empty()) throw std::invalid_argument("--prompt must hold at least one byte: the text to go on from");
  if (!r.tokens_given) throw std::invalid_argument("--tokens N is required: how many bytes to generate");
  if (r.tokens < 1)
    throw std::invalid_argument("--tokens must be at least 1 (got " + std::to_string(r.tokens) + ")");
  const auto temperature = nerve::apps::finite_number(r.temperature_text);
  if (!temperature || *temperature <= 0)
    throw std::invalid_argument("--temperature must be a finite number above 0 (got '" + r.temperature_text + "')");
  if (r.threads < 1 || r.threads > max_threads)
    throw std::invalid_argument("--threads must be between 1 and " + std::to_string(max_threads) + " (got " +
                                std::to_string(r.threads) + ")");
  const auto corpus = nerve::data::load_text_corpus(r.data);
  const auto vocab = corpus.vocab_size();
  if (r.top_k > vocab)
    throw std::invalid_argument("--top-k " + std::to_string(r.top_k) + " is beyond the vocabulary of the corpus in " +
                                r.data + " (" + std::to_string(vocab) + " tokens; 0 keeps them all)");
  auto context = tokens_of(r.prompt, corpus, r.data);
  check_weights(r.init, corpus, r.data);

  nerve::gpu::register_devices();  // --device cuda, cuda:N, standin beside the built-in cpu
  auto make_engine = engine_for(r.device);
  auto g = make_preset("gpt", 0, preset_shape{shape{gpt_context}, std::int64_t(vocab)});
  load_weights(g, r.init, true);  // checked above, in this app's words
  auto o = preset_defaults("gpt");
  o.device = r.device;
  o.threads = r.threads;
  set_gemm_threads(int(r.threads));
  nerve::actors::runtime rt({.loops = r.threads});
  auto engine = make_engine(rt, g, o);

  if (!r.json) {
    std::fwrite(r.prompt.data(), 1, r.prompt.size(), stdout);
    std::fflush(stdout);
  }
  nerve::apps::token_sampler sample(r.seed, *temperature, r.top_k);
  std::string text;
  const auto start = std::chrono::steady_clock::now();
  for (long long k = 0; k < r.tokens; ++k) {
    // The last `gpt_context` tokens, then token 0 up to the window's end: attention is
    // causal, so the positions read below never see the padding.
    const auto n = std::min<std::size_t>(context.size(), std::size_t(gpt_context));
    auto x = tensor::zeros(1, shape{gpt_context});
    for (std::size_t i = 0; i < n; ++i) x.data()[i] = float(context[context.size() - n + i]);
    const auto logits = engine->predict(std::move(x)).get();
    if (logits.size() != gpt_context * std::int64_t(vocab))
      throw std::runtime_error("the network gave " + std::to_string(logits.size()) + " outputs for a window, not " +
                               std::to_string(gpt_context) + " x " + std::to_string(vocab));
    const auto next = sample(std::span<const float>(logits.data() + (n - 1) * vocab, vocab));
    context.push_back(std::int64_t(next));
    const char byte = char(corpus.vocabulary[next]);
    text += byte;
    if (!r.json) {
      std::fputc(byte, stdout);
      std::fflush(stdout);  // each byte as it is made: the app's progress
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  engine->finish();
  rt.synchronize();
  if (r.json) {
    nlohmann::json j;
    j["prompt"] = r.prompt;
    j["text"] = text;
    j["tokens"] = r.tokens;
    j["seed"] = r.seed;
    j["temperature"] = *temperature;
    j["top_k"] = r.top_k;
    j["device"] = r.device;
    j["seconds"] = seconds;
    j["tokens_per_s"] = seconds > 0 ? double(r.tokens) / seconds : 0.0;
    // A byte model may stop inside a UTF-8 sequence: such bytes become U+FFFD in the JSON.
    std::cout << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    std::fputc('\n', stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"nerve-generate: text from a trained gpt preset, a byte at a time, on the engine that trains it"};
  generate_request r;
  app.add_option("--init", r.init, "The weights of a gpt (nerve-train --model gpt --save FILE, or a --checkpoint)")
      ->type_name("FILE");
  app.add_option("--prompt", r.prompt, "The text to go on from (each byte must be in the corpus's vocabulary)");
  nerve::apps::add_whole(app, "--tokens", r.tokens, "Bytes to generate, 1 or more");
  app.add_option("--temperature", r.temperature_text,
                 "Divides the logits before the softmax: below 1 sharper, above 1 flatter (default 1)")
      ->type_name("FLOAT");
  nerve::apps::add_whole(app, "--top-k", r.top_k, "Draw among the K most likely bytes only (default 0: all)");
  nerve::apps::add_whole(app, "--seed", r.seed, "Seed of the draws: the same seed gives the same text");
  app.add_option("--device", r.device,
                 "Where the network runs: cpu, cuda, cuda:N or standin (the CPU stand-in of a GPU)");
  app.add_option("--data", r.data,
                 "The corpus the weights were trained on: its vocabulary (default /usr/share/games/fortunes)")
      ->type_name("DIR");
  nerve::apps::add_whole(app, "--threads", r.threads, "Event loops, and threads per matrix product");
  app.add_flag("--json", r.json, "Print one JSON object at the end instead of the text as it is made");
  if (const int status = nerve::apps::parse_command_line(app, argc, argv, "nerve-generate"); status >= 0)
    return status;
  r.tokens_given = app.count("--tokens") > 0;
  try {
    return generate(r);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "nerve-generate: %s\n", e.what());
    return 1;
  }
}

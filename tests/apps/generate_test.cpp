// nerve-generate (issue #36): text from a gpt trained by nerve-train, as a user runs both.
// One tiny corpus and one model trained on it for 14 steps serve every case: enough for its
// most likely byte to depend on the text before it, far from enough for words.
#include <doctest/doctest.h>

#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "layers/checkpoint/checkpoint.hpp"
#include "layers/data/text.hpp"
#include "layers/executor.hpp"
#include "layers/presets.hpp"
#include "layers/trainer.hpp"
#include "tests/apps/app_process.hpp"

namespace fs = std::filesystem;
using nerve::testing::run_app;
using nlohmann::json;

namespace {

// Names of their own: model_test.cpp has a train_app and a pipeline_app (one unity file in CI).
const std::string gpt_train_app = NERVE_TRAIN_BIN, generate_app = NERVE_GENERATE_BIN, gpt_pipeline_app = NERVE_PIPELINE_BIN;

/// A corpus folder of a few KB of lower-case words and its gpt weights after two epochs of
/// nerve-train (14 steps), made once for the test binary and removed at its exit.
struct trained_gpt {
  fs::path dir, corpus, weights, checkpoint;
  std::string train_error;
  trained_gpt() {
    std::string tmpl = (fs::temp_directory_path() / "nerve-generate-XXXXXX").string();
    dir = ::mkdtemp(tmpl.data());
    corpus = dir / "corpus";
    fs::create_directories(corpus);
    write_words(corpus / "words", 4000, "");
    weights = dir / "w.safetensors";
    checkpoint = dir / "run.ck";
    const auto r = run_app({gpt_train_app, "--model", "gpt", "--data", corpus.string(), "--epochs", "2", "--batch", "8",
                            "--no-eval", "--quiet", "--save", weights.string(), "--checkpoint", checkpoint.string()});
    if (r.exit_code != 0) train_error = "nerve-train failed (" + std::to_string(r.exit_code) + "): " + r.err;
  }
  ~trained_gpt() { fs::remove_all(dir); }
  /// About `bytes` bytes of words from a fixed list (28 distinct bytes: every lower-case
  /// letter, space and newline), lines of eight, in a fixed order, then `extra` (bytes the
  /// words lack: a corpus of another vocabulary).
  static void write_words(const fs::path& file, std::size_t bytes, const std::string& extra) {
    static const char* words[] = {"the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "and",
                                  "runs", "into", "woods", "where", "owls", "hum", "very", "softly"};
    std::string text;
    for (std::size_t i = 0; text.size() < bytes; ++i) {
      text += words[(i * 7 + i / std::size(words)) % std::size(words)];
      text += (i % 8 == 7) ? '\n' : ' ';
    }
    std::ofstream(file, std::ios::binary) << text << extra;
  }
};

const trained_gpt& gpt() {
  static const trained_gpt t;
  REQUIRE_MESSAGE(t.train_error.empty(), t.train_error);
  return t;
}

std::vector<std::string> generate_args(std::vector<std::string> extra) {
  std::vector<std::string> a = {generate_app, "--init", gpt().weights.string(), "--data", gpt().corpus.string()};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

/// What the app printed on stdout; fails the test (showing stderr) when it exited non-zero.
std::string text_of(const std::vector<std::string>& extra) {
  const auto r = run_app(generate_args(extra));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  return r.out;
}

}  // namespace

TEST_SUITE("apps.generate") {
  TEST_CASE("the same seed gives the same text, another seed another") {
    const auto a = text_of({"--prompt", "the fox", "--tokens", "48", "--seed", "1"});
    CHECK(a == text_of({"--prompt", "the fox", "--tokens", "48", "--seed", "1"}));
    CHECK(a != text_of({"--prompt", "the fox", "--tokens", "48", "--seed", "2"}));
  }

  TEST_CASE("the output is the prompt, then a byte of the corpus per token asked for") {
    const auto out = text_of({"--prompt", "the fox", "--tokens", "30", "--seed", "3"});
    REQUIRE(out.size() == std::string("the fox").size() + 30 + 1);
    CHECK(out.starts_with("the fox"));
    CHECK(out.back() == '\n');
    for (char c : out.substr(7, 30)) {
      CAPTURE(c);
      CHECK((c == ' ' || c == '\n' || (c >= 'a' && c <= 'z')));
    }
  }

  TEST_CASE("a prompt longer than the context slides its window over the last 64 tokens") {
    std::string prompt;
    while (prompt.size() < 100) prompt += "the quick brown fox ";
    const auto out = text_of({"--prompt", prompt, "--tokens", "8", "--seed", "4"});
    CHECK(out.size() == prompt.size() + 8 + 1);
    CHECK(out.starts_with(prompt));
  }

  TEST_CASE("top-k 1 takes the most likely byte whatever the seed") {
    const auto a = text_of({"--prompt", "owls", "--tokens", "24", "--top-k", "1", "--seed", "1"});
    CHECK(a == text_of({"--prompt", "owls", "--tokens", "24", "--top-k", "1", "--seed", "99"}));
  }

  TEST_CASE("top-k 1 follows the logits of the prompt's last position, whatever comes after it in the window") {
    // The same weights run here by the direct executor, the window padded with the last
    // token instead of token 0: a causal model's logits at the text's positions cannot
    // tell, so the greedy bytes agree unless the app reads another position.
    const auto corpus = nerve::data::load_text_corpus(gpt().corpus);
    const auto vocab = std::int64_t(corpus.vocab_size());
    auto g = nerve::layers::make_preset("gpt", 0, {nerve::layers::shape{nerve::layers::gpt_context}, vocab});
    nerve::layers::load_weights(g, gpt().weights);
    nerve::layers::basic_direct_executor<float> run(g);
    std::string text = "owls";
    for (int k = 0; k < 12; ++k) {
      auto x = nerve::layers::tensor::constant(1, nerve::layers::shape{nerve::layers::gpt_context}, float(vocab - 1));
      for (std::size_t i = 0; i < text.size(); ++i) x.data()[i] = float(corpus.token_of[std::uint8_t(text[i])]);
      const auto logits = run.predict(std::move(x));
      const float* last = logits.data() + (text.size() - 1) * std::size_t(vocab);
      text += char(corpus.vocabulary[std::size_t(std::max_element(last, last + vocab) - last)]);
    }
    CHECK(text_of({"--prompt", "owls", "--tokens", "12", "--top-k", "1"}) == text + "\n");
  }

  TEST_CASE("a checkpoint's weights give the text of the weights saved at its step") {
    const auto saved = text_of({"--prompt", "dog", "--tokens", "24", "--seed", "5"});
    const auto r = run_app({generate_app, "--init", gpt().checkpoint.string(), "--data", gpt().corpus.string(),
                            "--prompt", "dog", "--tokens", "24", "--seed", "5"});
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    CHECK(r.out == saved);
  }

  TEST_CASE("--json prints one object with the prompt, the text and the figures") {
    const auto plain = text_of({"--prompt", "a lazy", "--tokens", "20", "--seed", "7", "--top-k", "5",
                                "--temperature", "0.8"});
    const auto j = json::parse(text_of({"--prompt", "a lazy", "--tokens", "20", "--seed", "7", "--top-k", "5",
                                        "--temperature", "0.8", "--json"}));
    CHECK(j["prompt"] == "a lazy");
    CHECK(j["text"].get<std::string>().size() == 20);
    CHECK(plain == "a lazy" + j["text"].get<std::string>() + "\n");  // the same draws as the plain run
    CHECK(j["tokens"] == 20);
    CHECK(j["seed"] == 7);
    CHECK(j["temperature"] == 0.8);
    CHECK(j["top_k"] == 5);
    CHECK(j["device"] == "cpu");
    CHECK(j["seconds"].get<double>() > 0);
    CHECK(j["tokens_per_s"].get<double>() > 0);
  }

  TEST_CASE("the stand-in device's engine generates too") {
    const auto out = text_of({"--prompt", "the", "--tokens", "10", "--device", "standin"});
    CHECK(out.size() == 3 + 10 + 1);
    CHECK(out.starts_with("the"));
  }

  TEST_CASE("what nerve-generate refuses, it names, with status 1") {
    const auto& t = gpt();
    const std::string w = t.weights.string(), data = t.corpus.string();
    // Weights of another model, and of a gpt over another vocabulary.
    const auto mlp = t.dir / "mlp.safetensors";
    {
      nerve::checkpoint::state_dict d;
      d.add("fc1.weight", {2, 2}, {1, 2, 3, 4});
      d.metadata["model"] = "mlp";
      nerve::checkpoint::save_checkpoint(mlp, d);
    }
    // The trained weights with one NaN.
    const auto nan = t.dir / "nan.safetensors";
    {
      const auto trained = nerve::checkpoint::load_checkpoint(t.weights);
      nerve::checkpoint::state_dict d;
      d.metadata = trained.metadata;
      for (const auto& [name, tensor] : trained.tensors()) {
        auto values = tensor.floats;
        if (name == "ln_f.weight") values[3] = std::numeric_limits<float>::quiet_NaN();
        d.add(name, tensor.shape, std::move(values));
      }
      nerve::checkpoint::save_checkpoint(nan, d);
    }
    const auto other = t.dir / "other";
    fs::create_directories(other);
    trained_gpt::write_words(other / "words", 4000, "XYZ");
    const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
        {{generate_app, "--prompt", "the", "--tokens", "4", "--data", data},
         "nerve-generate: --init FILE is required"},
        {{generate_app, "--init", w, "--data", data, "--prompt", "", "--tokens", "4"},
         "nerve-generate: --prompt must hold at least one byte"},
        {{generate_app, "--init", w, "--data", data, "--prompt", "the Zoo", "--tokens", "4"},
         "nerve-generate: --prompt: byte 'Z' (\\x5A) at position 4 is not in the vocabulary of the corpus in " + data},
        {{generate_app, "--init", w, "--data", data, "--prompt", "the\tfox", "--tokens", "4"},
         "nerve-generate: --prompt: byte \\x09 at position 3 is not in the vocabulary"},
        {{generate_app, "--init", w, "--data", data, "--prompt", "the", "--tokens", "0"},
         "nerve-generate: --tokens must be at least 1 (got 0)"},
        {{generate_app, "--init", w, "--data", data, "--prompt", "the"}, "nerve-generate: --tokens N is required"},
        {{generate_app, "--init", w, "--data", data, "--prompt", "the", "--tokens", "4", "--temperature", "0"},
         "nerve-generate: --temperature must be a finite number above 0 (got '0')"},
        {{generate_app, "--init", w, "--data", data, "--prompt", "the", "--tokens", "4", "--temperature", "-1"},
         "nerve-generate: --temperature must be a finite number above 0 (got '-1')"},
        {{generate_app, "--init", w, "--data", data, "--prompt", "the", "--tokens", "4", "--temperature", "nan"},
         "nerve-generate: --temperature must be a finite number above 0 (got 'nan')"},
        {{generate_app, "--init", w, "--data", data, "--prompt", "the", "--tokens", "4", "--temperature", "inf"},
         "nerve-generate: --temperature must be a finite number above 0 (got 'inf')"},
        {{generate_app, "--init", w, "--data", data, "--prompt", "the", "--tokens", "4", "--top-k", "1000"},
         "nerve-generate: --top-k 1000 is beyond the vocabulary of the corpus in " + data},
        {{generate_app, "--init", mlp.string(), "--data", data, "--prompt", "the", "--tokens", "4"},
         "nerve-generate: --init " + mlp.string() + " holds the weights of model 'mlp'"},
        {{generate_app, "--init", nan.string(), "--data", data, "--prompt", "the", "--tokens", "4"},
         "nerve-generate: --init " + nan.string() + ": ln_f.weight element 3 is nan: its text would be noise"},
        {{generate_app, "--init", w, "--data", other.string(), "--prompt", "the", "--tokens", "4"},
         "nerve-generate: --init " + w + " has 28 tokens (wte.weight rows) but the corpus in " + other.string() +
             " has 31"},
        {{generate_app, "--init", w, "--data", data, "--prompt", "the", "--tokens", "4", "--device", "tpu"},
         "nerve-generate: unknown --device 'tpu'"},
    };
    for (const auto& [args, message] : cases) {
      CAPTURE(args);
      const auto r = run_app(args);
      CHECK(r.exit_code == 1);
      CHECK_MESSAGE(r.err.starts_with(message), r.err);
      CHECK(r.out.empty());  // nothing generated, not even the prompt
    }
  }

  TEST_CASE("nerve-pipeline cuts gpt over 2 and 3 stages, its tied head on the last: the weights of one stage") {
    const auto& t = gpt();
    std::vector<std::string> saved;
    for (const char* stages : {"1", "2", "3"}) {
      const auto w = (t.dir / (std::string("pipe") + stages + ".safetensors")).string();
      const auto r = run_app({gpt_pipeline_app, "--model", "gpt", "--data", t.corpus.string(), "--stages", stages,
                              "--microbatches", "4", "--batch", "8", "--steps", "3", "--schedule", "1f1b", "--quiet",
                              "--save", w});
      REQUIRE_MESSAGE(r.exit_code == 0, r.err);
      std::ifstream in(w, std::ios::binary);
      saved.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    CHECK(saved[0].size() > 3000000);  // 0.8M parameters, the tied weight once
    CHECK(saved[1] == saved[0]);
    CHECK(saved[2] == saved[0]);
  }
}

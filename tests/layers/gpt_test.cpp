// The `gpt` preset: its checkpoint names are the PyTorch module paths of docs/layers.md's
// GPT with the head tied to the token embedding (no tensor of its own), its training
// settings the issue's, and `train` reads a text corpus as windows with a label per token.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "layers/checkpoint/checkpoint.hpp"
#include "layers/embedding.hpp"
#include "layers/linear.hpp"
#include "layers/presets.hpp"
#include "layers/trainer.hpp"

using namespace nerve::layers;

namespace {

/// A folder holding one text file of `n` bytes (a few words over and over), removed at the end.
struct gpt_corpus_dir {
  std::filesystem::path path;
  explicit gpt_corpus_dir(std::size_t n) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "nerve-gpt-XXXXXX").string();
    path = ::mkdtemp(tmpl.data());
    const std::string words = "the quick brown fox jumps over the lazy dog. ";
    std::string text;
    while (text.size() < n) text += words;
    text.resize(n);
    std::ofstream(path / "corpus.txt", std::ios::binary) << text;
  }
  ~gpt_corpus_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

}  // namespace

TEST_SUITE("layers.gpt") {
  TEST_CASE("the gpt preset's parameters are the PyTorch GPT's modules, the tied head without a tensor") {
    auto g = make_preset("gpt", 1, preset_shape{shape{64}, 114});
    std::vector<std::pair<std::string, std::vector<std::int64_t>>> want{{"wte.weight", {114, 128}},
                                                                        {"wpe.weight", {1, 64, 128}}};
    for (int i = 0; i < 4; ++i) {
      const std::string p = "blocks." + std::to_string(i) + ".";
      for (auto [name, dims] : std::vector<std::pair<std::string, std::vector<std::int64_t>>>{
               {"ln1.weight", {128}},
               {"ln1.bias", {128}},
               {"attn.qkv.weight", {384, 128}},
               {"attn.qkv.bias", {384}},
               {"attn.proj.weight", {128, 128}},
               {"attn.proj.bias", {128}},
               {"ln2.weight", {128}},
               {"ln2.bias", {128}},
               {"mlp.fc.weight", {512, 128}},
               {"mlp.fc.bias", {512}},
               {"mlp.proj.weight", {128, 512}},
               {"mlp.proj.bias", {128}}})
        want.emplace_back(p + name, dims);
    }
    want.push_back({"ln_f.weight", {128}});
    want.push_back({"ln_f.bias", {128}});
    std::vector<std::pair<std::string, std::vector<std::int64_t>>> got;
    for (const auto& p : g.parameters()) got.emplace_back(p.name, p.torch_shape);
    CHECK(got == want);
    CHECK(g.parameter_count() == 114 * 128 + 64 * 128 +
                                     4 * (4 * 128 + (384 * 128 + 384) + (128 * 128 + 128) + (512 * 128 + 512) +
                                          (128 * 512 + 128)) +
                                     2 * 128);
    CHECK(g.nodes()[g.output()].output_shape == shape{64, 114});
    CHECK(g.nodes()[g.ties().at(0).copy].name == "head");
    CHECK(is_preset(g, "gpt"));
    CHECK_THROWS_WITH(make_preset("gpt", 1, preset_shape{shape{1, 28, 28}, 10}),
                      "model 'gpt' takes windows of [T] token ids but the data's samples are [1, 28, 28]");
  }

  TEST_CASE("the gpt preset trains with AdamW, betas (0.9, 0.99), weight decay 0.1, batch 32, for 2 epochs") {
    const auto o = preset_defaults("gpt");
    CHECK(o.optimizer == "adamw");
    CHECK(o.lr == 1e-3);
    CHECK(o.beta2 == 0.99);
    CHECK(o.weight_decay == 0.1);
    CHECK(o.batch == 32);
    CHECK(o.epochs == 2);
    CHECK(reads_text("gpt"));
    CHECK_FALSE(reads_text("vit"));
    train_options bad = o;
    bad.beta2 = 1;
    CHECK_THROWS_WITH(check_options(bad), "beta2 (Adam's second-moment decay) must be in [0, 1) (got 1)");
  }

  TEST_CASE("train reads a text corpus as windows, reports the validation loss, and saves the tied weight once") {
    gpt_corpus_dir corpus(8000);
    auto o = preset_defaults("gpt");
    o.data = corpus.path;
    o.batch = 8;
    o.steps = 2;
    o.epochs = 1;
    o.threads = 1;
    o.save = corpus.path / "gpt.safetensors";
    o.metrics = corpus.path / "metrics.jsonl";
    const auto report = train(o);
    REQUIRE(report.epochs.size() == 1);
    CHECK(report.steps == 2);
    const auto& e = report.epochs[0];
    // A loss per token over the text's 28 symbols: near ln 28 after two steps from a small start.
    CHECK(std::isfinite(e.test_loss));
    CHECK(e.test_loss > 1.0);
    CHECK(e.test_loss < 4.0);
    CHECK(e.test_accuracy >= 0.0);
    CHECK(e.test_accuracy <= 1.0);
    CHECK(e.train_accuracy <= 1.0);
    const auto saved = nerve::checkpoint::load_checkpoint(o.save);
    CHECK(saved.contains("wte.weight"));
    CHECK_FALSE(saved.contains("head.weight"));
    // Loaded into a fresh model, the head's copy is the embedding's.
    auto g = make_preset("gpt", 9, preset_shape{shape{64}, 28});
    load_weights(g, o.save);
    auto& w = g.layer<embedding>("wte").weight();
    auto& h = g.layer<linear>("head").weight();
    CHECK(std::equal(w.data(), w.data() + w.size(), h.data(), h.data() + h.size()));
    std::ifstream metrics(o.metrics);
    std::string line, last;
    while (std::getline(metrics, line)) last = line;
    CHECK(last.find("\"test_loss\"") != std::string::npos);
  }
}

// The `vit` preset: its checkpoint names are the PyTorch module paths of docs/layers.md's
// ViT, its shapes those of the starting point, and it refuses images it cannot cut.
#include <doctest/doctest.h>

#include <string>
#include <utility>
#include <vector>

#include "layers/presets.hpp"
#include "layers/trainer.hpp"

using namespace nerve::layers;

TEST_SUITE("layers.vit") {
  TEST_CASE("the vit preset's parameters are named and shaped as the PyTorch ViT's modules") {
    auto g = make_preset("vit", 1);
    std::vector<std::pair<std::string, std::vector<std::int64_t>>> want{
        {"patch.weight", {64, 49}}, {"patch.bias", {64}}, {"cls.weight", {1, 1, 64}}, {"pos.weight", {1, 17, 64}}};
    for (int i = 0; i < 4; ++i) {
      const std::string p = "blocks." + std::to_string(i) + ".";
      for (auto [name, dims] : std::vector<std::pair<std::string, std::vector<std::int64_t>>>{
               {"ln1.weight", {64}},
               {"ln1.bias", {64}},
               {"attn.qkv.weight", {192, 64}},
               {"attn.qkv.bias", {192}},
               {"attn.proj.weight", {64, 64}},
               {"attn.proj.bias", {64}},
               {"ln2.weight", {64}},
               {"ln2.bias", {64}},
               {"mlp.fc.weight", {128, 64}},
               {"mlp.fc.bias", {128}},
               {"mlp.proj.weight", {64, 128}},
               {"mlp.proj.bias", {64}}})
        want.emplace_back(p + name, dims);
    }
    for (auto [name, dims] : std::vector<std::pair<std::string, std::vector<std::int64_t>>>{
             {"ln_f.weight", {64}}, {"ln_f.bias", {64}}, {"head.weight", {10, 64}}, {"head.bias", {10}}})
      want.emplace_back(name, dims);
    std::vector<std::pair<std::string, std::vector<std::int64_t>>> got;
    std::int64_t count = 0;
    for (const auto& p : g.parameters()) {
      got.emplace_back(p.name, p.torch_shape);
      count += p.value->size();
    }
    CHECK(got == want);
    // patch, cls, pos; 4 blocks of two norms, qkv, proj, fc and proj; ln_f and head.
    CHECK(count == (64 * 49 + 64) + 64 + 17 * 64 +
                       4 * (4 * 64 + (192 * 64 + 192) + (64 * 64 + 64) + (128 * 64 + 128) + (64 * 128 + 64)) +
                       2 * 64 + (10 * 64 + 10));
    CHECK(g.nodes()[g.output()].output_shape == shape{10});
  }

  TEST_CASE("the vit preset trains with AdamW by default and refuses images whose sides 7 does not divide") {
    const auto o = preset_defaults("vit");
    CHECK(o.optimizer == "adamw");
    CHECK(o.lr == 1e-3);
    CHECK(o.weight_decay == 0.05);
    CHECK(o.batch == 128);
    CHECK(preset_defaults("vit", "sgd").optimizer == "sgd");
    CHECK(preset_defaults("mlp").optimizer == "sgd");
    CHECK_THROWS_WITH(make_preset("vit", 1, preset_shape{shape{1, 30, 28}, 10}),
                      "model 'vit' takes images [C, H, W] whose sides are multiples of 7 but the data's are [1, 30, 28]");
    CHECK_THROWS_WITH(make_preset("vit", 1, preset_shape{shape{784}, 10}),
                      "model 'vit' takes images [C, H, W] whose sides are multiples of 7 but the data's are [784]");
  }
}

#include "layers/presets.hpp"
#include "layers/trainer.hpp"

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>

#include "layers/activation.hpp"
#include "layers/attention.hpp"
#include "layers/class_token.hpp"
#include "layers/embedding.hpp"
#include "layers/norm.hpp"
#include "layers/patch_embedding.hpp"
#include "layers/conv2d.hpp"
#include "layers/flatten.hpp"
#include "layers/join.hpp"
#include "layers/linear.hpp"
#include "layers/pool.hpp"

namespace nerve::layers {

namespace {

/// `blocks` pre-LayerNorm transformer blocks after node `x`, named by PyTorch's module
/// paths (`blocks.{i}.ln1, attn, add1, ln2, mlp.fc, mlp.act, mlp.proj, add2`): x + attn(ln1(x)),
/// then x + proj(GELU(fc(ln2(x)))), `heads` heads and an MLP of `mlp` features. Returns the
/// last block's output node.
template <class Scalar>
std::string add_blocks(basic_graph_builder<Scalar>& b, std::string x, std::int64_t blocks, std::int64_t width,
                       std::int64_t heads, std::int64_t mlp, bool causal) {
  for (std::int64_t i = 0; i < blocks; ++i) {
    const std::string p = "blocks." + std::to_string(i) + ".";
    b.add(p + "ln1", basic_layer_norm<Scalar>(shape{width}), {x});
    b.add(p + "attn", basic_multihead_attention<Scalar>(width, heads, causal), {p + "ln1"});
    b.add(p + "add1", basic_add<Scalar>(), {x, p + "attn"});
    b.add(p + "ln2", basic_layer_norm<Scalar>(shape{width}), {p + "add1"});
    b.add(p + "mlp.fc", basic_linear<Scalar>(width, mlp), {p + "ln2"});
    b.add(p + "mlp.act", basic_gelu<Scalar>(), {p + "mlp.fc"});
    b.add(p + "mlp.proj", basic_linear<Scalar>(mlp, width), {p + "mlp.act"});
    b.add(p + "add2", basic_add<Scalar>(), {p + "add1", p + "mlp.proj"});
    x = p + "add2";
  }
  return x;
}

}  // namespace

template <class Scalar>
basic_graph_builder<Scalar> preset_builder(std::string_view name, const preset_shape& data) {
  using lin = basic_linear<Scalar>;
  using act = basic_relu<Scalar>;
  // The MLPs flatten a sample of any shape; the head has a row per class.
  const std::int64_t in = data.input ? data.input->numel() : 784, classes = data.classes;
  if (classes < 2)
    throw std::invalid_argument("model '" + std::string(name) + "' needs 2 or more classes (got " +
                                std::to_string(classes) + ")");
  if (in < 1) throw std::invalid_argument("model '" + std::string(name) + "' needs samples of 1 or more values");
  basic_graph_builder<Scalar> b;
  if (name == "mlp") {
    b.input("input", {in});
    b.add("fc1", lin(in, 256), {"input"});
    b.add("relu1", act(), {"fc1"});
    b.add("fc2", lin(256, classes), {"relu1"});
  } else if (name == "deep-mlp") {
    b.input("input", {in});
    std::string prev = "input";
    std::int64_t width = in;
    for (int i = 1; i <= 4; ++i) {
      b.add("fc" + std::to_string(i), lin(width, 1024), {prev});
      b.add("relu" + std::to_string(i), act(), {"fc" + std::to_string(i)});
      prev = "relu" + std::to_string(i);
      width = 1024;
    }
    b.add("fc5", lin(1024, classes), {prev});
  } else if (name == "lenet") {
    // Its first linear layer's 400 inputs are what two convolutions and pools leave of 28x28.
    if (data.input && *data.input != shape{1, 28, 28})
      throw std::invalid_argument("model 'lenet' takes samples of [1, 28, 28] but the data's are " +
                                  data.input->to_string() + " (mlp, deep-mlp and resmlp take samples of any shape)");
    b.input("input", {1, 28, 28});
    b.add("conv1", basic_conv2d<Scalar>(1, 6, 5, 1, 2), {"input"});
    b.add("relu1", act(), {"conv1"});
    b.add("pool1", basic_max_pool2d<Scalar>(2), {"relu1"});
    b.add("conv2", basic_conv2d<Scalar>(6, 16, 5), {"pool1"});
    b.add("relu2", act(), {"conv2"});
    b.add("pool2", basic_max_pool2d<Scalar>(2), {"relu2"});
    b.add("flatten", basic_flatten<Scalar>(), {"pool2"});
    b.add("fc1", lin(400, 120), {"flatten"});
    b.add("relu3", act(), {"fc1"});
    b.add("fc2", lin(120, 84), {"relu3"});
    b.add("relu4", act(), {"fc2"});
    b.add("fc3", lin(84, classes), {"relu4"});
  } else if (name == "resmlp") {
    b.input("input", {in});
    b.add("fc1", lin(in, 256), {"input"});
    b.add("relu1", act(), {"fc1"});
    std::string block_in = "relu1";
    int fc = 2, r = 2;
    for (int blk = 1; blk <= 2; ++blk) {
      const std::string fa = "fc" + std::to_string(fc++), ra = "relu" + std::to_string(r++);
      const std::string fb = "fc" + std::to_string(fc++), join = "add" + std::to_string(blk);
      const std::string rb = "relu" + std::to_string(r++);
      b.add(fa, lin(256, 256), {block_in});
      b.add(ra, act(), {fa});
      b.add(fb, lin(256, 256), {ra});
      b.add(join, basic_add<Scalar>(), {fb, block_in});
      b.add(rb, act(), {join});
      block_in = rb;
    }
    b.add("fc6", lin(256, classes), {block_in});
  } else if (name == "vit") {
    // A vision transformer (Dosovitskiy et al.): 7×7 patches (16 tokens) and a class
    // token, width 64, 4 pre-LayerNorm blocks of 4-head attention and a GELU MLP ×2, the
    // class token's final LayerNorm into the head. Node names are the PyTorch module
    // paths of docs/layers.md's ViT, so its checkpoint loads there.
    constexpr std::int64_t patch = 7, width = 64, blocks = 4, heads = 4, mlp = 2 * width;
    const shape img = data.input ? *data.input : shape{1, 28, 28};
    if (img.rank() != 3 || img[1] % patch != 0 || img[2] % patch != 0)
      throw std::invalid_argument("model 'vit' takes images [C, H, W] whose sides are multiples of 7 but the data's "
                                  "are " + img.to_string());
    const std::int64_t tokens = (img[1] / patch) * (img[2] / patch) + 1;
    b.input("input", img);
    b.add("patch", basic_patch_embedding<Scalar>(patch, width, img[0]), {"input"});
    b.add("cls", basic_class_token<Scalar>(width), {"patch"});
    b.add("pos", basic_positional_embedding<Scalar>(tokens, width), {"cls"});
    const auto x = add_blocks(b, "pos", blocks, width, heads, mlp, false);
    b.add("ln_f", basic_layer_norm<Scalar>(shape{width}), {x});
    b.add("select", basic_select_token<Scalar>(0), {"ln_f"});
    b.add("head", lin(width, classes), {"select"});
  } else if (name == "gpt") {
    // A character GPT (GPT-2's layout): token and learned position embeddings, 4 causal
    // pre-LayerNorm blocks of width 128, 4 heads and a GELU MLP ×4, the final LayerNorm
    // and a head that shares the token embedding's weight. Node names are the PyTorch
    // module paths of docs/layers.md's GPT, so its checkpoint loads there.
    constexpr std::int64_t width = 128, blocks = 4, heads = 4, mlp = 4 * width;
    const std::int64_t context = data.input ? (*data.input)[0] : gpt_context;
    if (data.input && data.input->rank() != 1)
      throw std::invalid_argument("model 'gpt' takes windows of [T] token ids but the data's samples are " +
                                  data.input->to_string());
    b.input("input", {context});
    b.add("wte", basic_embedding<Scalar>(classes, width, 0.02), {"input"});
    b.add("wpe", basic_positional_embedding<Scalar>(context, width), {"wte"});
    const auto x = add_blocks(b, "wpe", blocks, width, heads, mlp, true);
    b.add("ln_f", basic_layer_norm<Scalar>(shape{width}), {x});
    b.add("head", basic_linear<Scalar>(width, classes, false), {"ln_f"});
    b.tie("head", "wte");
  } else {
    throw std::invalid_argument("unknown model '" + std::string(name) + "' (mlp, deep-mlp, lenet, resmlp, vit, gpt)");
  }
  return b;
}

template basic_graph_builder<float> preset_builder<float>(std::string_view, const preset_shape&);
template basic_graph_builder<double> preset_builder<double>(std::string_view, const preset_shape&);

bool is_preset(const basic_graph<float>& g, std::string_view name) {
  std::optional<basic_graph<float>> preset;
  try {
    if (g.inputs().size() != 1) return false;
    const preset_shape own{g.nodes()[g.inputs()[0]].output_shape, g.nodes()[g.output()].output_shape.dims().back()};
    preset.emplace(make_preset(name, 0, own));
  } catch (const std::invalid_argument&) {
    return false;
  }
  const auto& a = g.nodes();
  const auto& b = preset->nodes();
  auto params = [](const basic_node<float>& n) {
    std::int64_t count = 0;
    if (!n.is_input())
      for (const auto& p : n.layer->parameters()) count += p.value->size();
    return count;
  };
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [&](const auto& x, const auto& y) {
    return x.name == y.name && x.output_shape == y.output_shape && x.is_input() == y.is_input() && params(x) == params(y);
  });
}

// The training settings each preset reaches its accuracy target with (declared in
// layers/trainer.hpp beside the options they fill).
train_options preset_defaults(std::string_view model, std::string_view optimizer_name) {
  // Momentum 0.9 for all: plain SGD at lr 0.1 keeps mlp under the 85% target after 10
  // epochs (docs/layers.md has the measured runs).
  static constexpr std::tuple<std::string_view, std::size_t, double> presets[] = {
      {"mlp", 256, 0.1}, {"deep-mlp", 256, 0.05}, {"lenet", 64, 0.05}, {"resmlp", 128, 0.05}, {"vit", 128, 0.05},
      {"gpt", 32, 0.05}};
  for (const auto& [name, batch, lr] : presets) {
    if (name != model) continue;
    train_options o;
    o.model = std::string(model);
    o.batch = batch, o.lr = lr, o.momentum = 0.9, o.epochs = 10;
    // A transformer trains with AdamW (the starting point: lr 1e-3, weight decay 0.05).
    if (model == "vit" && optimizer_name.empty()) {
      o.optimizer = "adamw";
      o.lr = 1e-3, o.momentum = 0, o.weight_decay = 0.05;
      return o;
    }
    // The character GPT: AdamW at lr 1e-3, weight decay 0.1, 2 passes over the corpus.
    if (model == "gpt" && (optimizer_name.empty() || optimizer_name == "adamw")) {
      o.optimizer = "adamw";
      o.lr = 1e-3, o.momentum = 0, o.weight_decay = 0.1, o.beta2 = 0.99, o.epochs = 2;
      return o;
    }
    if (optimizer_name == "adam" || optimizer_name == "adamw") {
      o.optimizer = std::string(optimizer_name);
      o.lr = 1e-3, o.momentum = 0;
      if (optimizer_name == "adamw") o.weight_decay = 0.01;
    }
    return o;
  }
  throw std::invalid_argument("unknown model '" + std::string(model) + "'");
}

}  // namespace nerve::layers

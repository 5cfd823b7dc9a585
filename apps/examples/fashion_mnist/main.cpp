// Your own network, end to end: wired in C++, trained on Fashion-MNIST by nerve's one
// trainer, checked on the test set, saved with PyTorch's names.
//
//   image ─► fc1 ─► silu1 ─► fc2 ─► silu2 ─┬─► add ─► head ─► loss
//                      └────────────────────┘   (a skip connection)
//
// Every layer runs as an actor; `layers::train` brings the loader actor, the learning-rate
// schedule, evaluation after each epoch, the progress callback and `--save` — the same
// driver as nerve-train. The data directory is the first argument (default: Debian's
// dataset-fashion-mnist package).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string_view>

#include "layers/activation.hpp"
#include "layers/join.hpp"
#include "layers/linear.hpp"
#include "layers/trainer.hpp"

namespace nl = nerve::layers;

/// SiLU (swish): x·σ(x), and its derivative σ(x)·(1 + x·(1 − σ(x))).
struct silu_op {
  static constexpr std::string_view kind = "SiLU";
  template <class S> S f(S x) const { return x / (S(1) + std::exp(-x)); }
  template <class S> S df(S x) const {
    const S s = S(1) / (S(1) + std::exp(-x));
    return s * (S(1) + x * (S(1) - s));
  }
};
using silu = nl::basic_activation<float, silu_op>;

int main(int argc, char** argv) {
  const std::filesystem::path data = argc > 1 ? argv[1] : "/usr/share/datasets/fashion-mnist";
  if (!std::filesystem::exists(data)) {
    std::printf("no Fashion-MNIST in %s (apt-get install dataset-fashion-mnist)\n", data.c_str());
    return 1;
  }
  nl::graph_builder b;
  b.input("image", {784});
  b.add("fc1", nl::linear(784, 128), {"image"});
  b.add("silu1", silu(), {"fc1"});
  b.add("fc2", nl::linear(128, 128), {"silu1"});
  b.add("silu2", silu(), {"fc2"});
  b.add("add", nl::add(), {"silu2", "silu1"});
  b.add("head", nl::linear(128, 10), {"add"});
  nl::graph g = b.build(/*seed=*/1);

  nl::train_options o;
  o.model = "own-resnet";  // a name for the checkpoint's metadata
  o.data = data;
  o.epochs = 1;
  o.batch = 128;
  o.lr = 0.1;
  o.momentum = 0.9;
  o.save = "own_network.safetensors";
  auto report = nl::train(g, o, {}, [](const nl::epoch_stats& e) {
    std::printf("epoch %d: train loss %.4f, test accuracy %.2f%%, %.2f s\n", e.epoch, e.train_loss,
                100 * e.test_accuracy, e.seconds);
  });
  const double accuracy = report.epochs.back().test_accuracy;
  std::printf("%lld parameters, %lld steps, weights in %s\n", static_cast<long long>(report.parameters),
              static_cast<long long>(report.steps), o.save.c_str());
  // One epoch of this network reaches about 83%; far below means something is broken.
  return accuracy > 0.78 ? 0 : 1;
}

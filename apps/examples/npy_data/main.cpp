// Your own data, end to end: a tiny image classification problem written as NumPy .npy
// files (the files `np.save("x.npy", x)` writes), read back by the one trainer, the preset
// built for their shape, trained with random crops and flips.
//
//   bars_x.npy [N, 1, 8, 8] float32 ─┐
//   bars_y.npy [N] int64 ────────────┴─► loader ─► crop=1, flip ─► fc1 ─► relu1 ─► fc2 ─► loss
//                                        (the training batches only; the test set as it is)
//
// Each image is noise plus a shape at a random place: a horizontal bar (class 0), a
// vertical bar (class 1) or a cross of both (class 2), so a shifted or mirrored image keeps
// its class. What `nerve-train --train-data bars_train_x.npy,bars_train_y.npy --test-data
// bars_test_x.npy,bars_test_y.npy --augment crop=1,flip` does, here through the library.
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "layers/data/npy.hpp"
#include "layers/train_data.hpp"
#include "layers/trainer.hpp"

namespace nl = nerve::layers;
namespace nd = nerve::data;

/// Writes `n` images of the bars problem as `<name>_x.npy` and `<name>_y.npy`.
nd::npy_files write_bars(const std::string& name, std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> noise(0.0f, 0.4f);
  std::vector<float> x(n * 64);
  std::vector<std::int64_t> y(n);
  for (std::size_t i = 0; i < n; ++i) {
    y[i] = std::int64_t(rng() % 3);
    float* image = x.data() + i * 64;
    for (std::size_t k = 0; k < 64; ++k) image[k] = noise(rng);
    const std::size_t row = 1 + rng() % 6, col = 1 + rng() % 6;
    if (y[i] != 1)
      for (std::size_t c = 1; c < 7; ++c) image[row * 8 + c] = 1.0f;  // a horizontal bar
    if (y[i] != 0)
      for (std::size_t r = 1; r < 7; ++r) image[r * 8 + col] = 1.0f;  // a vertical bar
  }
  const std::vector<std::size_t> x_shape{n, 1, 8, 8}, y_shape{n};
  nd::npy_files files{name + "_x.npy", name + "_y.npy"};
  nd::save_npy<float>(files.inputs, x_shape, x);
  nd::save_npy<std::int64_t>(files.labels, y_shape, y);
  return files;
}

int main() {
  nl::train_options o = nl::preset_defaults("mlp");
  o.train_data = write_bars("bars_train", 600, 1);
  o.test_data = write_bars("bars_test", 150, 2);
  o.augment = nd::parse_augment("crop=1,flip");  // a bar shifted by a pixel or mirrored is still a bar
  o.epochs = 10;
  o.batch = 32;
  o.lr = 0.05;
  o.save = "bars.safetensors";

  // The files are read once; the preset takes its input ([64] from 1x8x8) and its head
  // (3 classes, the largest label + 1) from them.
  nl::load_own_data(o);
  nl::graph g = nl::make_preset_for(o);
  const auto shape = nl::own_data_shape(o);
  std::printf("%zu training samples of %s in %lld classes\n", o.train_set->size(), shape->input->to_string().c_str(),
              static_cast<long long>(shape->classes));

  auto report = nl::train(g, o, {}, [](const nl::epoch_stats& e) {
    std::printf("epoch %d: train loss %.4f, test accuracy %.2f%%\n", e.epoch, e.train_loss, 100 * e.test_accuracy);
  });
  const double accuracy = report.epochs.back().test_accuracy;
  std::printf("%lld steps, weights in %s\n", static_cast<long long>(report.steps), o.save.c_str());
  // The shapes are easy to tell apart: far below full accuracy means something is broken.
  return accuracy > 0.9 ? 0 : 1;
}

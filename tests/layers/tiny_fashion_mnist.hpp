#pragma once
// A Fashion-MNIST-shaped data directory of random samples, for tests that train
// through the trainer or the apps without the real files.
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "layers/data/idx.hpp"

namespace nerve::testing {

/// A Fashion-MNIST-shaped data directory with `train` and `test` random samples.
struct tiny_fashion_mnist {
  tiny_fashion_mnist(const tiny_fashion_mnist&) = delete;
  tiny_fashion_mnist& operator=(const tiny_fashion_mnist&) = delete;
  std::filesystem::path dir;
  tiny_fashion_mnist(std::size_t train, std::size_t test) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "nerve-trainer-XXXXXX").string();
    dir = ::mkdtemp(tmpl.data());
    std::mt19937 rng(1);
    write("train", train, rng);
    write("t10k", test, rng);
  }
  ~tiny_fashion_mnist() { std::filesystem::remove_all(dir); }
  void write(const std::string& prefix, std::size_t n, std::mt19937& rng) {
    std::vector<std::uint8_t> px(n * 28 * 28), lab(n);
    for (auto& p : px) p = static_cast<std::uint8_t>(rng() % 256);
    for (auto& l : lab) l = static_cast<std::uint8_t>(rng() % 10);
    std::vector<std::size_t> ishape{n, 28, 28}, lshape{n};
    put(prefix + "-images-idx3-ubyte", nerve::data::encode_idx<std::uint8_t>(ishape, px));
    put(prefix + "-labels-idx1-ubyte", nerve::data::encode_idx<std::uint8_t>(lshape, lab));
  }
  void put(const std::string& name, const std::vector<std::byte>& bytes) {
    std::ofstream(dir / name, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  }
};

}  // namespace nerve::testing

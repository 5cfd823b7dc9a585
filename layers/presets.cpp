#include "layers/presets.hpp"

#include "layers/activation.hpp"
#include "layers/conv2d.hpp"
#include "layers/flatten.hpp"
#include "layers/join.hpp"
#include "layers/linear.hpp"
#include "layers/pool.hpp"

namespace nerve::layers {

template <class Scalar>
basic_graph_builder<Scalar> preset_builder(std::string_view name) {
  using lin = basic_linear<Scalar>;
  using act = basic_relu<Scalar>;
  basic_graph_builder<Scalar> b;
  if (name == "mlp") {
    b.input("input", {784});
    b.add("fc1", lin(784, 256), {"input"});
    b.add("relu1", act(), {"fc1"});
    b.add("fc2", lin(256, 10), {"relu1"});
  } else if (name == "deep-mlp") {
    b.input("input", {784});
    std::string prev = "input";
    std::int64_t width = 784;
    for (int i = 1; i <= 4; ++i) {
      b.add("fc" + std::to_string(i), lin(width, 1024), {prev});
      b.add("relu" + std::to_string(i), act(), {"fc" + std::to_string(i)});
      prev = "relu" + std::to_string(i);
      width = 1024;
    }
    b.add("fc5", lin(1024, 10), {prev});
  } else if (name == "lenet") {
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
    b.add("fc3", lin(84, 10), {"relu4"});
  } else if (name == "resmlp") {
    b.input("input", {784});
    b.add("fc1", lin(784, 256), {"input"});
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
    b.add("fc6", lin(256, 10), {block_in});
  } else {
    throw std::invalid_argument("unknown model '" + std::string(name) + "' (mlp, deep-mlp, lenet, resmlp)");
  }
  return b;
}

template basic_graph_builder<float> preset_builder<float>(std::string_view);
template basic_graph_builder<double> preset_builder<double>(std::string_view);

}  // namespace nerve::layers

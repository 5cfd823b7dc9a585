#include <doctest/doctest.h>

#include <type_traits>

#include "layers/tensor.hpp"

using namespace nerve::layers;

TEST_SUITE("layers.tensor") {
  TEST_CASE("a tensor is batch first and row-major") {
    auto t = tensor::zeros(2, {3, 2, 2});
    CHECK(t.batch() == 2);
    CHECK(t.features() == 12);
    CHECK(t.full_shape() == std::vector<std::int64_t>{2, 3, 2, 2});
    CHECK(t.payload_bytes() == 24 * sizeof(float));
    t.row(1)[5] = 7.0f;
    CHECK(t.data()[12 + 5] == 7.0f);
    CHECK(t.shape_string() == "[2, 3, 2, 2]");
  }

  TEST_CASE("copies are explicit and moves leave the source empty") {
    static_assert(!std::is_copy_constructible_v<tensor>);
    static_assert(!std::is_copy_assignable_v<tensor>);
    static_assert(std::is_nothrow_move_constructible_v<tensor>);
    auto a = tensor::constant(4, {8}, 1.5f);
    const float* storage = a.data();
    tensor b = std::move(a);
    CHECK(b.data() == storage);  // moved, not copied
    CHECK(a.empty());
    tensor c = b.clone();
    CHECK(c.data() != b.data());
    CHECK(c.matrix() == b.matrix());
  }

  TEST_CASE("reshape keeps the data and rejects a different size") {
    auto t = tensor::zeros(3, {2, 4});
    t.reshape({8});
    CHECK(t.sample_shape() == shape{8});
    CHECK_THROWS_AS(t.reshape({7}), std::invalid_argument);
  }

  TEST_CASE("slice copies rows and checks bounds") {
    tensor t(4, {2});
    for (int i = 0; i < 8; ++i) t.data()[i] = float(i);
    auto s = t.slice(1, 2);
    CHECK(s.batch() == 2);
    CHECK(s.row(0)[0] == 2.0f);
    CHECK_THROWS_AS(t.slice(3, 2), std::out_of_range);
  }

  TEST_CASE("cast converts the scalar type") {
    auto t = tensor::constant(1, {3}, 0.25f);
    tensor_d d = t.cast<double>();
    CHECK(d.data()[2] == 0.25);
  }
}

// The augmentation stage: crops and flips of a known image against results worked out by
// hand, the draw as a pure function of (seed, epoch, sample), and --augment's refusals.
#include <doctest/doctest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "layers/data/augment.hpp"
#include "layers/data/batcher.hpp"
#include "layers/data/dataset.hpp"

using namespace nerve::data;

namespace {

/// The message `f()` throws as `std::invalid_argument` (empty when it throws none).
template <class F>
std::string augment_refusal(F f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return {};
}

/// A draw whose crop shifts the window by (dy, dx) against the sample, for padding `n`,
/// and whose flip bit is `flip` (the file comment of layers/data/augment.hpp, step 2 and 3).
std::uint64_t draw_for(int dy, int dx, std::size_t n, bool flip) {
  return (flip ? 1ULL << 63 : 0) | (std::uint64_t(dy + int(n)) << 32) | std::uint64_t(dx + int(n));
}

}  // namespace

TEST_SUITE("layers.data.augment") {
  // One channel, 3 rows of 4:
  //    1  2  3  4
  //    5  6  7  8
  //    9 10 11 12
  const std::vector<std::size_t> shape{1, 3, 4};
  const std::vector<float> image = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  constexpr float p = -9;  // the padding's value

  TEST_CASE("a crop of a known image equals the one worked out by hand") {
    auto x = image;
    SUBCASE("window one row up and one column right: the top row is padding, the right column too") {
      augment_sample({1, false}, draw_for(-1, 1, 1, false), shape, p, x);
      CHECK(x == std::vector<float>{p, p, p, p,  //
                                    2, 3, 4, p,  //
                                    6, 7, 8, p});
    }
    SUBCASE("window two rows down and two columns left, padding 2") {
      augment_sample({2, false}, draw_for(2, -2, 2, false), shape, p, x);
      CHECK(x == std::vector<float>{p, p, 9, 10,  //
                                    p, p, p, p,   //
                                    p, p, p, p});
    }
    SUBCASE("the centred window keeps the image") {
      augment_sample({3, false}, draw_for(0, 0, 3, false), shape, p, x);
      CHECK(x == image);
    }
  }

  TEST_CASE("a flip reverses each row, after the crop") {
    auto x = image;
    SUBCASE("flip alone") {
      augment_sample({0, true}, draw_for(0, 0, 0, true), shape, p, x);
      CHECK(x == std::vector<float>{4, 3, 2, 1, 8, 7, 6, 5, 12, 11, 10, 9});
    }
    SUBCASE("no flip when the draw's top bit is clear") {
      augment_sample({0, true}, draw_for(0, 0, 0, false), shape, p, x);
      CHECK(x == image);
    }
    SUBCASE("crop one row down and one column left, then flip") {
      augment_sample({1, true}, draw_for(1, -1, 1, true), shape, p, x);
      // The crop gives   p 5 6 7 / p 9 10 11 / p p p p; the flip reverses each row.
      CHECK(x == std::vector<float>{7, 6, 5, p, 11, 10, 9, p, p, p, p, p});
    }
    SUBCASE("every channel alike") {
      std::vector<float> two = image;
      two.insert(two.end(), image.begin(), image.end());
      augment_sample({0, true}, draw_for(0, 0, 0, true), std::vector<std::size_t>{2, 3, 4}, p, two);
      CHECK(std::vector<float>(two.begin() + 12, two.end()) == std::vector<float>{4, 3, 2, 1, 8, 7, 6, 5, 12, 11, 10, 9});
    }
  }

  TEST_CASE("the same seed, epoch and sample give the same output, in any batch") {
    const augment_options o{2, true};
    CHECK(augment_draw(7, 3, 11) == splitmix64(epoch_seed(7, 3) ^ splitmix64(~std::uint64_t{11})));
    // Sample 5 alone, and in a batch beside sample 2: the same pixels.
    const std::vector<std::uint32_t> alone{5}, pair{2, 5};
    std::vector<float> a = image, b = image;
    b.insert(b.end(), image.begin(), image.end());
    augment_batch(o, 7, 3, alone, shape, p, a);
    augment_batch(o, 7, 3, pair, shape, p, b);
    CHECK(a == std::vector<float>(b.begin() + 12, b.end()));
    // Another epoch or seed draws anew: over 32 samples some draw differs.
    int differ_epoch = 0, differ_seed = 0;
    for (std::uint64_t i = 0; i < 32; ++i) {
      differ_epoch += augment_draw(7, 3, i) != augment_draw(7, 4, i);
      differ_seed += augment_draw(7, 3, i) != augment_draw(8, 3, i);
    }
    CHECK(differ_epoch == 32);
    CHECK(differ_seed == 32);
  }

  TEST_CASE("padding holds the value a zero input becomes") {
    dataset d;
    d.sample_shape = {1, 1, 1};
    d.pixels = {0};
    d.labels = {0};
    d.set_normalization(normalization{0.5f, 0.25f});
    CHECK(d.zero_value() == -2.0f);
  }

  TEST_CASE("--augment is read and refused naming the option") {
    CHECK(parse_augment("crop=4,flip") == augment_options{4, true});
    CHECK(parse_augment("flip") == augment_options{0, true});
    CHECK(parse_augment("crop=64") == augment_options{64, false});
    CHECK(augment_text({4, true}) == "crop=4,flip");
    CHECK(augment_refusal([] { parse_augment("crop=4,mirror"); }) ==
          "--augment 'crop=4,mirror': unknown 'mirror' (crop=N: a random crop after zero padding by N; flip: a random "
          "horizontal flip)");
    CHECK(augment_refusal([] { parse_augment("crop=0"); }) ==
          "--augment 'crop=0': crop=0: the padding must be a whole number from 1 to 64");
    CHECK(augment_refusal([] { parse_augment("crop=65"); }) ==
          "--augment 'crop=65': crop=65: the padding must be a whole number from 1 to 64");
    CHECK(augment_refusal([] { parse_augment("crop=x"); }) ==
          "--augment 'crop=x': crop=x: the padding must be a whole number from 1 to 64");
    CHECK(augment_refusal([] { parse_augment("flip,flip"); }) == "--augment 'flip,flip': flip is given twice");
    CHECK(augment_refusal([] { parse_augment(""); }) ==
          "--augment '': unknown '' (crop=N: a random crop after zero padding by N; flip: a random horizontal flip)");
    CHECK(augment_refusal([] { check_augment({4, true}, std::vector<std::size_t>{16}); }) ==
          "--augment crop=4,flip crops and flips images, samples of C×H×W; the data's are [16]");
    CHECK(augment_refusal([] { check_augment({8, false}, std::vector<std::size_t>{1, 28, 6}); }) ==
          "--augment crop=8: the padding must be at most 6, the smaller side of the data's samples of [1, 28, 6]");
    CHECK(augment_refusal([] { check_augment({}, std::vector<std::size_t>{16}); }).empty());
  }
}

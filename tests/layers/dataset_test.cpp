// Tests for the dataset loader and the batcher: loading, scaling, count checks,
// the documented shuffle (golden values from tests/layers/fixtures/shuffle_reference.py),
// batching and micro-batch splitting.

#include "layers/data/batcher.hpp"
#include "layers/data/dataset.hpp"
#include "layers/data/format_error.hpp"
#include "layers/data/idx.hpp"
#include "layers/plan.hpp"
#include "tests/layers/common.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

using namespace nerve::data;

namespace {

using nerve::layers::testing::contains;

struct temp_data_dir {
  std::filesystem::path path;
  temp_data_dir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "nerve-ds-XXXXXX").string();
    path = ::mkdtemp(tmpl.data());
  }
  ~temp_data_dir() { std::filesystem::remove_all(path); }
  std::filesystem::path write(const std::string& name, std::span<const std::byte> bytes) const {
    auto p = path / name;
    std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    return p;
  }
};

// n images of 2x2 whose pixels are the sample index (times 10) plus the pixel index.
struct tiny_pair {
  temp_data_dir dir;
  std::filesystem::path images, labels;
  explicit tiny_pair(std::size_t n, std::size_t label_count = 0, int bad_label = -1) {
    if (label_count == 0) label_count = n;
    std::vector<std::size_t> ishape{n, 2, 2}, lshape{label_count};
    std::vector<std::uint8_t> px(n * 4), lab(label_count);
    for (std::size_t i = 0; i < px.size(); ++i) px[i] = static_cast<std::uint8_t>((i / 4) * 10 + i % 4);
    for (std::size_t i = 0; i < lab.size(); ++i) lab[i] = static_cast<std::uint8_t>(i % 3);
    if (bad_label >= 0) lab[1] = static_cast<std::uint8_t>(bad_label);
    images = dir.write("img.idx", encode_idx<std::uint8_t>(ishape, px));
    labels = dir.write("lab.idx.gz", gzip_compress(encode_idx<std::uint8_t>(lshape, lab)));
  }
};

std::vector<std::uint32_t> vec(std::span<const std::uint32_t> s) { return {s.begin(), s.end()}; }

const std::filesystem::path fashion_mnist_dir{std::string(fashion_mnist_default_dir)};

}  // namespace

TEST_SUITE("layers.dataset") {
  TEST_CASE("an IDX pair loads as rows of pixels scaled to [0, 1]") {
    tiny_pair files(5);
    auto ds = load_idx_pair(files.images, files.labels);
    CHECK(ds.size() == 5);
    CHECK(ds.sample_shape == std::vector<std::size_t>{1, 2, 2});
    CHECK(ds.features() == 4);
    CHECK(ds.classes == 3);
    CHECK(ds.labels == std::vector<std::int32_t>{0, 1, 2, 0, 1});
    CHECK(ds.rows(2, 1)[1] == 21.0f / 255.0f);
    CHECK(ds.rows(0, 1)[0] == 0.0f);
    CHECK(ds.rows(0, 5).size() == 20);
    CHECK_THROWS_AS(ds.rows(4, 2), std::out_of_range);
  }

  TEST_CASE("an IDX pair of any shape: f32 samples as they are, i32 labels, a rank of 5") {
    temp_data_dir dir;
    const std::vector<std::size_t> flat{3, 2}, deep{1, 2, 1, 1, 2}, lshape3{3}, lshape1{1};
    const std::vector<float> f = {0.5f, -1.0f, 2.0f, 3.0f, 1e6f, -0.0f};
    const std::vector<std::int32_t> l3 = {2, 0, 1}, l1 = {4};
    const auto x = dir.write("x.idx", encode_idx<float>(flat, f));
    const auto y = dir.write("y.idx", encode_idx<std::int32_t>(lshape3, l3));
    const auto ds = load_idx_pair(x, y);
    CHECK(ds.sample_shape == std::vector<std::size_t>{2});
    CHECK(ds.classes == 3);
    CHECK(ds.labels == l3);
    CHECK(ds.rows(0, 3) == f);
    const auto x5 = dir.write("x5.idx", encode_idx<float>(deep, std::vector<float>{1, 2, 3, 4}));
    const auto y1 = dir.write("y1.idx", encode_idx<std::int32_t>(lshape1, l1));
    const auto ds5 = load_idx_pair(x5, y1);
    CHECK(ds5.sample_shape == std::vector<std::size_t>{2, 1, 1, 2});
    CHECK(ds5.classes == 5);
    const std::vector<std::int32_t> negative = {0, -3, 1};
    const auto yn = dir.write("yn.idx", encode_idx<std::int32_t>(lshape3, negative));
    CHECK_THROWS_WITH_AS(load_idx_pair(x, yn), (yn.string() + ": at byte 12: label -3 of sample 1 is negative").c_str(),
                         format_error);
  }

  TEST_CASE("normalisation is (x - mean) / std and off unless asked") {
    tiny_pair files(2);
    load_options opt;
    opt.normalize = normalization{0.5f, 0.25f};
    auto ds = load_idx_pair(files.images, files.labels, opt);
    CHECK(ds.rows(1, 1)[3] == (13.0f / 255.0f - 0.5f) / 0.25f);
  }

  TEST_CASE("image and label counts must match, naming both files") {
    tiny_pair files(4, 3);
    try {
      load_idx_pair(files.images, files.labels);
      FAIL("no error");
    } catch (const format_error& e) {
      CHECK(contains(e.what(), "4 images but"));
      CHECK(contains(e.what(), files.labels.string()));
      CHECK(contains(e.what(), "holds 3 labels"));
    }
  }

  TEST_CASE("a label out of range for the classes is an error at its byte") {
    tiny_pair files(4, 0, 12);
    try {
      load_idx_pair(files.images, files.labels, {}, 10);
      FAIL("no error");
    } catch (const format_error& e) {
      CHECK(e.offset() == 9);
      CHECK(contains(e.what(), "label 12 of sample 1 is out of range for 10 classes"));
    }
  }

  TEST_CASE("Fashion-MNIST loads both splits in well under a second each") {
    if (!std::filesystem::exists(fashion_mnist_dir / "train-images-idx3-ubyte.gz")) {
      MESSAGE("dataset-fashion-mnist is not installed; skipping");
      return;
    }
    auto t0 = std::chrono::steady_clock::now();
    auto train = load_fashion_mnist(fashion_mnist_dir, split::train);
    auto t1 = std::chrono::steady_clock::now();
    double seconds = std::chrono::duration<double>(t1 - t0).count();
    auto test = load_fashion_mnist(fashion_mnist_dir, split::test);
    MESSAGE("Fashion-MNIST train split loaded in " << seconds << " s");
    CHECK(train.size() == 60000);
    CHECK(test.size() == 10000);
    CHECK(train.features() == 784);
    CHECK(train.classes == 10);
    CHECK(std::vector<std::int32_t>(train.labels.begin(), train.labels.begin() + 10) ==
          std::vector<std::int32_t>{9, 0, 0, 3, 0, 2, 7, 2, 5, 5});
    auto all = train.rows(0, train.size());
    auto [lo, hi] = std::minmax_element(all.begin(), all.end());
    CHECK(*lo == 0.0f);
    CHECK(*hi == 1.0f);
    // The mean pixel of the training set is 0.2860 (the figure torchvision users normalise with).
    double sum = std::accumulate(all.begin(), all.end(), 0.0);
    CHECK(sum / all.size() == doctest::Approx(0.2860).epsilon(1e-3));
    CHECK(fashion_mnist_class_name(9) == "Ankle boot");
    // Generous for sanitizer and debug builds; the release figure is reported above.
    CHECK(seconds < 5.0);
  }

  TEST_CASE("the shuffle is the documented algorithm, pinned by an independent implementation") {
    std::vector<std::uint32_t> v(10);
    std::iota(v.begin(), v.end(), 0u);
    shuffle(v, epoch_seed(42, 0));
    CHECK(v == std::vector<std::uint32_t>{9, 6, 2, 0, 1, 4, 3, 8, 5, 7});

    batcher b(10, {.batch_size = 4, .shuffle = true, .seed = 42});
    CHECK(vec(b.order()) == std::vector<std::uint32_t>{9, 6, 2, 0, 1, 4, 3, 8, 5, 7});
    b.set_epoch(1);
    CHECK(vec(b.order()) == std::vector<std::uint32_t>{5, 4, 1, 3, 0, 2, 7, 8, 6, 9});
    batcher c(10, {.batch_size = 4, .shuffle = true, .seed = 7});
    CHECK(vec(c.order()) == std::vector<std::uint32_t>{7, 8, 0, 4, 1, 6, 9, 5, 2, 3});
    batcher big(60000, {.batch_size = 256, .shuffle = true, .seed = 0});
    big.set_epoch(3);
    CHECK(vec(big.indices(0).first(8)) ==
          std::vector<std::uint32_t>{10722, 49932, 49756, 43893, 46720, 52357, 36942, 46804});
  }

  TEST_CASE("every epoch is a permutation, replayable in any order") {
    batcher b(1000, {.batch_size = 64, .seed = 5});
    b.set_epoch(7);
    auto seven = vec(b.order());
    auto sorted = seven;
    std::sort(sorted.begin(), sorted.end());
    std::vector<std::uint32_t> identity(1000);
    std::iota(identity.begin(), identity.end(), 0u);
    CHECK(sorted == identity);
    CHECK(seven != identity);
    b.set_epoch(2);
    CHECK(vec(b.order()) != seven);
    b.set_epoch(7);
    CHECK(vec(b.order()) == seven);
  }

  TEST_CASE("batches cover the epoch in order; the last partial batch is kept or dropped") {
    SUBCASE("kept") {
      batcher b(10, {.batch_size = 4, .shuffle = false});
      CHECK(b.batches_per_epoch() == 3);
      CHECK(vec(b.indices(0)) == std::vector<std::uint32_t>{0, 1, 2, 3});
      CHECK(vec(b.indices(2)) == std::vector<std::uint32_t>{8, 9});
      CHECK_THROWS_AS(b.indices(3), std::out_of_range);
    }
    SUBCASE("dropped") {
      batcher b(10, {.batch_size = 4, .shuffle = false, .drop_last = true});
      CHECK(b.batches_per_epoch() == 2);
      CHECK_THROWS_AS(b.indices(2), std::out_of_range);
    }
    SUBCASE("shuffled batches partition the samples") {
      batcher b(10, {.batch_size = 3, .seed = 1});
      std::multiset<std::uint32_t> seen;
      for (std::size_t i = 0; i < b.batches_per_epoch(); ++i)
        for (auto x : b.indices(i)) seen.insert(x);
      CHECK(seen.size() == 10);
      CHECK(std::set<std::uint32_t>(seen.begin(), seen.end()).size() == 10);
    }
    CHECK_THROWS_AS(batcher(10, {.batch_size = 0}), std::invalid_argument);
  }

  TEST_CASE("gather copies the rows and labels of a batch") {
    tiny_pair files(5);
    auto ds = load_idx_pair(files.images, files.labels);
    batcher b(ds.size(), {.batch_size = 2, .seed = 3});
    b.set_epoch(1);
    auto idx = b.indices(1);
    CHECK(idx.size() == 2);
    std::vector<float> images(2 * 4);
    std::vector<std::int32_t> labels(2);
    b.gather(ds, 1, images, labels);
    for (std::size_t r = 0; r < 2; ++r) {
      CHECK(labels[r] == ds.labels[idx[r]]);
      auto row = ds.rows(idx[r], 1);
      CHECK(std::equal(images.begin() + r * 4, images.begin() + r * 4 + 4, row.begin()));
    }
    CHECK(b.indices(2).size() == 1);
    std::vector<float> wrong(3);
    CHECK_THROWS_AS(b.gather(ds, 0, wrong, labels), std::invalid_argument);
  }

  TEST_CASE("micro-batches split a batch into near-equal contiguous parts") {
    using nerve::layers::split_micro_batches;
    using rows_list = std::vector<nerve::layers::micro_batch_rows>;
    CHECK(split_micro_batches(10, 3) == rows_list{{0, 4}, {4, 3}, {7, 3}});
    CHECK(split_micro_batches(8, 4) == rows_list{{0, 2}, {2, 2}, {4, 2}, {6, 2}});
    CHECK(split_micro_batches(5, 1) == rows_list{{0, 5}});
    CHECK(split_micro_batches(3, 3) == rows_list{{0, 1}, {1, 1}, {2, 1}});
    CHECK_THROWS_AS(split_micro_batches(3, 4), std::invalid_argument);
    CHECK_THROWS_AS(split_micro_batches(3, 0), std::invalid_argument);
    for (std::int64_t rows = 1; rows < 40; ++rows)
      for (std::size_t m = 1; m <= std::size_t(rows); ++m) {
        auto parts = split_micro_batches(rows, m);
        std::int64_t total = 0, lo = rows, hi = 0;
        for (auto& p : parts) {
          CHECK(p.first == total);
          total += p.count;
          lo = std::min(lo, p.count);
          hi = std::max(hi, p.count);
        }
        CHECK(total == rows);
        CHECK(hi - lo <= 1);
      }
  }
}

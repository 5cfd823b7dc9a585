// The GEMM wrapper: every transpose combination, accumulation, both engines, one and two threads.
#include <doctest/doctest.h>

#include <random>

#include "layers/gemm.hpp"
#include "layers/tensor.hpp"

using namespace nerve::layers;

namespace {

using matrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Restores the process-wide settings whatever the test does.
struct engine_guard {
  gemm_engine engine = current_gemm_engine();
  int threads = gemm_threads();
  ~engine_guard() {
    set_gemm_engine(engine);
    set_gemm_threads(threads);
  }
};

}  // namespace

TEST_SUITE("layers.gemm") {
  TEST_CASE("products match a reference for every transpose, engine and thread count") {
    engine_guard guard;
    std::mt19937_64 rng(5);
    auto random = [&](std::int64_t r, std::int64_t c) {
      basic_tensor<float>::matrix_type m(r, c);
      for (std::int64_t i = 0; i < m.size(); ++i) m.data()[i] = float(double(rng() >> 11) * 0x1.0p-53 - 0.5);
      return m;
    };
    std::vector<gemm_engine> engines{gemm_engine::eigen};
    if (has_openblas()) engines.push_back(gemm_engine::openblas);
    // Big enough that two threads really split (by rows, and by columns when n > m).
    for (auto [m, n, k] : {std::array<std::int64_t, 3>{200, 72, 300}, {40, 260, 330}, {3, 5, 7}})
      for (auto engine : engines)
        for (int threads : {1, 2})
          for (bool ta : {false, true})
            for (bool tb : {false, true}) {
              CAPTURE(m); CAPTURE(n); CAPTURE(k); CAPTURE(to_string(engine)); CAPTURE(threads); CAPTURE(ta); CAPTURE(tb);
              set_gemm_engine(engine);
              set_gemm_threads(threads);
              auto a = ta ? random(k, m) : random(m, k);
              auto b = tb ? random(n, k) : random(k, n);
              auto c = random(m, n);
              matrix ad = a.cast<double>(), bd = b.cast<double>();
              matrix opa = ta ? matrix(ad.transpose()) : ad, opb = tb ? matrix(bd.transpose()) : bd;
              const matrix want = 0.5 * opa * opb + 2.0 * c.cast<double>();
              gemm<float>(ta ? trans::yes : trans::no, tb ? trans::yes : trans::no, m, n, k, 0.5f, a.data(), a.cols(),
                          b.data(), b.cols(), 2.0f, c.data(), n);
              CHECK((c.cast<double>() - want).cwiseAbs().maxCoeff() < 1e-4);
            }
  }
  TEST_CASE("threads and engine can be read back") {
    engine_guard guard;
    set_gemm_threads(2);
    CHECK(gemm_threads() == 2);
    set_gemm_threads(0);
    CHECK(gemm_threads() == 1);
    if (!has_openblas()) CHECK_THROWS_AS(set_gemm_engine(gemm_engine::openblas), std::invalid_argument);
  }
}

#include "layers/gemm.hpp"

#include <Eigen/Core>

#include <algorithm>
#include <atomic>
#include <stdexcept>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#if NERVE_HAS_OPENBLAS
#include <cblas.h>
extern "C" void openblas_set_num_threads(int);
#endif

namespace nerve::layers {
namespace {

// The faster one on the build machines (gemm.hpp; docs/layers.md has the figures).
constexpr gemm_engine default_engine() {
#if defined(__AVX512F__) || !NERVE_HAS_OPENBLAS
  return gemm_engine::eigen;
#else
  return gemm_engine::openblas;
#endif
}

std::atomic<gemm_engine> engine_{default_engine()};
std::atomic<int> threads_{0};

int init_threads() {
  // First use: pin both engines to one thread so no pool competes with the
  // event loops until someone asks for more.
  int expected = 0;
  if (threads_.compare_exchange_strong(expected, 1)) {
    Eigen::setNbThreads(1);  // always: see eigen_gemm for how products use several threads
#if NERVE_HAS_OPENBLAS
    openblas_set_num_threads(1);
#endif
  }
  return threads_.load();
}

template <class Scalar>
using row_major = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class Scalar>
using const_map = Eigen::Map<const row_major<Scalar>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <class Scalar>
using map = Eigen::Map<row_major<Scalar>, Eigen::Unaligned, Eigen::OuterStride<>>;

template <class Scalar, class A, class B>
void eigen_product(Scalar alpha, const A& a, const B& b, Scalar beta, map<Scalar>& c) {
  if (beta == Scalar(0)) {
    if (alpha == Scalar(1))
      c.noalias() = a * b;
    else
      c.noalias() = alpha * (a * b);
  } else {
    if (beta != Scalar(1)) c *= beta;
    if (alpha == Scalar(1))
      c.noalias() += a * b;
    else
      c.noalias() += alpha * (a * b);
  }
}

// Helpers for multi-threaded products. They spin (yielding) for a while after
// each product and then sleep, so back-to-back products of a training step find
// them awake, as OpenBLAS's own pool does; OpenMP's workers went to sleep
// between products and each wake-up on a loaded machine waited a time slice
// (docs/performance.md). One caller at a time: a product that
// finds the pool busy (another loop's actor) runs on its own thread.
class block_pool {
 public:
  static block_pool& instance() {
    static block_pool* pool = new block_pool();  // never destroyed: helpers may be asleep at exit
    return *pool;
  }

  /// Runs job(0) … job(parts − 1), part 0 on the caller; false if the pool is busy.
  bool run(int parts, const std::function<void(int)>& job) {
    std::unique_lock busy(caller_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    while (static_cast<int>(helpers_.size()) < parts - 1) {
      const int id = static_cast<int>(helpers_.size()) + 1;
      helpers_.emplace_back([this, id] { serve(id); });
    }
    {
      std::lock_guard lock(mutex_);
      job_ = &job;
      parts_ = parts;
      remaining_.store(parts - 1, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    job(0);
    while (remaining_.load(std::memory_order_acquire) > 0) std::this_thread::yield();
    return true;
  }

 private:
  block_pool() = default;

  void serve(int id) {
    std::uint64_t seen = 0;
    for (;;) {
      const auto spin_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(2);
      while (generation_.load(std::memory_order_acquire) == seen && std::chrono::steady_clock::now() < spin_until)
        std::this_thread::yield();
      if (generation_.load(std::memory_order_acquire) == seen) {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      }
      seen = generation_.load(std::memory_order_acquire);
      const std::function<void(int)>* job;
      int parts;
      {
        std::lock_guard lock(mutex_);
        job = job_;
        parts = parts_;
      }
      if (id < parts) (*job)(id);
      remaining_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }

  std::mutex caller_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<std::thread> helpers_;
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<int> remaining_{0};
  const std::function<void(int)>* job_ = nullptr;
  int parts_ = 0;
};

template <class Scalar>
void eigen_gemm_serial(trans ta, trans tb, std::int64_t m, std::int64_t n, std::int64_t k, Scalar alpha,
                       const Scalar* a, std::int64_t lda, const Scalar* b, std::int64_t ldb, Scalar beta, Scalar* c,
                       std::int64_t ldc) {
  // Stored shapes: A is (ta ? k×m : m×k), B is (tb ? n×k : k×n).
  const_map<Scalar> A(a, ta == trans::yes ? k : m, ta == trans::yes ? m : k, Eigen::OuterStride<>(lda));
  const_map<Scalar> B(b, tb == trans::yes ? n : k, tb == trans::yes ? k : n, Eigen::OuterStride<>(ldb));
  map<Scalar> C(c, m, n, Eigen::OuterStride<>(ldc));
  if (ta == trans::no && tb == trans::no) eigen_product(alpha, A, B, beta, C);
  else if (ta == trans::no) eigen_product(alpha, A, B.transpose(), beta, C);
  else if (tb == trans::no) eigen_product(alpha, A.transpose(), B, beta, C);
  else eigen_product(alpha, A.transpose(), B.transpose(), beta, C);
}

// Several threads: the output is cut into one block of rows (or columns) per
// thread and each block is an independent single-threaded Eigen product. Eigen's
// own parallel GEMM shares packed panels between threads and busy-waits for its
// partners (GeneralMatrixMatrix.h: `while(info[i].sync!=k) {}`); on a machine
// with more runnable threads than cores a descheduled partner stalls it for a
// whole time slice (docs/performance.md). Independent blocks
// only meet at the end (see block_pool); on a quiet machine they cost only the
// duplicated packing of the shared operand.
template <class Scalar>
void eigen_gemm(trans ta, trans tb, std::int64_t m, std::int64_t n, std::int64_t k, Scalar alpha, const Scalar* a,
                std::int64_t lda, const Scalar* b, std::int64_t ldb, Scalar beta, Scalar* c, std::int64_t ldc,
                int threads) {
  constexpr std::int64_t min_flops_per_thread = std::int64_t{1} << 20;
  const std::int64_t split_dim = std::max(m, n);
  int parts = static_cast<int>(std::min<std::int64_t>(threads, split_dim / 16));
  parts = static_cast<int>(std::min<std::int64_t>(parts, (m * n * k) / min_flops_per_thread));
  if (parts > 1) {
    const bool by_rows = m >= n;
    // Blocks of a multiple of 16 rows/columns so every block keeps full vector width.
    const std::int64_t block = ((split_dim + parts - 1) / parts + 15) / 16 * 16;
    const std::function<void(int)> job = [&](int p) {
      const std::int64_t first = p * block, count = std::min(block, split_dim - first);
      if (count <= 0) return;
      if (by_rows) {
        const Scalar* ap = ta == trans::yes ? a + first : a + first * lda;
        eigen_gemm_serial(ta, tb, count, n, k, alpha, ap, lda, b, ldb, beta, c + first * ldc, ldc);
      } else {
        const Scalar* bp = tb == trans::yes ? b + first * ldb : b + first;
        eigen_gemm_serial(ta, tb, m, count, k, alpha, a, lda, bp, ldb, beta, c + first, ldc);
      }
    };
    if (block_pool::instance().run(parts, job)) return;
  }
  eigen_gemm_serial(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace

void set_gemm_engine(gemm_engine engine) {
#if !NERVE_HAS_OPENBLAS
  if (engine == gemm_engine::openblas) throw std::invalid_argument("gemm: this build has no OpenBLAS");
#endif
  engine_.store(engine);
}
gemm_engine current_gemm_engine() noexcept { return engine_.load(); }
bool has_openblas() noexcept { return NERVE_HAS_OPENBLAS != 0; }
std::string_view to_string(gemm_engine engine) noexcept { return engine == gemm_engine::eigen ? "eigen" : "openblas"; }

void set_gemm_threads(int threads) {
  threads = std::max(1, threads);
  threads_.store(threads);
  Eigen::setNbThreads(1);
#if NERVE_HAS_OPENBLAS
  openblas_set_num_threads(threads);
#endif
}
int gemm_threads() noexcept { return init_threads(); }

template <class Scalar>
void gemm(trans ta, trans tb, std::int64_t m, std::int64_t n, std::int64_t k, Scalar alpha, const Scalar* a,
          std::int64_t lda, const Scalar* b, std::int64_t ldb, Scalar beta, Scalar* c, std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  init_threads();
  if (k == 0) {
    map<Scalar> C(c, m, n, Eigen::OuterStride<>(ldc));
    if (beta == Scalar(0)) C.setZero(); else C *= beta;
    return;
  }
#if NERVE_HAS_OPENBLAS
  if (engine_.load(std::memory_order_relaxed) == gemm_engine::openblas) {
    const auto TA = ta == trans::yes ? CblasTrans : CblasNoTrans;
    const auto TB = tb == trans::yes ? CblasTrans : CblasNoTrans;
    if constexpr (std::is_same_v<Scalar, float>)
      cblas_sgemm(CblasRowMajor, TA, TB, int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
    else
      cblas_dgemm(CblasRowMajor, TA, TB, int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
    return;
  }
#endif
  eigen_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, threads_.load(std::memory_order_relaxed));
}

template void gemm<float>(trans, trans, std::int64_t, std::int64_t, std::int64_t, float, const float*, std::int64_t,
                          const float*, std::int64_t, float, float*, std::int64_t);
template void gemm<double>(trans, trans, std::int64_t, std::int64_t, std::int64_t, double, const double*,
                           std::int64_t, const double*, std::int64_t, double, double*, std::int64_t);

}  // namespace nerve::layers

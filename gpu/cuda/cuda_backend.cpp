// The CUDA backend, built into the module libnerve_gpu_cuda.so (gpu/detail/cuda_module.hpp).
#include "gpu/cuda/check.hpp"
#include "gpu/device.hpp"
#include "gpu/kernels/launch.hpp"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <string>

namespace nerve::gpu::detail::cuda {
namespace {

/// A non-blocking CUDA stream with its own cuBLAS handle and workspace.
class cuda_stream final : public stream_impl {
 public:
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  void* workspace = nullptr;
  int device = 0;
  void* native_handle() const noexcept override { return stream; }

  ~cuda_stream() override {
    // Never blocks: the workspace is freed in stream order, and a destroyed
    // stream releases its resources once its work is done. Errors (a dead
    // context) are ignored: a destructor has no one to tell.
    int prev = -1;
    (void)cudaGetDevice(&prev);
    if (prev != device) (void)cudaSetDevice(device);
    if (blas) (void)cublasDestroy(blas);
    if (workspace) (void)cudaFreeAsync(workspace, stream);
    if (stream) (void)cudaStreamDestroy(stream);
    if (prev != device && prev >= 0) (void)cudaSetDevice(prev);
  }
};

class cuda_event final : public event_impl {
 public:
  cudaEvent_t event = nullptr;
};

/// Every kernel of ours loaded now, not at its first launch (launch.hpp says why).
cudaError_t preload_kernels() {
  for (cudaError_t (*part)() : {cuda_kernels::preload_elementwise, cuda_kernels::preload_loss,
                                cuda_kernels::preload_window, cuda_kernels::preload_testing})
    if (const cudaError_t e = part(); e != cudaSuccess) return e;
  return cudaSuccess;
}

cudaStream_t native(stream_impl& s) { return static_cast<cuda_stream&>(s).stream; }
cudaEvent_t native(event_impl& e) { return static_cast<cuda_event&>(e).event; }

class cuda_backend final : public backend {
 public:
  explicit cuda_backend(int ordinal) : ordinal_(ordinal) {
    NERVE_CUDA_CHECK(cudaSetDevice(ordinal));
    cudaDeviceProp prop{};
    NERVE_CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal));
    name_ = prop.name;
    NERVE_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool_, ordinal));
    // The stream-ordered pool keeps every freed block cached for reuse after a synchronize.
    std::uint64_t keep = ~std::uint64_t{0};
    NERVE_CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep));
    NERVE_CUDA_CHECK(preload_kernels());  // no lazy load behind a spinning gate (launch.hpp)
  }

  backend_kind kind() const noexcept override { return backend_kind::cuda; }
  std::string name() const override { return name_; }
  int ordinal() const noexcept override { return ordinal_; }

  std::shared_ptr<stream_impl> create_stream(const stream_options& o) override {
    use_device();
    auto s = std::make_shared<cuda_stream>();
    s->device = ordinal_;
    NERVE_CUDA_CHECK(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
    NERVE_CUDA_CHECK(cublasCreate(&s->blas));
    // cublasSetStream resets the workspace: stream first, then our workspace.
    NERVE_CUDA_CHECK(cublasSetStream(s->blas, s->stream));
    if (o.blas_workspace_bytes) {
      NERVE_CUDA_CHECK(cudaMallocAsync(&s->workspace, o.blas_workspace_bytes, s->stream));
      NERVE_CUDA_CHECK(cublasSetWorkspace(s->blas, s->workspace, o.blas_workspace_bytes));
    }
    NERVE_CUDA_CHECK(cublasSetMathMode(s->blas, o.tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    return s;
  }

  void synchronize(stream_impl& s) override { NERVE_CUDA_CHECK(cudaStreamSynchronize(native(s))); }

  void enqueue_host(stream_impl& s, unique_function<void()> fn) override {
    use_device();
    auto* heap = new unique_function<void()>(std::move(fn));
    const cudaError_t e = cudaLaunchHostFunc(
        native(s),
        [](void* p) {
          std::unique_ptr<unique_function<void()>> f(static_cast<unique_function<void()>*>(p));
          try {
            (*f)();
          } catch (...) {
            // A host function has no one to tell; it must not throw into the driver.
          }
        },
        heap);
    if (e != cudaSuccess) delete heap;
    NERVE_CUDA_CHECK(e);
  }

  event_impl* create_event() override {
    use_device();
    auto* e = new cuda_event;
    const cudaError_t r = cudaEventCreateWithFlags(&e->event, cudaEventDisableTiming);
    if (r != cudaSuccess) delete e;
    NERVE_CUDA_CHECK(r);
    return e;
  }

  void destroy_event(event_impl* e) noexcept override {
    (void)cudaEventDestroy(native(*e));
    delete static_cast<cuda_event*>(e);
  }

  void record(event_impl& e, stream_impl& s) override { NERVE_CUDA_CHECK(cudaEventRecord(native(e), native(s))); }

  event_state query(event_impl& e) noexcept override {
    const cudaError_t r = cudaEventQuery(native(e));
    if (r == cudaSuccess) return {true, {}};
    if (r == cudaErrorNotReady) return {false, {}};
    return {true, to_error_code(r)};
  }

  std::error_code wait(event_impl& e) noexcept override {
    const cudaError_t r = cudaEventSynchronize(native(e));
    return r == cudaSuccess ? std::error_code{} : to_error_code(r);
  }

  void stream_wait(stream_impl& s, event_impl& e) override {
    NERVE_CUDA_CHECK(cudaStreamWaitEvent(native(s), native(e), 0));
  }

  void* allocate(std::size_t bytes, stream_impl& s) override {
    use_device();
    void* p = nullptr;
    NERVE_CUDA_CHECK(cudaMallocFromPoolAsync(&p, bytes, pool_, native(s)));
    return p;
  }
  void deallocate(void* p, stream_impl& s) noexcept override { (void)cudaFreeAsync(p, native(s)); }
  void* allocate_pinned(std::size_t bytes) override {
    use_device();
    void* p = nullptr;
    NERVE_CUDA_CHECK(cudaMallocHost(&p, bytes));
    return p;
  }
  void deallocate_pinned(void* p) noexcept override { (void)cudaFreeHost(p); }
  void copy(void* dst, const void* src, std::size_t bytes, stream_impl& s) override {
    NERVE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, native(s)));
  }
  void fill_zero(void* dst, std::size_t bytes, stream_impl& s) override {
    NERVE_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, native(s)));
  }

  void gemm_strided_batched(stream_impl& s, transpose ta, transpose tb, int m, int n, int k, float alpha,
                            const float* a, int lda, std::int64_t sa, const float* b, int ldb, std::int64_t sb,
                            float beta, float* c, int ldc, std::int64_t sc, int batch) override {
    use_device();
    auto h = static_cast<cuda_stream&>(s).blas;
    const cublasOperation_t op_a = ta == transpose::yes ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = tb == transpose::yes ? CUBLAS_OP_T : CUBLAS_OP_N;
    // Row-major C = op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: swap the operands.
    if (batch == 1)
      NERVE_CUDA_CHECK(cublasSgemm(h, op_b, op_a, n, m, k, &alpha, b, ldb, a, lda, &beta, c, ldc));
    else
      NERVE_CUDA_CHECK(cublasSgemmStridedBatched(h, op_b, op_a, n, m, k, &alpha, b, ldb, sb, a, lda, sa, &beta, c,
                                                 ldc, sc, batch));
  }

#define NERVE_LAUNCH(call)   \
  do {                       \
    use_device();            \
    cuda_kernels::call;      \
    NERVE_CUDA_CHECK(cudaGetLastError()); \
  } while (0)

  void launch(stream_impl& s, std::size_t n, const ops::pointwise_op& op) override {
    NERVE_LAUNCH(each(native(s), n, op));
  }
  void launch(stream_impl& s, const ops::window_op& op) override { NERVE_LAUNCH(each(native(s), op)); }
  void column_sums(stream_impl& s, const float* x, std::size_t rows, std::size_t cols, float* out,
                   float beta) override {
    NERVE_LAUNCH(column_sums(native(s), x, rows, cols, out, beta));
  }
  void softmax_xent_forward(stream_impl& s, const float* logits, const std::int32_t* labels, std::size_t rows,
                            std::size_t cols, float* probs, float* loss, float* correct) override {
    NERVE_LAUNCH(softmax_xent_forward(native(s), logits, labels, rows, cols, probs, loss, correct));
  }
  void enqueue_fault(stream_impl& s, int kind) override { NERVE_LAUNCH(fault(native(s), kind)); }
  void enqueue_gate(stream_impl& s, volatile std::int32_t* flag) override {
    use_device();
    void* device_flag = nullptr;
    NERVE_CUDA_CHECK(cudaHostGetDevicePointer(&device_flag, const_cast<std::int32_t*>(flag), 0));
    NERVE_LAUNCH(gate(native(s), static_cast<volatile std::int32_t*>(device_flag)));
  }
#undef NERVE_LAUNCH

 private:
  /// The runtime's current device is per thread: set ours before work that needs it.
  void use_device() const {
    int cur = -1;
    NERVE_CUDA_CHECK(cudaGetDevice(&cur));
    if (cur != ordinal_) NERVE_CUDA_CHECK(cudaSetDevice(ordinal_));
  }

  int ordinal_;
  std::string name_;
  cudaMemPool_t pool_ = nullptr;
};

int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // "no driver"/"no device" is an answer, not a sticky state
    return 0;
  }
  return n;
}

std::unique_ptr<backend> make_backend(int ordinal) { return std::make_unique<cuda_backend>(ordinal); }

std::string error_text(int code) {
  const auto e = static_cast<cudaError_t>(code);
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

std::string cublas_text(int code) {
  const auto s = static_cast<cublasStatus_t>(code);
  return std::string(cublasGetStatusName(s)) + ": " + cublasGetStatusString(s);
}

const cuda_module_host* lent = nullptr;
const cuda_module_api api{cuda_module_abi, &device_count, &make_backend, &error_text, &cublas_text};

}  // namespace

const cuda_module_host& host() noexcept { return *lent; }

}  // namespace nerve::gpu::detail::cuda

/// The module's one exported symbol (the rest is hidden): the program calls it once,
/// from one thread, before anything else of the module.
extern "C" __attribute__((visibility("default"))) const nerve::gpu::detail::cuda_module_api* nerve_gpu_cuda_module(
    int abi, const nerve::gpu::detail::cuda_module_host* host) {
  using namespace nerve::gpu::detail;
  if (abi != cuda_module_abi || !host) return nullptr;
  cuda::lent = host;
  return &cuda::api;
}

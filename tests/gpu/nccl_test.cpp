// NCCL across devices (gpu/nccl.hpp, gpu/layers/nccl_all_reduce.hpp): built where the CUDA
// toolkit has NCCL; needs two CUDA devices and exits 77 (CTest: skipped) with fewer.
//
// Tolerance: NCCL sums in its own order (rings, trees), not member order. Each of the R − 1
// additions of an element rounds by at most u = 2⁻²⁴ of the partial sum, so any order is
// within (R − 1)·u·Σ|gᵢ| of the member-order sum (and of the exact one).
#define DOCTEST_CONFIG_IMPLEMENT
#include "gpu/device.hpp"
#include "gpu/layers/device_backend.hpp"
#include "gpu/layers/nccl_all_reduce.hpp"
#include "gpu/memory.hpp"
#include "gpu/nccl.hpp"
#include "layers/pipeline/pipeline.hpp"
#include "tests/gpu/gpu_fixture.hpp"
#include "tests/pipeline/chain.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <random>

using namespace nerve;
namespace pl = nerve::pipeline;

int main(int argc, char** argv) {
  if (gpu::device::cuda_device_count() < 2) {
    std::printf("%d CUDA device(s), NCCL across devices needs 2: skipped\n", gpu::device::cuda_device_count());
    return 77;
  }
  std::string why;
  if (!gpu::nccl_comms::available(&why)) {
    std::printf("NCCL not loadable (%s): skipped\n", why.c_str());
    return 77;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}

namespace {

gpu::device_options on(int ordinal) {
  gpu::device_options o;
  o.backend = gpu::backend_kind::cuda;
  o.ordinal = ordinal;
  return o;
}

}  // namespace

TEST_SUITE("gpu.nccl") {
  TEST_CASE("two devices sum their buffers in place within (R-1)·u·Σ|g| of the member-order sum") {
    gpu::device d0(on(0)), d1(on(1));
    gpu::nccl_comms comms({&d0, &d1});
    CHECK(comms.size() == 2);
    std::vector<gpu::stream> streams{d0.create_stream(), d1.create_stream()};
    std::mt19937_64 rng(5);
    std::normal_distribution<float> nd;
    const std::size_t n = 1000;
    std::vector<std::vector<float>> host(2, std::vector<float>(n));
    std::vector<gpu::device_tensor> bufs;
    for (int k = 0; k < 2; ++k) {
      for (auto& x : host[k]) x = nd(rng);
      bufs.emplace_back(streams[k], gpu::shape_t{n});
      gpu::copy_async(streams[k], bufs[k].data(), host[k].data(), n * sizeof(float));
      streams[k].synchronize();
    }
    comms.all_reduce_sum(streams, {{{bufs[0].data(), n}}, {{bufs[1].data(), n}}});
    for (int k = 0; k < 2; ++k) {
      std::vector<float> got(n);
      gpu::copy_async(streams[k], got.data(), bufs[k].data(), n * sizeof(float));
      streams[k].synchronize();
      std::vector<float> want(n);
      std::vector<double> tol(n);
      for (std::size_t i = 0; i < n; ++i) {
        want[i] = host[0][i] + host[1][i];
        tol[i] = gpu::test::unit_roundoff * (std::abs(double(host[0][i])) + std::abs(double(host[1][i])));
      }
      gpu::test::check_within("device " + std::to_string(k), got, want, tol);
    }
  }

  TEST_CASE("two replicas, one per device, train to the CPU replicas' weights (NCCL sums their gradients)") {
    constexpr double lr = 0.05, momentum = 0.9;
    std::vector<layers::graph> cpu, dev;
    for (int r = 0; r < 2; ++r) cpu.push_back(test::small_chain(7)), dev.push_back(test::small_chain(7));
    auto run = [&](std::vector<layers::graph>& reps, bool on_device) {
      actors::runtime rt(actors::runtime_options{.loops = 2});
      gpu::device d0(on(0)), d1(on(1));
      pl::pipeline_options o;
      if (on_device)
        for (auto* d : {&d0, &d1})  // replica r's one stage on device r (S·R factories)
          o.backends.push_back([d](layers::graph& g, const std::vector<std::size_t>& nodes) {
            gpu::device_backend_options so;
            so.make_optimizer = [=] { return layers::make_optimizer<float>("sgd", lr, momentum); };
            so.nodes = nodes;
            return std::make_shared<gpu::device_backend>(*d, g, so);
          });
      pl::pipeline p(rt, std::vector<layers::graph*>{&reps[0], &reps[1]}, pl::partition_by_parameters(reps[0], 1),
                     pl::make_schedule("1f1b", 1, 2), std::make_shared<layers::cross_entropy>(),
                     [] { return layers::make_optimizer<float>("sgd", lr, momentum); }, o);
      if (on_device)
        for (auto& a : p.reducers()) CHECK(dynamic_cast<gpu::nccl_all_reduce*>(a.get()) != nullptr);
      std::mt19937_64 rng(3);
      std::normal_distribution<float> nd;
      for (int s = 0; s < 3; ++s) {
        layers::tensor x(24, layers::shape{12});
        for (std::int64_t i = 0; i < x.size(); ++i) x.data()[i] = nd(rng);
        layers::targets t;
        for (int i = 0; i < 24; ++i) t.labels.push_back(std::int32_t(rng() % 4));
        p.train_step(std::move(x), t, std::uint64_t(s));
      }
      p.download();
    };
    run(cpu, false);
    run(dev, true);
    // The bound of tests/gpu/pipeline_test.cpp's replicas (cuBLAS against OpenBLAS, NCCL's
    // order adding (R − 1)·u): 1e-4 of each tensor's largest entry after 3 steps.
    auto a = cpu[0].parameters(), b = dev[0].parameters(), c = dev[1].parameters();
    for (std::size_t i = 0; i < a.size(); ++i) {
      CAPTURE(a[i].name);
      double largest = 0;
      for (std::int64_t k = 0; k < a[i].value->size(); ++k) largest = std::max(largest, double(std::abs(a[i].value->data()[k])));
      std::vector<float> want(a[i].value->data(), a[i].value->data() + a[i].value->size());
      for (auto* p : {&b[i], &c[i]}) {
        std::vector<float> got(p->value->data(), p->value->data() + p->value->size());
        gpu::test::check_within("weights", got, want, std::vector<double>(want.size(), 1e-4 * largest));
      }
    }
  }
}

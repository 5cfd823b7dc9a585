// NCCL across ranks (gpu/layers/nccl_all_reduce.hpp, `nccl_rank_group`): a device stage's
// replicas one per rank, each rank on its own GPU, summing with NCCL. Run under
// `mpirun -np 2`; built where CUDA, NCCL and MPI are; every rank exits 77 (CTest:
// skipped) with fewer than two CUDA devices or without a loadable NCCL, before MPI starts.
//
// Tolerance: NCCL sums in its own order (rings, trees), not member order: each of the
// R − 1 additions of an element rounds by at most u = 2⁻²⁴ of the partial sum, so the sum
// is within (R − 1)·u·Σ|gᵢ| of the member-order one (gpu/nccl.hpp). Trained weights against
// CPU replicas add the products' order (cuBLAS against OpenBLAS): the bound derived in
// tests/gpu/pipeline_test.cpp for this chain, SGD 0.05 with momentum 0.9, 3 steps, R ≤ 3:
// 1e-4 of each tensor's largest entry.
#define DOCTEST_CONFIG_IMPLEMENT
#include "bus/mpi/transport.hpp"
#include "gpu/device.hpp"
#include "gpu/layers/device_all_reduce.hpp"
#include "gpu/layers/device_backend.hpp"
#include "gpu/layers/nccl_all_reduce.hpp"
#include "gpu/memory.hpp"
#include "gpu/nccl.hpp"
#include "layers/pipeline/mpi_ranks.hpp"
#include "layers/pipeline/pipeline.hpp"
#include "tests/gpu/gpu_fixture.hpp"
#include "tests/pipeline/chain.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <future>
#include <random>

using namespace nerve;
namespace pl = nerve::pipeline;

namespace {

bus::mpi::transport* world = nullptr;
constexpr double lr = 0.05, momentum = 0.9;

gpu::device_options on(int ordinal) {
  gpu::device_options o;
  o.backend = gpu::backend_kind::cuda;
  o.ordinal = ordinal;
  return o;
}

/// Member `me`'s buffers of a round: normal values, another magnitude per member.
std::vector<float> part_of(std::uint32_t me, std::size_t n) {
  std::mt19937_64 rng(40 + me);
  std::normal_distribution<float> nd;
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng) * float(1 << (4 * me));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  if (gpu::device::cuda_device_count() < 2) {
    std::printf("%d CUDA device(s), NCCL across ranks needs 2 (one per rank): skipped\n",
                gpu::device::cuda_device_count());
    return 77;
  }
  std::string why;
  if (!gpu::nccl_comms::available(&why)) {
    std::printf("NCCL not loadable (%s): skipped\n", why.c_str());
    return 77;
  }
  int rc = 0;
  {
    bus::mpi::transport t;
    if (t.size() != 2 || gpu::device::cuda_device_count() < t.size()) {
      std::printf("%d ranks for %d CUDA devices; run under mpirun -np 2 with two GPUs: skipped\n", t.size(),
                  gpu::device::cuda_device_count());
      return 77;
    }
    world = &t;
    doctest::Context ctx(argc, argv);
    rc = ctx.run();
    world = nullptr;
  }
  return rc;
}

TEST_SUITE("gpu.nccl.ranks") {
  TEST_CASE("a rank's reducer sums its member's buffers with the other rank's, in place, within (R-1)·u·Σ|g|") {
    const auto me = std::uint32_t(world->rank()), R = std::uint32_t(world->size());
    struct member : actors::actor {
      std::promise<std::shared_ptr<layers::backend_data>> got;
      member() : actor("member") {
        on<layers::device_reduced>([this](layers::device_reduced& m) { got.set_value(std::move(m.sum)); });
      }
    };
    actors::runtime rt(actors::runtime_options{.loops = 1});
    gpu::device dev(on(int(me)));
    auto s = dev.create_stream();
    const std::string id = me == 0 ? gpu::nccl_comms::unique_id() : std::string();
    auto group = std::make_shared<gpu::nccl_rank_group>(dev, R, me, world->all_gather(id)[0], dev.create_stream());
    auto local = rt.spawn_with<member>(actors::spawn_options{.loop = 0u});
    auto reducer = rt.spawn_with<gpu::nccl_all_reduce>(actors::spawn_options{.loop = 0u}, "all-reduce", local, group);
    const std::size_t n = 1000;
    const auto mine = part_of(me, n);
    gpu::device_tensor buf(s, gpu::shape_t{n});
    gpu::copy_async(s, buf.data(), mine.data(), n * sizeof(float));
    auto g = std::make_shared<gpu::device_gradients>();
    g->parts.emplace_back(buf.data(), n);
    g->ready = s.record();
    g->domain = &dev.core();
    rt.send(reducer, layers::device_contribution{3, me, std::move(g)});
    auto sum = static_cast<member*>(local.get())->got.get_future().get();
    auto& d = dynamic_cast<gpu::device_sum&>(*sum);
    CHECK(d.in_place);
    s.wait(d.ready);
    std::vector<float> got(n);
    gpu::copy_async(s, got.data(), buf.data(), n * sizeof(float));
    s.synchronize();
    std::vector<float> want(n, 0.0f);
    std::vector<double> tol(n, 0.0);
    for (std::uint32_t m = 0; m < R; ++m) {
      const auto p = part_of(m, n);
      for (std::size_t i = 0; i < n; ++i) {
        want[i] = m == 0 ? p[i] : want[i] + p[i];  // member order, bus::all_reduce's
        tol[i] += (R - 1) * gpu::test::unit_roundoff * std::abs(double(p[i]));
      }
    }
    gpu::test::check_within("rank " + std::to_string(me), got, want, tol);
    rt.synchronize();
    CHECK(static_cast<gpu::nccl_all_reduce*>(reducer.get())->rounds() == 1);
    rt.stop(reducer);
    rt.stop(local);
    rt.synchronize();
    world->barrier();
  }

  TEST_CASE("replicas one per rank, each on its GPU, train to the CPU replicas' weights (NCCL sums their gradients)") {
    const auto me = world->rank(), R = world->size();
    std::vector<layers::graph> cpu, dev;
    for (int r = 0; r < R; ++r) cpu.push_back(test::small_chain(7)), dev.push_back(test::small_chain(7));
    auto run = [&](std::vector<layers::graph>& reps, bool across) {
      actors::runtime rt(actors::runtime_options{.loops = 2});
      gpu::device d(on(me));
      pl::pipeline_options o;
      if (across) {
        o.link = pl::mpi_ranks(*world);
        o.backends.push_back([&d](layers::graph& g, const std::vector<std::size_t>& nodes) {
          gpu::device_backend_options so;
          so.make_optimizer = [=] { return layers::make_optimizer<float>("sgd", lr, momentum); };
          so.nodes = nodes;
          return std::make_shared<gpu::device_backend>(d, g, so);
        });
      }
      std::vector<layers::graph*> ptrs;
      for (auto& g : reps) ptrs.push_back(&g);
      pl::pipeline p(rt, ptrs, pl::partition_by_parameters(reps[0], 1), pl::make_schedule("1f1b", 1, 2),
                     std::make_shared<layers::cross_entropy>(),
                     [] { return layers::make_optimizer<float>("sgd", lr, momentum); }, o);
      if (across) {
        REQUIRE(p.reducers().size() == 5);  // this rank's replica: one per Linear
        for (auto& a : p.reducers()) CHECK(dynamic_cast<gpu::nccl_all_reduce*>(a.get()) != nullptr);
      }
      for (int s = 0; s < 3; ++s) {
        auto b = test::make_batch(reps[0], 24, 100 + std::uint64_t(s));
        p.train_step(std::move(b.x), b.t, std::uint64_t(s));
      }
      p.download();
    };
    run(cpu, false);  // the CPU replicas, in this process
    run(dev, true);
    auto a = cpu[0].parameters(), b = dev[0].parameters(), start = test::small_chain(7).parameters();
    for (std::size_t i = 0; i < a.size(); ++i) {
      CAPTURE(a[i].name);
      double largest = 0, moved = 0;
      for (std::int64_t k = 0; k < a[i].value->size(); ++k) {
        largest = std::max(largest, double(std::abs(a[i].value->data()[k])));
        moved = std::max(moved, double(std::abs(b[i].value->data()[k] - start[i].value->data()[k])));
      }
      CHECK(moved > 1e-5);  // the device replicas trained
      std::vector<float> want(a[i].value->data(), a[i].value->data() + a[i].value->size());
      std::vector<float> got(b[i].value->data(), b[i].value->data() + b[i].value->size());
      gpu::test::check_within("weights", got, want, std::vector<double>(want.size(), 1e-4 * largest));
    }
    world->barrier();
  }
}

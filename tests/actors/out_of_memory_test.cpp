// Running out of memory while spawning, and after: std::bad_alloc leaves a runtime that
// goes on working and is destroyed cleanly. The failures are injected: this binary
// replaces the global operator new and delete, and a test makes the calling thread's Nth
// allocation fail (or every one from the Nth on), so each allocation of a spawn or of the
// teardown fails in turn, deterministically.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/runtime.hpp"

namespace {

/// This thread's allocations left before one fails (-1: none fails), and whether every
/// later one fails too. Loop threads are never armed: only the thread under test fails.
thread_local long allocations_left = -1;
thread_local bool fail_from_then_on = false;
thread_local bool failed_one = false;

void* allocate(std::size_t n, std::size_t align) {
  if (allocations_left == 0) {
    if (!fail_from_then_on) allocations_left = -1;
    failed_one = true;
    throw std::bad_alloc();
  }
  if (allocations_left > 0) --allocations_left;
  if (n == 0) n = 1;
  void* p = nullptr;
  if (align <= alignof(std::max_align_t)) p = std::malloc(n);
  else if (::posix_memalign(&p, align, n) != 0) p = nullptr;
  if (!p) throw std::bad_alloc();
  return p;
}

/// The calling thread's allocation after the next `n` fails (`sticky`: and every one after it).
void fail_allocation_after(long n, bool sticky = false) {
  fail_from_then_on = sticky;
  failed_one = false;
  allocations_left = n;
}
/// Allocations succeed again; true when the armed failure happened.
bool allocations_succeed() {
  allocations_left = -1;
  fail_from_then_on = false;
  return std::exchange(failed_one, false);
}

}  // namespace

// Every form, so that new and delete always pair with malloc and free (AddressSanitizer
// checks that each block is freed by the family that allocated it).
void* operator new(std::size_t n) { return allocate(n, 0); }
void* operator new[](std::size_t n) { return allocate(n, 0); }
void* operator new(std::size_t n, std::align_val_t a) { return allocate(n, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t n, std::align_val_t a) { return allocate(n, static_cast<std::size_t>(a)); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return allocate(n, 0);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return allocate(n, 0);
  } catch (...) {
    return nullptr;
  }
}
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  try {
    return allocate(n, static_cast<std::size_t>(a));
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  try {
    return allocate(n, static_cast<std::size_t>(a));
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }

using namespace nerve::actors;

namespace {

std::atomic<long> alive{0};

/// Allocates in its constructor (handlers, a name longer than a short string holds) and
/// takes a 4 KiB arena slot, so 16 of them fill the arena's first block.
struct fat_actor : actor {
  char ballast[3900] = {};
  std::uint64_t got = 0;
  explicit fat_actor(std::string name = {}) : actor(std::move(name)) {
    on<std::uint64_t>([this](std::uint64_t&) { ++got; });
    on<int>([this](int&) { ++got; });
    alive.fetch_add(1, std::memory_order_relaxed);  // last: the destructor runs only once the constructor is done
  }
  ~fat_actor() override { alive.fetch_sub(1, std::memory_order_relaxed); }
};

/// Replies to every number with itself, to `to`.
struct echo : actor {
  address to;
  explicit echo(address c) : to(std::move(c)) {
    on<std::uint64_t>([this](std::uint64_t& v) { send(to, v); });
    alive.fetch_add(1, std::memory_order_relaxed);
  }
  ~echo() override { alive.fetch_sub(1, std::memory_order_relaxed); }
};

struct total : actor {
  std::uint64_t got = 0;
  total() {
    on<std::uint64_t>([this](std::uint64_t&) { ++got; });
    alive.fetch_add(1, std::memory_order_relaxed);
  }
  ~total() override { alive.fetch_sub(1, std::memory_order_relaxed); }
};

}  // namespace

TEST_SUITE("actors.out_of_memory") {
  TEST_CASE("a spawn whose Nth allocation fails throws std::bad_alloc and leaves the runtime as it was, for every N") {
    // Already spawned before the failing spawn: none (the arena's first block, the
    // registry's first segments), 16 (the arena's next block) and 256 (the registry's
    // next segments). Each name is too long for a short string: the registry copies it.
    for (const std::size_t before : {std::size_t{0}, std::size_t{16}, std::size_t{256}}) {
      CAPTURE(before);
      long failures = 0;
      for (long n = 0;; ++n) {
        CAPTURE(n);
        const long alive0 = alive.load();
        {
          runtime rt({.loops = 1, .manual = true});
          std::vector<address> kept;
          for (std::size_t i = 0; i < before; ++i) kept.push_back(rt.spawn<fat_actor>());
          address last;
          bool threw = false;
          fail_allocation_after(n);
          try {
            last = rt.spawn<fat_actor>("the actor spawned while memory runs out");
          } catch (const std::bad_alloc&) {
            threw = true;
          }
          REQUIRE(allocations_succeed() == threw);
          if (!threw) {
            CHECK(rt.spawned() == before + 1);
            rt.shutdown();
            CHECK(failures > 0);
            break;
          }
          ++failures;
          // Nothing of the failed spawn is left: not in the registry, not in the trace's
          // list, not alive; the next spawn takes the id it would have had.
          CHECK(rt.spawned() == before);
          CHECK(rt.trace_actors().size() == before);
          CHECK(alive.load() - alive0 == static_cast<long>(before));
          auto next = rt.spawn<fat_actor>("next");
          CHECK(next.id() == before + 1);
          CHECK(rt.trace_actors().back()["name"] == "next");
          rt.send(next, std::uint64_t{1});
          if (before > 0) rt.send(kept.front(), 2);
          rt.run_until_idle();
          CHECK(static_cast<fat_actor*>(next.get())->got == 1);
          if (before > 0) CHECK(static_cast<fat_actor*>(kept.front().get())->got == 1);
          rt.shutdown();
        }
        CHECK(alive.load() == alive0);
      }
    }
  }

  TEST_CASE("a runtime destroyed while every allocation fails stops its loops and destroys every actor once") {
    // What a spawn loop that ran out of memory leaves: its runtime is destroyed while
    // memory is still short. Its stops cannot all be sent (each is an envelope); from the
    // Nth on none can.
    for (const long n : {0L, 1L, 50L, 299L}) {
      CAPTURE(n);
      const long alive0 = alive.load();
      address kept;
      {
        runtime rt({.loops = 2});
        auto sum = rt.spawn_with<total>({.loop = std::nullopt, .capacity = 1000, .supervisor = {}});
        std::vector<address> all;
        for (std::uint64_t i = 0; i < 299; ++i) {
          all.push_back(rt.spawn<echo>(sum));
          rt.send(all.back(), i);
        }
        rt.synchronize();
        CHECK(static_cast<total*>(sum.get())->got == 299);
        kept = all[7];
        all.clear();
        sum = {};
        fail_allocation_after(n, /*sticky=*/true);
      }  // the runtime's destructor runs here, with no memory to allocate
      const bool failed = allocations_succeed();
      CHECK(failed);
      CHECK(alive.load() == alive0);
      CHECK(kept.stopped());
      CHECK(kept.get() == nullptr);
    }
  }

  TEST_CASE("a spawn loop that runs out of memory in a running runtime ends in a clean teardown") {
    // nerve-bench messaging -w many under `ulimit -v`: spawn, send, spawn, ... until a spawn
    // throws; the runtime is destroyed while memory is still short.
    const long alive0 = alive.load();
    std::uint64_t spawned = 0;
    {
      runtime rt({.loops = 2});
      auto sum = rt.spawn_with<total>({.loop = std::nullopt, .capacity = 100000, .supervisor = {}});
      try {
        for (std::uint64_t i = 0; i < 100000; ++i) {
          if (i == 2000) fail_allocation_after(5000, /*sticky=*/true);
          rt.send(rt.spawn<echo>(sum), i);
          ++spawned;
        }
      } catch (const std::bad_alloc&) {
      }
    }
    const bool failed = allocations_succeed();
    CHECK(failed);
    CHECK(spawned >= 2000);
    CHECK(spawned < 100000);
    CHECK(alive.load() == alive0);
  }
}

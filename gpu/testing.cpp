#include "gpu/testing.hpp"

#include "gpu/detail/device_core.hpp"
#include "gpu/device.hpp"

#include <atomic>
#include <cstdint>

namespace nerve::gpu::testing {

void enqueue_fault(stream& s, fault_kind kind) { s.impl().core->impl->enqueue_fault(s.impl(), static_cast<int>(kind)); }

gate::gate(device& d) : flag_(d, 64), backend_(d.core().impl.get()) {
  std::atomic_ref<std::int32_t>(*static_cast<std::int32_t*>(flag_.data())).store(0, std::memory_order_release);
}

gate::~gate() { open(); }

void gate::enqueue(stream& s) {
  backend_->enqueue_gate(s.impl(), static_cast<volatile std::int32_t*>(flag_.data()));
}

void gate::open() noexcept { backend_->open_gate(static_cast<std::int32_t*>(flag_.data())); }

void gate::close() noexcept {
  std::atomic_ref<std::int32_t>(*static_cast<std::int32_t*>(flag_.data())).store(0, std::memory_order_release);
}

}  // namespace nerve::gpu::testing

#pragma once
/// \file
/// How a layer's forward and backward messages cross between ranks (`bus::mpi::codec`).
///
/// A frame holds the message's fixed fields (micro-batch, step, port, and for a forward its
/// step's micro-batch count, mode and learning rate), the tensor's element type and its
/// shape (rows, then the sample's dimensions); the payload is the host tensor's contiguous
/// rows, sent from the tensor itself and received straight into a new tensor of that shape
/// (uninitialised, not zeroed first). Only host tensors cross: a device stage hands its
/// value over to the host first (`layer_kernels::hand_over`), since CUDA-aware MPI is not
/// assumed.
///
/// Include where the program links `nerve::bus_mpi`.

#include <cstdint>
#include <span>
#include <stdexcept>
#include <vector>

#include "bus/mpi/transport.hpp"
#include "layers/messages.hpp"

namespace nerve::layers::wire {

/// The element types a frame names (one today: the layers compute in fp32).
enum class dtype : std::uint8_t { f32 = 1 };

inline void write_tensor(bus::mpi::frame_writer w, const value& v) {
  if (v.device) throw std::logic_error("bus::mpi: a device value cannot cross ranks; hand it over to the host first");
  const auto& t = v.host;
  const auto& dims = t.sample_shape().dims();
  w.put(dtype::f32).put(std::int64_t(t.batch())).put(std::uint32_t(dims.size()));
  for (auto d : dims) w.put(d);
}

inline std::span<const std::byte> tensor_bytes(const value& v) {
  return std::as_bytes(std::span(v.host.data(), std::size_t(v.host.size())));
}

/// A tensor of the frame's shape; `payload` points at its rows.
inline value read_tensor(bus::mpi::frame_reader& r, std::span<std::byte>& payload) {
  if (r.get<dtype>() != dtype::f32) throw std::runtime_error("bus::mpi: a tensor of an element type other than fp32");
  const auto rows = r.get<std::int64_t>();
  const auto rank = r.get<std::uint32_t>();
  if (rows < 0 || rank > 8) throw std::runtime_error("bus::mpi: a tensor frame with a bad shape");
  std::vector<std::int64_t> dims(rank);
  for (auto& d : dims) {
    d = r.get<std::int64_t>();
    if (d < 0) throw std::runtime_error("bus::mpi: a tensor frame with a negative dimension");
  }
  if (rows == 0 && rank == 0) return {};  // an empty value
  tensor t(rows, shape(std::move(dims)));
  payload = std::as_writable_bytes(std::span(t.data(), std::size_t(t.size())));
  return value(std::move(t));  // the heap buffer stays where `payload` points
}

}  // namespace nerve::layers::wire

template <>
struct nerve::bus::mpi::codec<nerve::layers::forward_msg> {
  static void write(const layers::forward_msg& m, std::vector<std::byte>& frame) {
    frame_writer w{frame};
    w.put(m.micro_batch).put(m.step).put(m.port).put(m.micro_batches).put(std::uint8_t(m.train)).put(m.lr);
    layers::wire::write_tensor(w, m.x);
  }
  static std::span<const std::byte> payload(const layers::forward_msg& m) { return layers::wire::tensor_bytes(m.x); }
  static layers::forward_msg read(std::span<const std::byte> frame, std::span<std::byte>& payload) {
    // A braced list runs its reads left to right, the frame's order; the designators keep
    // the fields from shifting if the message's members move.
    frame_reader r{frame};
    return {.micro_batch = r.get<std::int64_t>(), .step = r.get<std::uint64_t>(), .port = r.get<std::uint32_t>(),
            .micro_batches = r.get<std::uint32_t>(), .train = r.get<std::uint8_t>() != 0, .lr = r.get<double>(),
            .x = layers::wire::read_tensor(r, payload)};
  }
};

template <>
struct nerve::bus::mpi::codec<nerve::layers::backward_msg> {
  static void write(const layers::backward_msg& m, std::vector<std::byte>& frame) {
    frame_writer w{frame};
    w.put(m.micro_batch).put(m.step).put(m.port);
    layers::wire::write_tensor(w, m.grad);
  }
  static std::span<const std::byte> payload(const layers::backward_msg& m) { return layers::wire::tensor_bytes(m.grad); }
  static layers::backward_msg read(std::span<const std::byte> frame, std::span<std::byte>& payload) {
    frame_reader r{frame};  // in the frame's order, as above
    return {.micro_batch = r.get<std::int64_t>(), .step = r.get<std::uint64_t>(), .port = r.get<std::uint32_t>(),
            .grad = layers::wire::read_tensor(r, payload)};
  }
};

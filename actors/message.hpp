#pragma once
/// \file
/// Typed messages and the envelope that carries them through mailboxes.
///
/// A message is any movable C++ type. The runtime wraps it in an envelope that
/// records its kind, its sender and, where the message belongs to one, its
/// micro-batch id. The payload is moved into the envelope on send and moved
/// (or handed by reference) to the receiver's handler: it is never copied.

#include <concepts>
#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <new>
#include <string_view>
#include <type_traits>
#include <utility>

#include "actors/detail/envelope_pool.hpp"
#include "actors/detail/mpsc_queue.hpp"

namespace nerve::actors {

/// Identifies an actor within a runtime (1, 2, ...); 0 means "outside any actor".
using actor_id = std::uint32_t;

/// Which queue of a mailbox a message goes to. `urgent` messages (control,
/// replies, failures) are handled before any `normal` one and do not count
/// against the mailbox capacity.
enum class lane : std::uint8_t { normal = 0, urgent = 1 };

namespace detail {
template <class T>
constexpr std::string_view type_name_of() {
  std::string_view p = __PRETTY_FUNCTION__;  // "... [with T = ns::name; ...]"
  auto b = p.find("T = ") + 4;
  auto e = p.find_first_of(";]", b);
  auto name = p.substr(b, e - b);
  // Drop namespaces and template arguments' qualifiers: the kind is a short noun.
  auto lt = name.find('<');
  auto head = name.substr(0, lt);
  auto colon = head.rfind("::");
  if (colon != std::string_view::npos) name.remove_prefix(colon + 2);
  return name;
}
}  // namespace detail

/// A message type may name its kind with `static constexpr std::string_view kind = "forward";`.
template <class T>
concept named_message = requires { { T::kind } -> std::convertible_to<std::string_view>; };

/// A message type that belongs to a micro-batch exposes a `micro_batch` member (integer).
template <class T>
concept batched_message = requires(const T& m) { { m.micro_batch } -> std::convertible_to<std::int64_t>; };

/// A message type may report the bytes its payload holds with `payload_bytes()`.
template <class T>
concept sized_message = requires(const T& m) { { m.payload_bytes() } -> std::convertible_to<std::size_t>; };

/// A message type may keep out of the trace with `static constexpr bool traced = false;`:
/// housekeeping an actor sends itself at a high rate (the MPI poller's next turn), which
/// would otherwise outnumber the messages a trace is for. Neither its send nor the handler
/// run it starts is recorded; what that run sends is.
template <class T>
constexpr bool traced_message() {
  if constexpr (requires { T::traced; }) return bool(T::traced);
  else return true;
}

/// Runtime type identity of a message kind: one static object per type.
struct type_tag {
  std::string_view name;
  /// Whether the last recorded handler run for this type took at least `long_run_ticks`
  /// (written only when it changes): sends from the next run then read the clock instead
  /// of taking their run's start (recorder.hpp).
  mutable std::atomic<bool> long_runs{false};
  bool traced = true;  ///< `traced_message<T>()`
};

/// The tag of message type `T` (stable for the life of the program; thread-safe).
template <class T>
const type_tag* tag_of() noexcept {
  static const type_tag tag{[] {
    if constexpr (named_message<T>) return std::string_view{T::kind};
    else return detail::type_name_of<T>();
  }(), false, traced_message<T>()};
  return &tag;
}

/// Bytes a message payload holds, for the trace: `payload_bytes()` when the type has it,
/// the element bytes of a contiguous container, else `sizeof(T)`.
template <class T>
std::size_t payload_bytes_of(const T& m) noexcept {
  if constexpr (sized_message<T>) return m.payload_bytes();
  else if constexpr (requires { m.size(); m.data(); }) return m.size() * sizeof(*m.data());
  else return sizeof(T);
}

struct reply_sink_base;

/// The envelope: intrusive queue node, header, and (in `typed_envelope<T>`) the payload.
/// Created by `send`, owned by the mailbox until handled, then destroyed on the receiver's loop.
struct envelope : detail::mpsc_node {
  const type_tag* tag = nullptr;
  actor_id sender = 0;
  std::uint32_t sent_reserved = 0;  ///< recorded: the receiver's normal reservations after the enqueue
  lane where = lane::normal;
  bool sent_counted = false;        ///< recorded: sent_reserved is set
  /// Recorded and stamped by a run in a group (recorder.hpp): which run of the group sent
  /// it (0: the first, or not in a group); `sent_ticks` is then the group's start.
  std::uint8_t sent_run = 0;
  /// The loop the sender's thread ran (`no_loop`: a thread outside the runtime). Migration
  /// votes with it (runtime.hpp, "Placement and migration"). Fits the padding before micro_batch.
  std::uint16_t src_loop = no_loop;
  static constexpr std::uint16_t no_loop = 0xffff;
  static constexpr std::uint16_t heavy_sender = 0xfffe;  ///< sent by a heavy actor: pulls nobody
  std::int64_t micro_batch = -1;
  std::uint64_t bytes = 0;
  std::int64_t sent_ticks = 0;    ///< recorder ticks at the enqueue; 0 when not recorded
  std::unique_ptr<reply_sink_base> reply;  ///< set for requests only

  virtual ~envelope() = default;
  virtual void* payload() noexcept = 0;

  // Envelopes come from per-thread free lists (detail/envelope_pool.hpp). The sized delete
  // gets the dynamic type's size through the virtual destructor.
  static void* operator new(std::size_t bytes) { return detail::envelope_allocate(bytes); }
  static void operator delete(void* p, std::size_t bytes) noexcept { detail::envelope_deallocate(p, bytes); }
  static void* operator new(std::size_t bytes, std::align_val_t al) { return ::operator new(bytes, al); }
  static void operator delete(void* p, std::size_t bytes, std::align_val_t al) noexcept { ::operator delete(p, bytes, al); }
};

template <class T>
struct typed_envelope final : envelope {
  template <class... Args>
  explicit typed_envelope(Args&&... args) : value(std::forward<Args>(args)...) {}
  void* payload() noexcept override { return &value; }
  T value;
};

/// Builds the envelope for a message of type T (moved in).
template <class T>
std::unique_ptr<envelope> make_envelope(T&& msg, actor_id sender, lane where) {
  using U = std::remove_cvref_t<T>;
  auto e = std::make_unique<typed_envelope<U>>(std::forward<T>(msg));
  e->tag = tag_of<U>();
  e->sender = sender;
  e->where = where;
  if constexpr (batched_message<U>) e->micro_batch = static_cast<std::int64_t>(e->value.micro_batch);
  return e;
}

/// Where the answer to a request goes: to the requesting actor's mailbox, or to a
/// promise held by a thread outside the runtime. Exactly one of deliver/fail is called.
struct reply_sink_base {
  explicit reply_sink_base(const type_tag* expected) : expects(expected) {}
  virtual ~reply_sink_base() = default;
  /// The reply type the requester waits for (checked against the handler's return type).
  const type_tag* expects;
  /// The handler's return value, type-erased as a pointer to an R.
  virtual void deliver(void* value) = 0;
  /// The request could not be answered (the receiver failed, stopped, or has no such handler).
  virtual void fail(std::exception_ptr error) = 0;
};

}  // namespace nerve::actors

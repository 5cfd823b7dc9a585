#pragma once
/// \file
/// Errors the runtime reports. Expected conditions (a full mailbox, a timeout) are
/// values (`send_status`, `request_error`); these exceptions are for misuse and failures.

#include <stdexcept>
#include <string>

namespace nerve::actors {

/// The outcome of a non-blocking send.
enum class send_status {
  ok,      ///< enqueued
  full,    ///< the receiver's normal lane is at capacity; the message was not taken
  closed,  ///< the receiver has stopped; the message was not taken
};

/// Sending failed: the receiver stopped, or its mailbox was full for a send that may not wait.
class send_error : public std::runtime_error {
 public:
  send_error(send_status why, const std::string& what) : std::runtime_error(what), status(why) {}
  send_status status;
};

/// A request got no answer in time.
class request_timeout : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// An actor received a message kind it has no handler for, or was wired wrongly.
class wiring_error : public std::logic_error {
  using std::logic_error::logic_error;
};

/// Wraps the exception a handler threw, naming the actor and the message kind.
class actor_failure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace nerve::actors

#pragma once
/// \file
/// Findings about a trace file: errors (the file breaks the format) and warnings
/// (legal but suspicious, e.g. a flow still in flight at the end of the trace).

#include <cstdint>
#include <string>
#include <vector>

namespace nerve::trace {

/// How bad a finding is. Errors make `validate` fail; warnings do too under `--strict`.
enum class severity { warning, error };

/// One finding, located as precisely as the reader knows: the file, and either the
/// event's index in the file's event array or a byte offset for JSON syntax errors.
struct diagnostic {
  severity level = severity::error;
  std::string file;
  std::int64_t event = -1;  ///< index in `traceEvents` (or the bare array); -1 when not about one event
  std::string message;
  std::int64_t line = -1;   ///< 1-based line of a line-oriented file (metrics JSON lines); -1 when not about one

  /// `file: event 12: message` (or `file: line 3: message`), the form every command prints.
  [[nodiscard]] std::string to_string() const;
};

/// All findings of a read, in the order they were found.
struct diagnostics {
  std::vector<diagnostic> items;

  void error(std::string file, std::int64_t event, std::string message) {
    items.push_back({severity::error, std::move(file), event, std::move(message)});
  }
  void warning(std::string file, std::int64_t event, std::string message) {
    items.push_back({severity::warning, std::move(file), event, std::move(message)});
  }
  [[nodiscard]] std::size_t error_count() const;
  [[nodiscard]] std::size_t warning_count() const;
  /// True if any item mentions `text` (tests use it to look for a message).
  [[nodiscard]] bool mentions(const std::string& text) const;
};

}  // namespace nerve::trace

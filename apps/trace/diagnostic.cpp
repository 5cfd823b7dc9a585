#include "apps/trace/diagnostic.hpp"

#include <algorithm>

namespace nerve::trace {

std::string diagnostic::to_string() const {
  std::string out = file.empty() ? std::string("<input>") : file;
  out += ": ";
  if (event >= 0) out += "event " + std::to_string(event) + ": ";
  if (line >= 0) out += "line " + std::to_string(line) + ": ";
  out += level == severity::error ? "error: " : "warning: ";
  out += message;
  return out;
}

std::size_t diagnostics::error_count() const {
  return static_cast<std::size_t>(std::count_if(items.begin(), items.end(),
                                                [](const diagnostic& d) { return d.level == severity::error; }));
}

std::size_t diagnostics::warning_count() const { return items.size() - error_count(); }

bool diagnostics::mentions(const std::string& text) const {
  return std::any_of(items.begin(), items.end(),
                     [&](const diagnostic& d) { return d.to_string().find(text) != std::string::npos; });
}

}  // namespace nerve::trace

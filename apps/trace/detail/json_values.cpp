#include "apps/trace/detail/json_values.hpp"

#include <cmath>
#include <sstream>

namespace nerve::trace::detail {

std::string in_quotes(const std::string& s) { return "\"" + s + "\""; }

std::string clipped(std::string_view s, std::size_t n) {
  return s.size() <= n ? std::string(s) : std::string(s.substr(0, n)) + "… (" + std::to_string(s.size()) + " characters)";
}

std::optional<std::int64_t> whole_number(const json& v, std::int64_t lo, std::int64_t hi) {
  std::int64_t x = 0;
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return std::nullopt;
    x = static_cast<std::int64_t>(u);
  } else if (v.is_number_integer()) {
    x = v.get<std::int64_t>();
  } else if (v.is_number_float()) {
    const double d = std::trunc(v.get<double>());
    if (!(d >= -0x1p63 && d < 0x1p63)) return std::nullopt;
    x = static_cast<std::int64_t>(d);
  } else {
    return std::nullopt;
  }
  if (x < lo || x > hi) return std::nullopt;
  return x;
}

std::string range_text(std::int64_t lo, std::int64_t hi) {
  auto name = [](std::int64_t v) -> std::string {
    if (v == int64_max) return "2^63-1";
    if (v == int64_min) return "-2^63";
    if (v == int32_max) return "2^31-1";
    if (v == int32_min) return "-2^31";
    return std::to_string(v);
  };
  return "an integer from " + name(lo) + " to " + name(hi);
}

std::string type_name(const json& j) {
  if (j.is_string()) return "string " + j.dump();
  return std::string(j.type_name());
}

std::string number(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace nerve::trace::detail

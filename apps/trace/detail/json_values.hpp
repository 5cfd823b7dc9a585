#pragma once
/// \file
/// The JSON values the trace reader meets, as its messages show them (quoted, clipped,
/// their type named, ranges spelled out), and the whole numbers it reads out of them.
/// Shared by the parts of `detail::reader`; not for the viewer's other steps.

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

namespace nerve::trace::detail {

using json = nlohmann::json;

/// `s` in double quotes.
std::string in_quotes(const std::string& s);

/// At most `n` characters of `s`, marked when cut: keys and numbers can be megabytes long.
std::string clipped(std::string_view s, std::size_t n = 40);

/// The whole number `v` holds, truncated toward zero as before, if it lies in [lo, hi].
/// A float outside the 64-bit range has no such number (casting it would be undefined).
std::optional<std::int64_t> whole_number(const json& v, std::int64_t lo, std::int64_t hi);

inline constexpr std::int64_t int32_min = std::numeric_limits<std::int32_t>::min();
inline constexpr std::int64_t int32_max = std::numeric_limits<std::int32_t>::max();
inline constexpr std::int64_t int64_min = std::numeric_limits<std::int64_t>::min();
inline constexpr std::int64_t int64_max = std::numeric_limits<std::int64_t>::max();

/// "an integer from lo to hi", the bounds of 32- and 64-bit integers by name.
std::string range_text(std::int64_t lo, std::int64_t hi);

/// A JSON value's type for messages; a string shows itself.
std::string type_name(const json& j);

/// `v` as `std::ostream` prints it by default (six significant digits), for messages.
std::string number(double v);

}  // namespace nerve::trace::detail

#pragma once
/// \file
/// Range checks for the apps' numeric options, as CLI11 transforms. Every app's numbers go
/// through these, so a value out of range is refused with the option's name and the range
/// written out (`--seed: '-1' is not a whole number from 0 to 2^64-1`), never converted
/// into something else. They are transforms, not checks: the text is rewritten in plain
/// decimal once it passed, so CLI11's own conversion (which in Debian 12's CLI11 2.1 reads
/// -1 as a huge unsigned number and 010 as octal) converts exactly what was checked.
/// `parse_command_line` gives nerve-train, nerve-pipeline and the benches one way to refuse:
/// one line `<app>: <message>` and status 1 (docs/errors.md); nerve-trace keeps status 2 for
/// usage errors (docs/trace.md). Header-only; CLI11 and the standard library only.

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iomanip>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>

#include <CLI/CLI.hpp>

namespace nerve::apps {

/// A number as a reader writes it: 10000000, 0.99, 4e+15.
inline std::string readable(double v) {
  std::ostringstream os;
  os << std::setprecision(12) << v;
  return os.str();
}

/// The whole text as a finite double, or nothing (no trailing characters, no nan or inf).
inline std::optional<double> finite_number(const std::string& text) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || errno == ERANGE || !std::isfinite(v)) return std::nullopt;
  return v;
}

/// A finite number in [lo, hi]; `unit` follows the range in messages (" µs").
inline CLI::Validator real_in(double lo, double hi, const std::string& unit = "") {
  const std::string range = "a finite number from " + readable(lo) + " to " + readable(hi) + unit;
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        auto v = finite_number(text);
        if (!v || *v < lo || *v > hi) return "'" + text + "' is not " + range;
        std::ostringstream os;
        os << std::setprecision(17) << *v;
        text = os.str();
        return {};
      },
      "[" + readable(lo) + " to " + readable(hi) + unit + "]");
}

/// A whole number of type T in [lo, hi], written in decimal. `lo_text` and `hi_text` name
/// the bounds in messages where their digits say less ("2^64-1"); `shown` says whether the
/// range goes into `--help`.
template <typename T>
CLI::Validator whole_in(T lo, T hi, const std::string& hi_text = "", const std::string& lo_text = "",
                        bool shown = true) {
  const std::string bottom = lo_text.empty() ? std::to_string(lo) : lo_text;
  const std::string top = hi_text.empty() ? std::to_string(hi) : hi_text;
  const std::string range = "a whole number from " + bottom + " to " + top;
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        T v{};
        auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
        if (ec != std::errc() || end != text.data() + text.size() || v < lo || v > hi)
          return "'" + text + "' is not " + range;
        text = std::to_string(v);
        return {};
      },
      shown ? "[" + bottom + " to " + top + "]" : "");
}

/// Any value of the integer type T, for an option whose range the app checks itself with
/// its own words: refuses a fraction, text, a sign on an unsigned type and what T cannot
/// hold, before CLI11 could wrap it around or saturate it (the app would then check, and
/// name, a number the user never gave).
template <typename T>
CLI::Validator any_whole() {
  static_assert(std::is_integral_v<T>);
  const auto bits = std::to_string(8 * sizeof(T) - std::is_signed_v<T>);
  return whole_in<T>(std::numeric_limits<T>::min(), std::numeric_limits<T>::max(), "2^" + bits + "-1",
                     std::is_signed_v<T> ? "-2^" + bits : "0", false);
}

/// `app.add_option` for an integer `value`, refusing what its type cannot hold (`any_whole`).
template <typename T>
CLI::Option* add_whole(CLI::App& app, const std::string& name, T& value, const std::string& help) {
  return app.add_option(name, value, help)->transform(any_whole<T>());
}

/// Parses the command line into `app`. Returns -1 when the app goes on; else the status to
/// exit with: 0 after `--help` (printed), 1 after a refused option or value, said on stderr
/// in one line as `<name>: <message>` like every other error of the app.
inline int parse_command_line(CLI::App& app, int argc, char** argv, const char* name) {
  try {
    app.parse(argc, argv);
    return -1;
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 1;
  }
}

}  // namespace nerve::apps

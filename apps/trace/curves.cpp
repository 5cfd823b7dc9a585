#include "apps/trace/curves.hpp"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <sstream>

namespace nerve::trace {
namespace {

using json = nlohmann::json;

// Stop collecting after this many errors: a file of garbage should not fill memory
// with messages nobody reads (the command prints the first 50).
constexpr std::size_t max_errors = 1000;

// Whole numbers a double holds exactly: steps and epochs beyond them are no count.
constexpr std::int64_t max_count = std::int64_t(1) << 53;

std::string clipped(std::string_view s, std::size_t n = 60) {
  return s.size() <= n ? std::string(s) : std::string(s.substr(0, n)) + "… (" + std::to_string(s.size()) + " characters)";
}

// nlohmann prefixes "[json.exception.parse_error.101] parse error at line 1, column 5: ".
std::string plain(const std::string& what) {
  auto colon = what.find(": ");
  return colon == std::string::npos ? what : what.substr(colon + 2);
}

struct refused {
  std::string what;
};

class metrics_reader {
 public:
  metrics_reader(std::string name, diagnostics& diags) : name_(std::move(name)), diags_(diags) {}

  training_curves read(std::string_view text) {
    std::int64_t line = 0;
    for (std::size_t from = 0; from < text.size() && errors_ < max_errors;) {
      auto end = text.find('\n', from);
      const bool last = end == std::string_view::npos;
      if (last) end = text.size();
      ++line;
      read_line(text.substr(from, end - from), line, last);
      from = end + 1;
    }
    if (errors_ >= max_errors)
      diags_.error(name_, -1, "more than " + std::to_string(max_errors) + " errors; stopped reading at line " +
                                  std::to_string(line));
    training_curves out;
    out.runs = std::move(runs_);
    for (auto& [step, s] : steps_) out.steps.push_back(s.value);
    for (auto& [epoch, e] : epochs_) out.epochs.push_back(e.value);
    out.superseded = superseded_;
    return out;
  }

 private:
  template <typename T>
  struct at_line {
    T value;
    std::int64_t line;
  };

  void error(std::int64_t line, std::string message) {
    ++errors_;
    diags_.items.push_back({severity::error, name_, -1, std::move(message), line});
  }
  void warning(std::int64_t line, std::string message) {
    diags_.items.push_back({severity::warning, name_, -1, std::move(message), line});
  }

  void read_line(std::string_view text, std::int64_t line, bool last) {
    if (!text.empty() && text.back() == '\r') text.remove_suffix(1);
    if (text.find_first_not_of(" \t") == std::string_view::npos) return;  // blank: nothing to read
    if (text.size() > max_metrics_line) {
      error(line, "longer than " + std::to_string(max_metrics_line) + " bytes (" + std::to_string(text.size()) +
                      "); a metrics line is a few hundred");
      return;
    }
    json j;
    try {
      j = parse(text);
    } catch (const refused& r) {
      error(line, r.what);
      return;
    } catch (const json::out_of_range& e) {  // the lexer's "number overflow" (1e400)
      error(line, "a number too large for a double: " + clipped(plain(e.what()), 120));
      return;
    } catch (const json::parse_error& e) {
      if (!torn(text, e, line, last, j)) {
        error(line, "not a JSON object: " + clipped(plain(e.what()), 160));
        return;
      }
      if (j.is_discarded()) return;
    } catch (const json::exception& e) {
      error(line, "not a JSON object: " + clipped(plain(e.what()), 160));
      return;
    }
    try {
      record(j, line);
    } catch (const refused& r) {
      error(line, r.what);
    }
  }

  static json parse(std::string_view text) {
    return json::parse(text.begin(), text.end(), [](int depth, json::parse_event_t ev, json&) {
      if ((ev == json::parse_event_t::object_start || ev == json::parse_event_t::array_start) &&
          depth >= max_metrics_depth)
        throw refused{"JSON nested deeper than " + std::to_string(max_metrics_depth) + " levels"};
      return true;
    });
  }

  // The start of a JSON object that ends too soon: the parser ran out of text (its error
  // is past the last byte), rather than meeting a character it refuses.
  static bool cut_short(std::string_view text, const json::parse_error& e) {
    return !text.empty() && text.front() == '{' && e.byte > text.size();
  }

  // A torn line: a write cut short (a full disk, a crash) and never finished. Either the
  // whole line is that fragment, or the next record was written straight after it (a
  // writer that went on appending): then the record is read (into `j`) and the fragment
  // skipped. Both are warnings: the other lines still draw. False: not torn, an error.
  bool torn(std::string_view text, const json::parse_error& e, std::int64_t line, bool last, json& j) {
    const std::string at_end = last ? " (the last line, with no newline)" : "";
    if (cut_short(text, e)) {
      warning(line, "a torn line of " + std::to_string(text.size()) +
                        " bytes, cut short while it was written (a full disk or a crash?), skipped" + at_end);
      j = json(json::value_t::discarded);
      return true;
    }
    // The trainer's lines open with this: the first whole record after the fragment.
    constexpr std::string_view opening = R"({"kind":)";
    for (auto k = text.find(opening, 1); k != std::string_view::npos; k = text.find(opening, k + 1)) {
      try {
        (void)parse(text.substr(0, k));
        return false;  // a whole object before it: not a fragment
      } catch (const json::parse_error& before) {
        if (!cut_short(text.substr(0, k), before)) return false;
      } catch (...) {  // refused, or a number out of range: no fragment of the trainer's
        return false;
      }
      try {
        j = parse(text.substr(k));
      } catch (...) {
        continue;  // an opening inside the fragment's strings: look further on
      }
      warning(line, "a torn line: its first " + std::to_string(k) +
                        " bytes were cut short while they were written (a full disk or a crash?) and the next "
                        "record was written after them; those bytes are skipped, the record is read" + at_end);
      return true;
    }
    return false;
  }

  static const json& field(const json& j, const char* key) {
    auto it = j.find(key);
    if (it == j.end()) throw refused{std::string("\"") + key + "\" is missing"};
    return *it;
  }
  static std::int64_t whole(const json& j, const char* key, std::int64_t lo, std::int64_t hi) {
    const auto& v = field(j, key);
    std::optional<std::int64_t> x;
    if (v.is_number_unsigned()) {
      if (v.get<std::uint64_t>() <= std::uint64_t(hi)) x = std::int64_t(v.get<std::uint64_t>());
    } else if (v.is_number_integer()) {
      x = v.get<std::int64_t>();
    }
    if (!x || *x < lo || *x > hi)
      throw refused{std::string("\"") + key + "\": " + clipped(v.dump(), 40) + " is not a whole number from " +
                    std::to_string(lo) + " to " + std::to_string(hi)};
    return *x;
  }
  // A finite number in [lo, hi]; null (written for nan and inf) reads as NaN when allowed.
  static double real(const json& j, const char* key, double lo, double hi, bool null_ok, bool required = true) {
    auto it = j.find(key);
    if (it == j.end()) {
      if (required) throw refused{std::string("\"") + key + "\" is missing"};
      return std::nan("");
    }
    if (it->is_null() && null_ok) return std::nan("");
    if (!it->is_number() || !(it->get<double>() >= lo && it->get<double>() <= hi)) {
      std::ostringstream range;
      range << "a number from " << lo << " to " << hi;
      if (hi == std::numeric_limits<double>::max()) range.str(lo == 0 ? "a finite number, 0 or more" : "a finite number");
      throw refused{std::string("\"") + key + "\": " + clipped(it->dump(), 40) + " is not " + range.str() +
                    (null_ok ? " (or null)" : "")};
    }
    return it->get<double>();
  }

  void record(const json& j, std::int64_t line) {
    if (!j.is_object()) throw refused{"not a JSON object: a metrics line is one object with a \"kind\""};
    const auto k = j.find("kind");
    if (k == j.end() || !k->is_string()) throw refused{"no \"kind\" string (\"run\", \"step\" or \"epoch\")"};
    const auto& kind = k->get_ref<const std::string&>();
    constexpr double any = std::numeric_limits<double>::max();
    if (kind == "step") {
      curves_step s;
      s.step = whole(j, "step", 0, max_count);
      s.epoch = whole(j, "epoch", 1, max_count);
      s.loss = real(j, "loss", -any, any, true);
      s.accuracy = real(j, "accuracy", 0, 1, true);
      s.lr = real(j, "lr", 0, any, true);
      s.samples_per_s = real(j, "samples_per_s", 0, any, true, false);
      keep(steps_, s.step, s, line, "step " + std::to_string(s.step));
    } else if (kind == "epoch") {
      curves_epoch e;
      e.epoch = whole(j, "epoch", 1, max_count);
      e.step = whole(j, "step", 0, max_count);
      e.train_loss = real(j, "train_loss", -any, any, true);
      e.train_accuracy = real(j, "train_accuracy", 0, 1, true);
      e.test_loss = real(j, "test_loss", -any, any, true);
      e.test_accuracy = real(j, "test_accuracy", 0, 1, true);
      e.seconds = real(j, "seconds", 0, any, true, false);
      if (auto it = j.find("interrupted"); it != j.end()) {
        if (!it->is_boolean()) throw refused{"\"interrupted\": " + clipped(it->dump(), 40) + " is not true or false"};
        e.interrupted = it->get<bool>();
      }
      keep(epochs_, e.epoch, e, line, "epoch " + std::to_string(e.epoch));
    } else if (kind == "run") {
      curves_run r;
      r.line = line;
      if (auto t = j.find("time"); t != j.end() && t->is_string()) r.time = clipped(t->get<std::string>(), 40);
      if (auto it = j.find("resume"); it != j.end()) {
        if (!it->is_object()) throw refused{"\"resume\" is not an object with \"step\" and \"epoch\""};
        r.resume_step = whole(*it, "step", 0, max_count);
        r.resume_epoch = whole(*it, "epoch", 1, max_count);
        // The resumed run replays these: what the earlier run wrote of them is superseded.
        superseded_ += drop_from(steps_, r.resume_step) + drop_from(epochs_, r.resume_epoch);
      }
      if (auto s = j.find("settings"); s != j.end() && s->is_object()) r.description = describe(*s);
      if (auto it = j.find("lr_find"); it != j.end() && it->is_object()) {
        r.lr_find = true;
        r.description += std::string(r.description.empty() ? "" : ", ") + "learning-rate range test";
      }
      runs_.push_back(std::move(r));
    } else {
      warning(line, "unknown kind " + clipped(k->dump(), 40) + ", skipped (this nerve-trace knows run, step and epoch)");
    }
  }

  // The later record of a step or an epoch wins. A resumed run's run line has dropped
  // the ones it replays, so a step seen twice otherwise is worth a word.
  template <typename T>
  void keep(std::map<std::int64_t, at_line<T>>& by, std::int64_t key, const T& value, std::int64_t line,
            const std::string& what) {
    auto it = by.find(key);
    if (it == by.end()) {
      by.emplace(key, at_line<T>{value, line});
      return;
    }
    ++superseded_;
    if (duplicate_warned_++ < 10)
      warning(line, what + " again (first on line " + std::to_string(it->second.line) +
                        ") with no resumed run between: this line replaces it");
    it->second = {value, line};
  }
  template <typename T>
  static std::size_t drop_from(std::map<std::int64_t, at_line<T>>& by, std::int64_t key) {
    const auto first = by.lower_bound(key);
    const auto n = std::size_t(std::distance(first, by.end()));
    by.erase(first, by.end());
    return n;
  }

  static std::string describe(const json& s) {
    std::string out;
    auto add = [&](const char* key, const std::string& prefix = "") {
      auto it = s.find(key);
      if (it == s.end() || it->is_null()) return;
      std::string v = it->is_string() ? it->get<std::string>() : it->dump();
      if (v.empty()) return;
      out += (out.empty() ? "" : ", ") + prefix + clipped(v, 40);
    };
    add("model");
    add("optimizer");
    add("lr", "lr ");
    add("momentum", "momentum ");
    add("schedule", "schedule ");
    add("batch", "batch ");
    add("device", "device ");
    add("seed", "seed ");
    return out;
  }

  std::string name_;
  diagnostics& diags_;
  std::size_t errors_ = 0, superseded_ = 0, duplicate_warned_ = 0;
  std::vector<curves_run> runs_;
  std::map<std::int64_t, at_line<curves_step>> steps_;
  std::map<std::int64_t, at_line<curves_epoch>> epochs_;
};

}  // namespace

training_curves read_metrics(std::istream& in, const std::string& name, diagnostics& diags) {
  std::string text;
  try {
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  } catch (const std::ios_base::failure& e) {
    diags.error(name, -1, std::string("cannot read the file: ") + e.what());
    return {};
  }
  if (in.bad()) {
    diags.error(name, -1, "cannot read the file: an I/O error");
    return {};
  }
  return metrics_reader(name, diags).read(text);
}

training_curves read_metrics_file(const std::filesystem::path& path, diagnostics& diags) {
  const auto name = path.string();
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (status.type() == std::filesystem::file_type::not_found) {
    diags.error(name, -1, "cannot open the file: no such file");
    return {};
  }
  if (status.type() == std::filesystem::file_type::directory) {
    diags.error(name, -1, "cannot read it: it is a directory, not a metrics file");
    return {};
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    diags.error(name, -1, std::string("cannot open the file: ") + std::strerror(errno));
    return {};
  }
  return read_metrics(in, name, diags);
}

}  // namespace nerve::trace

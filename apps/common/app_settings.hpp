#pragma once
/// \file
/// The settings an app keeps in its checkpoints beside the trainer's
/// (`train_options::app_settings`: nerve-pipeline's schedule, cut and replicas,
/// nerve-train's replicas), read back on `--resume` with the same care as the trainer's:
/// every refusal names the checkpoint and the field, a number out of the range its
/// command-line option takes is refused rather than wrapped, and text that is not JSON
/// says so in a line, not as a parser's exception. Header-only; each app includes it once.

#include <cstdint>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "layers/trainer.hpp"

namespace nerve::apps {

/// A checkpoint's app settings, as `resume_options` returned them. Any thread; a value.
class resumed_app_settings {
 public:
  /// Parses `resumed.app_settings` (empty: none, as a run of a program of its own writes).
  explicit resumed_app_settings(const layers::train_options& resumed) : resume_(resumed.resume.string()) {
    if (resumed.app_settings.empty()) return;
    try {
      settings_ = nlohmann::json::parse(resumed.app_settings);
    } catch (const nlohmann::json::exception&) {
      throw std::invalid_argument(where() + "setting 'app' is not JSON: " + resumed.app_settings);
    }
    if (!settings_.is_object()) throw std::invalid_argument(where() + "setting 'app' is " + settings_.dump() + ", not an object");
  }

  /// The app that wrote the checkpoint: its `app` field; before that field, nerve-pipeline
  /// when there is a schedule (`plan`) and nerve-train otherwise; empty for no app settings.
  std::string writer() const {
    if (settings_.is_null()) return {};
    if (settings_.contains("app")) return text("app");
    return settings_.contains("plan") ? "nerve-pipeline" : "nerve-train";
  }

  /// Refuses a checkpoint that `app` did not write, naming the app that did: another app's
  /// run would go on without what that app keeps (a pipeline's schedule, micro-batches
  /// and cut). `none_ok`: a checkpoint without app settings (a program of its own) is taken.
  void expect_writer(const std::string& app, bool none_ok) const {
    const auto by = writer();
    if (by == app || (by.empty() && none_ok)) return;
    if (by.empty())
      throw std::invalid_argument("--resume " + resume_ + ": not a checkpoint of " + app +
                                  ": it holds no app settings (a program of its own wrote it through layers::train)");
    throw std::invalid_argument("--resume " + resume_ + ": a checkpoint of " + by + ", not of " + app +
                                ": resume it with " + by + " (" + app + " would run without what " + by +
                                " keeps in it)");
  }

  bool contains(const char* field) const { return settings_.is_object() && settings_.contains(field); }

  /// The whole number `field`, in [lo, hi]; `fallback` when absent (negative: required).
  std::uint32_t whole(const char* field, std::int64_t lo, std::int64_t hi, std::int64_t fallback = -1) const {
    if (!contains(field)) {
      if (fallback >= 0) return std::uint32_t(fallback);
      throw std::invalid_argument(where() + "app settings have no '" + field + "'");
    }
    const auto& v = settings_.at(field);
    const bool ok = v.is_number_integer() &&
                       (v.is_number_unsigned() ? v.get<std::uint64_t>() <= std::uint64_t(hi) && v.get<std::uint64_t>() >= std::uint64_t(lo)
                                               : v.get<std::int64_t>() >= lo && v.get<std::int64_t>() <= hi);
    if (!ok)
      throw std::invalid_argument(where() + "setting '" + field + "' is " + v.dump() + ", not a whole number from " +
                                  std::to_string(lo) + " to " + std::to_string(hi));
    return std::uint32_t(v.get<std::int64_t>());
  }

  /// The text `field` (required).
  std::string text(const char* field) const {
    if (!contains(field)) throw std::invalid_argument(where() + "app settings have no '" + field + "'");
    const auto& v = settings_.at(field);
    if (!v.is_string()) throw std::invalid_argument(where() + "setting '" + field + "' is " + v.dump() + ", not text");
    return v.get<std::string>();
  }

  /// `--resume FILE: the checkpoint's `: how every refusal about it begins.
  std::string where() const { return "--resume " + resume_ + ": the checkpoint's "; }

 private:
  std::string resume_;
  nlohmann::json settings_;
};

}  // namespace nerve::apps

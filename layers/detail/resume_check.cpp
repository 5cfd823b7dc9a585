#include "layers/detail/resume_check.hpp"

#include <climits>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

namespace nerve::layers::detail {

namespace {

constexpr std::int64_t int64_max = std::numeric_limits<std::int64_t>::max();
constexpr std::uint64_t uint64_max = std::numeric_limits<std::uint64_t>::max();

[[noreturn]] void refuse(const std::string& resume, std::string_view part, std::string_view field,
                         const std::string& what) {
  throw std::invalid_argument("--resume " + resume + ": the checkpoint's " + std::string(part) + " '" +
                              std::string(field) + "' " + what);
}

/// The value as a reader writes it (JSON: -1, 1e+300, "text", null).
std::string shown(const nlohmann::json& v) { return v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

std::string bound(std::uint64_t v) { return v == uint64_max ? "2^64-1" : v == std::uint64_t(int64_max) ? "2^63-1" : std::to_string(v); }

/// Whether `v` is a whole number in [lo, hi], as JSON holds it: a negative number is a
/// signed integer, a fraction or an exponent a float, neither of which converts exactly.
bool whole_in(const nlohmann::json& v, std::int64_t lo, std::uint64_t hi) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    return u <= hi && (lo <= 0 || u >= std::uint64_t(lo));
  }
  if (v.is_number_integer()) {
    const auto i = v.get<std::int64_t>();
    return i >= lo && (i < 0 || std::uint64_t(i) <= hi);
  }
  return false;
}

void check_whole(const nlohmann::json& object, std::string_view part, const char* field, std::int64_t lo,
                 std::uint64_t hi, const std::string& resume) {
  if (!object.contains(field)) return;  // a missing field: the conversion names it
  const auto& v = object.at(field);
  if (!whole_in(v, lo, hi))
    refuse(resume, part, field,
           "is " + shown(v) + ", not a whole number from " + std::to_string(lo) + " to " + bound(hi));
}

}  // namespace

void check_settings_json(const nlohmann::json& s, const std::string& resume) {
  if (!s.is_object()) throw std::invalid_argument("--resume " + resume + ": the checkpoint's settings are " + shown(s) + ", not an object");
  constexpr std::string_view part = "setting";
  // The ranges the command line takes (apps/common/options.hpp reads each option as its
  // type), so that `check_options` then sees the number the checkpoint holds.
  check_whole(s, part, "epochs", INT_MIN, INT_MAX, resume);
  check_whole(s, part, "steps", -1, int64_max, resume);
  check_whole(s, part, "batch", 0, int64_max, resume);
  check_whole(s, part, "micro_batches", 0, uint64_max, resume);
  check_whole(s, part, "threads", 0, UINT_MAX, resume);
  check_whole(s, part, "seed", 0, uint64_max, resume);
  check_whole(s, part, "checkpoint_every", 0, int64_max, resume);
  for (const char* field : {"lr", "momentum", "weight_decay", "beta2"})
    if (s.contains(field) && !s.at(field).is_number()) refuse(resume, part, field, "is " + shown(s.at(field)) + ", not a number");
  for (const char* field : {"nesterov", "spread", "shuffle", "evaluate", "trace_exact", "allow_nonfinite"})
    if (s.contains(field) && !s.at(field).is_boolean()) refuse(resume, part, field, "is " + shown(s.at(field)) + ", not true or false");
  for (const char* field : {"model", "optimizer", "schedule", "device", "data", "app"})
    if (s.contains(field) && !s.at(field).is_string()) refuse(resume, part, field, "is " + shown(s.at(field)) + ", not text");
  if (s.contains("normalize")) {
    const auto& n = s.at("normalize");
    if (!n.is_array() || n.size() != 2 || !n[0].is_number() || !n[1].is_number())
      refuse(resume, part, "normalize", "is " + shown(n) + ", not two numbers [mean, std]");
  }
  for (const char* field : {"train_data", "test_data"}) {
    if (!s.contains(field)) continue;
    const auto& f = s.at(field);
    if (!f.is_array() || f.size() != 2 || !f[0].is_string() || !f[1].is_string())
      refuse(resume, part, field, "is " + shown(f) + ", not two file names [inputs, labels]");
  }
  if (s.contains("augment") && !s.at("augment").is_string())
    refuse(resume, part, "augment", "is " + shown(s.at("augment")) + ", not text");
}

void check_restored_settings(const train_options& restored, const std::string& resume) {
  auto o = restored;
  o.lead = false;  // the outputs are the app's to check, once given
  try {
    check_options(o);
  } catch (const std::invalid_argument& e) {
    // `check_options` names the command-line flag; the checkpoint names the field.
    static constexpr std::pair<std::string_view, std::string_view> fields[] = {
        {"--epochs", "epochs"},       {"--steps", "steps"},         {"--batch", "batch"},
        {"--microbatches", "micro_batches"}, {"--lr", "lr"},        {"--momentum", "momentum"},
        {"--weight-decay", "weight_decay"},  {"--optimizer", "optimizer"}, {"--nesterov", "nesterov"},
        {"--schedule", "schedule"},   {"--normalize", "normalize"}, {"--threads", "threads"}};
    const std::string_view what = e.what();
    std::size_t first = std::string_view::npos;
    std::string_view field = "settings";
    for (const auto& [flag, name] : fields) {
      const auto at = what.find(flag);
      const auto after = at == std::string_view::npos ? at : at + flag.size();
      if (at == std::string_view::npos || (after < what.size() && what[after] != ' ' && what[after] != '\'')) continue;
      if (at < first) first = at, field = name;
    }
    refuse(resume, "setting", field, "is refused: " + std::string(what));
  }
}

void check_state_json(const nlohmann::json& state, const std::string& resume) {
  if (!state.contains("position") || !state.at("position").is_object()) return;  // the conversion names it
  const auto& p = state.at("position");
  constexpr std::string_view part = "position";
  check_whole(p, part, "step", 0, int64_max, resume);
  check_whole(p, part, "epoch", 0, INT_MAX, resume);
  check_whole(p, part, "batch", 0, int64_max, resume);
  for (const char* field : {"correct", "seen", "epoch_steps"}) check_whole(p, part, field, 0, int64_max, resume);
  if (p.contains("loss_sum") && !p.at("loss_sum").is_number())
    refuse(resume, part, "loss_sum", "is " + shown(p.at("loss_sum")) + ", not a number");
  if (state.contains("epochs")) {
    const auto& done = state.at("epochs");
    if (!done.is_array()) refuse(resume, "record", "epochs", "is " + shown(done) + ", not an array");
    for (const auto& e : done) {
      if (!e.is_object()) refuse(resume, "record", "epochs", "holds " + shown(e) + ", not an epoch");
      check_whole(e, "epoch record", "steps", 0, int64_max, resume);
      check_whole(e, "epoch record", "epoch", 1, INT_MAX, resume);
    }
  }
  if (state.contains("optimizer_counters")) {
    const auto& counters = state.at("optimizer_counters");
    if (!counters.is_object()) refuse(resume, "record", "optimizer_counters", "is " + shown(counters) + ", not an object");
    for (const auto& [name, v] : counters.items())
      if (!whole_in(v, 0, int64_max))
        refuse(resume, "optimizer counter", name, "is " + shown(v) + ", not a whole number from 0 to 2^63-1");
  }
}

void check_resumed_position(const resumed_position& at, const std::map<std::string, std::int64_t, std::less<>>& counters,
                            const train_options& o, const run_extent& extent) {
  const std::string resume = o.resume.string();
  constexpr std::string_view part = "position";
  auto n = [](auto v) { return std::to_string(v); };
  if (at.epoch > o.epochs)
    refuse(resume, part, "epoch", "is " + n(at.epoch) + ", past the run's " + n(o.epochs) + " epochs");
  if (at.epochs_done != std::size_t(at.epoch))
    refuse(resume, part, "epoch", "is " + n(at.epoch) + " but the checkpoint records " + n(at.epochs_done) +
                                      " finished epochs before it");
  if (at.batch > extent.batches_per_epoch)
    refuse(resume, part, "batch", "is " + n(at.batch) + ", past the " + n(extent.batches_per_epoch) +
                                      " batches of an epoch of this data at batch " + n(o.batch));
  if (at.epoch_steps > std::int64_t(at.batch))
    refuse(resume, part, "epoch_steps", "is " + n(at.epoch_steps) + ", more steps than the " + n(at.batch) +
                                            " batches of the epoch taken so far");
  // Both are 0 or more (check_state_json): their sum overflows only past every real count.
  const std::int64_t counted =
      at.epoch_steps > int64_max - at.steps_done ? int64_max : at.steps_done + at.epoch_steps;
  if (at.step != counted)
    refuse(resume, part, "step", "is " + n(at.step) + " but the finished epochs' " + n(at.steps_done) +
                                     " steps and this epoch's " + n(at.epoch_steps) + " make " + n(counted));
  if (at.step > extent.total_steps)
    refuse(resume, part, "step", "is " + n(at.step) + ", past the run's " + n(extent.total_steps) + " steps");
  // Rows seen this epoch: at most every row of the batches taken.
  if (static_cast<long double>(at.seen) > static_cast<long double>(at.batch) * static_cast<long double>(o.batch))
    refuse(resume, part, "seen", "is " + n(at.seen) + ", more samples than the " + n(at.batch) + " batches of " +
                                     n(o.batch) + " taken this epoch hold");
  if (at.correct > at.seen)
    refuse(resume, part, "correct", "is " + n(at.correct) + ", more than the " + n(at.seen) + " samples seen");
  if (!(std::isfinite(at.loss_sum) && at.loss_sum >= 0) && !o.allow_nonfinite)
    refuse(resume, part, "loss_sum", "is " + std::to_string(at.loss_sum) + ", not a finite sum of losses (0 or more)");
  for (const auto& [name, v] : counters)
    if (v < 0 || v > at.step)
      refuse(resume, "optimizer counter", name, "is " + n(v) + ", not between 0 and the position's step " + n(at.step));
}

}  // namespace nerve::layers::detail

#include "apps/trace/curves.hpp"
#include "apps/trace/html_page.hpp"

#include <nlohmann/json.hpp>

#include <string>

namespace nerve::trace {
namespace {


// JSON safe inside <script>: "</" would end the element. NaN and Inf become null.
std::string script_json(const nlohmann::json& j) {
  const auto text = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    out += text[i];
    if (text[i] == '<' && i + 1 < text.size() && text[i + 1] == '/') out += '\\';
  }
  return out;
}


}  // namespace

curves_stats write_curves_page(const training_curves& c, const std::string& title, std::ostream& out) {
  nlohmann::json steps = {{"step", nlohmann::json::array()},     {"epoch", nlohmann::json::array()},
                          {"loss", nlohmann::json::array()},     {"accuracy", nlohmann::json::array()},
                          {"lr", nlohmann::json::array()},       {"samples_per_s", nlohmann::json::array()}};
  for (const auto& s : c.steps) {
    steps["step"].push_back(s.step);
    steps["epoch"].push_back(s.epoch);
    steps["loss"].push_back(s.loss);  // NaN is dumped as null
    steps["accuracy"].push_back(s.accuracy);
    steps["lr"].push_back(s.lr);
    steps["samples_per_s"].push_back(s.samples_per_s);
  }
  nlohmann::json epochs = {{"epoch", nlohmann::json::array()},          {"step", nlohmann::json::array()},
                           {"train_loss", nlohmann::json::array()},     {"train_accuracy", nlohmann::json::array()},
                           {"test_loss", nlohmann::json::array()},      {"test_accuracy", nlohmann::json::array()},
                           {"seconds", nlohmann::json::array()},        {"interrupted", nlohmann::json::array()}};
  for (const auto& e : c.epochs) {
    epochs["epoch"].push_back(e.epoch);
    epochs["step"].push_back(e.step);
    epochs["train_loss"].push_back(e.train_loss);
    epochs["train_accuracy"].push_back(e.train_accuracy);
    epochs["test_loss"].push_back(e.test_loss);
    epochs["test_accuracy"].push_back(e.test_accuracy);
    epochs["seconds"].push_back(e.seconds);
    epochs["interrupted"].push_back(e.interrupted);
  }
  nlohmann::json runs = nlohmann::json::array();
  for (const auto& r : c.runs)
    runs.push_back({{"line", r.line}, {"time", r.time}, {"description", r.description}, {"resume_step", r.resume_step},
                    {"lr_find", r.lr_find}});
  const nlohmann::json data = {
      {"title", title}, {"runs", runs}, {"steps", steps}, {"epochs", epochs}, {"superseded", c.superseded}};

  std::string page(detail::curves_page());
  detail::replace_all(page, "NERVE_CURVES_TITLE", detail::html_text(title));
  detail::replace_all(page, "/*NERVE_CURVES_DATA*/", script_json(data));
  out << page;
  return {c.steps.size(), c.epochs.size(), c.runs.size(), page.size()};
}

}  // namespace nerve::trace

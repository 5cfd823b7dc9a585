#include "layers/inference.hpp"
#include "layers/train_data.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/runtime.hpp"
#include "layers/checkpoint/atomic_file.hpp"
#include "layers/gemm.hpp"

namespace nerve::layers {

namespace {

/// Rows `[first, first + rows)` of `set` as a batch of samples of shape `sample`.
tensor batch_of(const data::dataset& set, std::size_t first, std::size_t rows, const shape& sample) {
  auto v = set.rows(first, rows);
  tensor x(static_cast<std::int64_t>(rows), sample);
  std::copy(v.begin(), v.end(), x.data());
  return x;
}

/// The first largest output: the class the loss counts as predicted (layers/loss.cpp).
std::size_t argmax(std::span<const float> z) {
  std::size_t best = 0;
  for (std::size_t j = 1; j < z.size(); ++j)
    if (z[j] > z[best]) best = j;
  return best;
}

}  // namespace

std::future<tensor> train_engine::predict(tensor) {
  throw std::invalid_argument("this engine cannot predict (no train_engine::predict)");
}

std::vector<std::int64_t> class_counts::samples() const {
  std::vector<std::int64_t> n;
  for (const auto& row : confusion) {
    std::int64_t s = 0;
    for (auto c : row) s += c;
    n.push_back(s);
  }
  return n;
}

std::vector<double> class_counts::accuracy() const {
  std::vector<double> a;
  const auto n = samples();
  for (std::size_t t = 0; t < confusion.size(); ++t)
    a.push_back(n[t] > 0 && t < confusion[t].size() ? double(confusion[t][t]) / double(n[t]) : 0.0);
  return a;
}

test_figures evaluate_set(train_engine& engine, const data::dataset& set, const shape& sample) {
  test_figures f;
  double loss_sum = 0;
  for (std::size_t first = 0; first < set.size(); first += evaluation_rows) {
    const auto rows = std::min(evaluation_rows, set.size() - first);
    const std::size_t per = set.labels_per_sample;
    targets y;
    y.labels.assign(set.labels.begin() + std::ptrdiff_t(first * per),
                    set.labels.begin() + std::ptrdiff_t((first + rows) * per));
    y.labels_per_sample = std::int64_t(per);
    auto r = engine.evaluate(batch_of(set, first, rows, sample), std::move(y)).get();
    loss_sum += r.loss * double(r.samples);
    f.correct += r.correct;
  }
  f.samples = std::int64_t(set.size());
  f.loss = loss_sum / double(set.size());
  f.accuracy = double(f.correct) / double(set.labels.size());  // a label per sample, or per token
  return f;
}

void predict_set(train_engine& engine, const data::dataset& set, const shape& sample,
                 const std::function<void(std::size_t, std::span<const float>)>& row) {
  for (std::size_t first = 0; first < set.size(); first += evaluation_rows) {
    const auto rows = std::min(evaluation_rows, set.size() - first);
    const auto out = engine.predict(batch_of(set, first, rows, sample)).get();
    if (out.batch() != std::int64_t(rows))
      throw std::runtime_error("predict: " + std::to_string(out.batch()) + " outputs for a batch of " +
                               std::to_string(rows) + " samples");
    for (std::size_t i = 0; i < rows; ++i)
      row(first + i, std::span<const float>(out.row(std::int64_t(i)), std::size_t(out.features())));
  }
}

class_counts count_classes(train_engine& engine, const data::dataset& set, const shape& sample) {
  if (set.labels_per_sample != 1)
    throw std::invalid_argument("class figures count a class per sample, but this data has " +
                                std::to_string(set.labels_per_sample) + " labels per sample (a token's each)");
  class_counts c;
  c.confusion.assign(set.classes, std::vector<std::int64_t>(set.classes, 0));
  predict_set(engine, set, sample, [&](std::size_t i, std::span<const float> z) {
    const auto p = argmax(z);
    const auto t = std::size_t(set.labels[i]);
    if (p >= set.classes)
      throw std::runtime_error("predict: the network's output has " + std::to_string(z.size()) + " values but the " +
                               "data has " + std::to_string(set.classes) + " classes");
    ++c.confusion[t][p];
  });
  return c;
}

evaluation_report evaluate(graph& g, const train_options& o, const std::filesystem::path& predictions,
                           engine_factory make_engine) {
  if (o.init.empty())
    throw std::invalid_argument("--evaluate needs --init FILE: the weights to evaluate (a --save file, or a --checkpoint)");
  check_options(o);
  if (!predictions.empty() && o.lead) {
    try {  // before the work, not after
      checkpoint::replace_target(predictions);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument("--predict " + std::string(e.what()));
    }
    std::error_code ec;
    const auto same = [&](const std::filesystem::path& other) {
      return !other.empty() && std::filesystem::weakly_canonical(predictions, ec) == std::filesystem::weakly_canonical(other, ec);
    };
    if (same(o.init) || same(o.trace))
      throw std::invalid_argument("--predict '" + predictions.string() + "' is the file --" +
                                  (same(o.init) ? "init" : "trace") + " names: give each its own file");
  }
  if (!make_engine) make_engine = engine_for(o.device);
  load_weights(g, o.init, o.allow_nonfinite);
  const auto test_ptr = run_test_set(o, output_classes(g));
  const data::dataset& test_set = *test_ptr;
  const shape sample = g.nodes()[g.inputs()[0]].output_shape;
  if (static_cast<std::size_t>(sample.numel()) != test_set.features())
    throw std::invalid_argument("model '" + o.model + "' takes samples of " + sample.to_string() + " but the data has " +
                                std::to_string(test_set.features()) + " features");

  set_gemm_threads(static_cast<int>(o.threads));
  actors::runtime rt({.loops = o.threads,
                      .record = !o.trace.empty(),
                      .record_timing = o.trace_exact ? actors::recorder::timing::exact : actors::recorder::timing::shared});
  auto engine = make_engine(rt, g, o);
  evaluation_report report;
  report.parameters = g.parameter_count();
  report.test = evaluate_set(*engine, test_set, sample);

  // One pass of predictions gives both the class counts and the CSV.
  std::string csv;
  if (!predictions.empty()) {
    csv = "index,predicted";
    for (std::size_t k = 0; k < test_set.classes; ++k) csv += ",p" + std::to_string(k);
    csv += "\n";
  }
  report.classes.confusion.assign(test_set.classes, std::vector<std::int64_t>(test_set.classes, 0));
  std::vector<double> p;
  predict_set(*engine, test_set, sample, [&](std::size_t i, std::span<const float> z) {
    const auto best = argmax(z);
    if (best >= test_set.classes)
      throw std::runtime_error("predict: the network's output has " + std::to_string(z.size()) + " values but the " +
                               "data has " + std::to_string(test_set.classes) + " classes");
    ++report.classes.confusion[std::size_t(test_set.labels[i])][best];
    if (predictions.empty()) return;
    // The softmax in double, shifted by the largest output so no exp overflows.
    p.assign(z.size(), 0.0);
    double sum = 0;
    for (std::size_t j = 0; j < z.size(); ++j) sum += (p[j] = std::exp(double(z[j]) - double(z[best])));
    char b[40];
    csv += std::to_string(i) + "," + std::to_string(best);
    for (double v : p) {
      std::snprintf(b, sizeof b, ",%.9g", v / sum);
      csv += b;
    }
    csv += "\n";
  });
  engine->finish();
  rt.synchronize();
  if (!o.trace.empty()) {
    nlohmann::json extra = {{"model", o.model}, {"device", o.device}, {"evaluation_only", true}};
    engine->trace_metadata(extra);
    if (!engine->write_trace(rt, o.trace.string(), extra) && o.lead) rt.write_trace(o.trace.string(), extra);
  }
  if (!predictions.empty() && o.lead) {
    checkpoint::atomic_file out(predictions);
    out.write(std::as_bytes(std::span(csv)));
    out.commit();
  }
  return report;
}

}  // namespace nerve::layers

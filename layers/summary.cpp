#include "layers/summary.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <stdexcept>

namespace nerve::layers {

namespace {

/// Each node's stash bytes after a training-mode forward of `rows` rows of zeros.
std::vector<std::int64_t> stash_bytes_at(graph& g, std::int64_t rows) {
  const auto& nodes = g.nodes();
  std::vector<tensor> outputs(nodes.size());
  std::vector<std::int64_t> bytes(nodes.size(), 0);
  for (std::size_t i : g.order()) {
    const auto& n = nodes[i];
    if (n.is_input()) {
      outputs[i] = tensor::zeros(rows, n.output_shape);
      continue;
    }
    std::vector<tensor> inputs;
    for (std::size_t p : n.inputs) inputs.push_back(outputs[p].clone());
    auto r = n.layer->forward(std::move(inputs), forward_context{});
    bytes[i] = std::int64_t(r.stash.payload_bytes());
    outputs[i] = std::move(r.output);
  }
  return bytes;
}

/// `bytes` as a reader takes it in: 512 B, 1.5 KiB, 3.2 MiB, 1.1 GiB.
std::string readable_bytes(std::int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  char b[32];
  if (u == 0) std::snprintf(b, sizeof b, "%lld B", static_cast<long long>(bytes));
  else std::snprintf(b, sizeof b, "%.1f %s", v, units[u]);
  return b;
}

/// `n` with thousands separated: 1,234,567.
std::string grouped(std::int64_t n) {
  auto s = std::to_string(n < 0 ? -n : n);
  for (int i = int(s.size()) - 3; i > 0; i -= 3) s.insert(std::size_t(i), ",");
  return (n < 0 ? "-" : "") + s;
}

}  // namespace

model_summary summary(graph& g, const summary_options& options) {
  if (options.micro_batch < 1)
    throw std::invalid_argument("summary: the micro-batch must have at least 1 row (got " +
                                std::to_string(options.micro_batch) + ")");
  // Forward in training mode moves BatchNorm's running statistics: keep them, and each
  // layer's mode, to put back.
  std::vector<std::vector<float>> kept;
  for (auto& b : g.buffers()) kept.emplace_back(b.value->data(), b.value->data() + b.value->size());
  std::vector<bool> mode;
  for (auto& n : g.nodes()) mode.push_back(n.layer && n.layer->training());
  g.set_training(true);
  // Two rows and three: BatchNorm, as PyTorch's, refuses one row in training.
  std::vector<std::int64_t> two, three;
  try {
    two = stash_bytes_at(g, 2);
    three = stash_bytes_at(g, 3);
  } catch (...) {
    auto buffers = g.buffers();
    for (std::size_t k = 0; k < buffers.size(); ++k) std::copy(kept[k].begin(), kept[k].end(), buffers[k].value->data());
    throw;
  }
  auto buffers = g.buffers();
  for (std::size_t k = 0; k < buffers.size(); ++k) std::copy(kept[k].begin(), kept[k].end(), buffers[k].value->data());
  for (std::size_t i = 0; i < g.nodes().size(); ++i)
    if (g.nodes()[i].layer) g.nodes()[i].layer->set_training(mode[i]);

  model_summary s;
  s.micro_batch = options.micro_batch;
  for (std::size_t i : g.order()) {
    auto& n = g.nodes()[i];
    node_summary row;
    row.name = n.name;
    row.kind = n.layer ? std::string(n.layer->kind()) : std::string("Input");
    row.output = n.output_shape;
    if (n.layer && !g.is_tied_copy(i))  // a tied copy's weight is its owner's, counted there
      for (auto& p : n.layer->parameters()) row.parameters += p.value->size();
    row.stash_bytes = two[i] + (three[i] - two[i]) * (options.micro_batch - 2);
    row.place = n.layer && i < options.places.size() && !options.places[i].empty() ? options.places[i] : "-";
    s.parameters += row.parameters;
    s.stash_bytes += row.stash_bytes;
    s.nodes.push_back(std::move(row));
  }
  return s;
}

std::vector<std::string> places_on_loops(const graph& g, unsigned loops, bool spread, const std::string& device) {
  std::vector<std::string> places(g.nodes().size());
  unsigned next = 0;  // as `network` places its layer actors
  for (std::size_t i : g.order()) {
    if (g.nodes()[i].is_input()) continue;
    const unsigned loop = spread && loops > 0 ? next++ % loops : 0;
    places[i] = "loop " + std::to_string(loop) + (device == "cpu" || device.empty() ? "" : " on " + device);
  }
  return places;
}

std::string totals_line(const model_summary& s) {
  return grouped(s.parameters) + " parameters (" + readable_bytes(s.parameter_bytes()) + "), stash " +
         readable_bytes(s.stash_bytes) + " per micro-batch of " + std::to_string(s.micro_batch);
}

std::string to_text(const model_summary& s) {
  const std::string stash_head = "stash/micro-batch of " + std::to_string(s.micro_batch);
  std::vector<std::array<std::string, 6>> rows;
  rows.push_back({"node", "kind", "output", "parameters", stash_head, "runs on"});
  for (const auto& n : s.nodes)
    rows.push_back({n.name, n.kind, n.output.to_string(), n.kind == "Input" ? "-" : grouped(n.parameters),
                    n.kind == "Input" ? "-" : readable_bytes(n.stash_bytes), n.place});
  rows.push_back({"total", "", "", grouped(s.parameters), readable_bytes(s.stash_bytes), ""});
  std::array<std::size_t, 6> width{};
  for (const auto& r : rows)
    for (std::size_t c = 0; c < 6; ++c) width[c] = std::max(width[c], r[c].size());
  std::string out;
  for (const auto& r : rows) {
    std::string line;
    for (std::size_t c = 0; c < 6; ++c) {
      const bool right = c == 3 || c == 4;  // numbers
      const std::string pad(width[c] - r[c].size(), ' ');
      line += (c ? "  " : "") + (right ? pad + r[c] : r[c] + (c + 1 < 6 ? pad : ""));
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  out += "parameters " + grouped(s.parameters) + " (" + readable_bytes(s.parameter_bytes()) + "); stash per micro-batch of " +
         std::to_string(s.micro_batch) + " rows " + readable_bytes(s.stash_bytes) + " (" + std::to_string(s.stash_bytes) +
         " bytes)\n";
  return out;
}

}  // namespace nerve::layers

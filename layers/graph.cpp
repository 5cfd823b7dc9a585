#include "layers/graph.hpp"

#include <algorithm>
#include <random>
#include <set>

namespace nerve::layers {

// ---- graph -------------------------------------------------------------------

template <class Scalar>
std::size_t basic_graph<Scalar>::index_of(std::string_view name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) throw wiring_error("graph: no node named '" + std::string(name) + "'");
  return it->second;
}

namespace {
/// `list(layer)` for every layer node, each entry's name prefixed with its node's (`fc1.weight`).
template <class Node, class List>
auto prefixed(std::vector<Node>& nodes, List list) {
  decltype(list(*nodes.front().layer)) all;
  for (auto& n : nodes) {
    if (!n.layer) continue;
    for (auto& r : list(*n.layer)) {
      r.name = n.name + "." + r.name;
      all.push_back(std::move(r));
    }
  }
  return all;
}
}  // namespace

template <class Scalar>
auto basic_graph<Scalar>::parameters() -> std::vector<parameter_ref> {
  auto all = prefixed(nodes_, [](auto& l) { return l.parameters(); });
  if (ties_.empty()) return all;
  std::erase_if(all, [&](const parameter_ref& p) {
    return std::any_of(ties_.begin(), ties_.end(), [&](const tie& t) {
      const auto& n = nodes_[t.copy].name;
      return p.name.size() > n.size() && p.name.compare(0, n.size(), n) == 0 && p.name[n.size()] == '.';
    });
  });
  return all;
}

template <class Scalar>
bool basic_graph<Scalar>::is_tied_copy(std::size_t i) const noexcept {
  return std::any_of(ties_.begin(), ties_.end(), [&](const tie& t) { return t.copy == i; });
}

template <class Scalar>
void basic_graph<Scalar>::copy_tied() {
  for (const auto& t : ties_) {
    auto from = nodes_[t.owner].layer->parameters(), to = nodes_[t.copy].layer->parameters();
    for (std::size_t k = 0; k < from.size(); ++k)
      std::copy(from[k].value->data(), from[k].value->data() + from[k].value->size(), to[k].value->data());
  }
}

template <class Scalar>
void basic_graph<Scalar>::sum_tied_gradients() {
  for (const auto& t : ties_) {
    auto owner = nodes_[t.owner].layer->parameters(), copy = nodes_[t.copy].layer->parameters();
    for (std::size_t k = 0; k < owner.size(); ++k) {
      Scalar* g = owner[k].grad->data();
      const Scalar* c = copy[k].grad->data();
      for (std::int64_t e = 0; e < owner[k].grad->size(); ++e) g[e] += c[e];
    }
  }
}

template <class Scalar>
auto basic_graph<Scalar>::buffers() -> std::vector<buffer_ref> {
  return prefixed(nodes_, [](auto& l) { return l.buffers(); });
}

template <class Scalar>
std::int64_t basic_graph<Scalar>::parameter_count() {
  std::int64_t total = 0;
  for (auto& p : parameters()) total += p.value->size();
  return total;
}

template <class Scalar>
void basic_graph<Scalar>::zero_grad() {
  for (auto& n : nodes_)
    if (n.layer) n.layer->zero_grad();
}

template <class Scalar>
void basic_graph<Scalar>::set_training(bool training) {
  for (auto& n : nodes_)
    if (n.layer) n.layer->set_training(training);
}

template <class Scalar>
void basic_graph<Scalar>::register_forward_hook(std::string_view name, basic_forward_hook<Scalar> hook) {
  node(name).forward_hooks.push_back(std::move(hook));
}

template <class Scalar>
void basic_graph<Scalar>::register_backward_hook(std::string_view name, basic_backward_hook<Scalar> hook) {
  node(name).backward_hooks.push_back(std::move(hook));
}

template <class Scalar>
void basic_graph<Scalar>::clear_hooks() {
  for (auto& n : nodes_) {
    n.forward_hooks.clear();
    n.backward_hooks.clear();
  }
}

template <class Scalar>
std::string basic_graph<Scalar>::summary() {
  std::string s;
  for (std::size_t i : order_) {
    auto& n = nodes_[i];
    s += n.name + " (" + (n.layer ? std::string(n.layer->kind()) : std::string("Input")) + ")";
    if (!n.inputs.empty()) {
      s += " <- ";
      for (std::size_t k = 0; k < n.inputs.size(); ++k) s += (k ? ", " : "") + nodes_[n.inputs[k]].name;
    }
    s += " -> " + n.output_shape.to_string();
    if (n.layer) {
      std::int64_t count = 0;
      for (auto& p : n.layer->parameters()) count += p.value->size();
      if (count) s += ", " + std::to_string(count) + " parameters";
    }
    s += "\n";
  }
  return s;
}

// ---- builder -----------------------------------------------------------------

template <class Scalar>
basic_graph_builder<Scalar>& basic_graph_builder<Scalar>::input(std::string name, shape sample_shape) {
  pending_.push_back({std::move(name), nullptr, {}, std::move(sample_shape)});
  return *this;
}

template <class Scalar>
basic_graph_builder<Scalar>& basic_graph_builder<Scalar>::add(std::string name, std::unique_ptr<layer_type> layer_object,
                                                              std::vector<std::string> inputs) {
  if (!layer_object) throw wiring_error("graph: node '" + name + "' has no layer");
  pending_.push_back({std::move(name), std::move(layer_object), std::move(inputs), {}});
  return *this;
}

template <class Scalar>
basic_graph_builder<Scalar>& basic_graph_builder<Scalar>::output(std::string name) {
  output_ = std::move(name);
  return *this;
}

template <class Scalar>
basic_graph<Scalar> basic_graph_builder<Scalar>::build(std::uint64_t seed) {
  basic_graph<Scalar> g;
  auto& nodes = g.nodes_;
  // Names: unique and non-empty.
  for (std::size_t i = 0; i < pending_.size(); ++i) {
    auto& p = pending_[i];
    if (p.name.empty()) throw wiring_error("graph: node " + std::to_string(i) + " has an empty name");
    if (!g.by_name_.emplace(p.name, i).second) throw wiring_error("graph: two nodes are named '" + p.name + "'");
  }
  // Edges: every producer exists, every layer gets as many inputs as it takes.
  for (std::size_t i = 0; i < pending_.size(); ++i) {
    auto& p = pending_[i];
    basic_node<Scalar> n;
    n.name = p.name;
    n.layer = std::move(p.layer);
    if (n.layer) {
      n.layer->set_name(n.name);
      for (const auto& in : p.inputs) {
        auto it = g.by_name_.find(in);
        if (it == g.by_name_.end())
          throw wiring_error("graph: node '" + n.name + "' takes its input from '" + in + "', which does not exist");
        if (it->second == i) throw wiring_error("graph: node '" + n.name + "' takes its own output as input (a cycle)");
        n.inputs.push_back(it->second);
      }
      const std::size_t lo = n.layer->min_inputs(), hi = n.layer->max_inputs();
      if (n.inputs.size() < lo || n.inputs.size() > hi)
        throw wiring_error("graph: node '" + n.layer->label() + "' takes " +
                           (lo == hi ? std::to_string(lo) : "at least " + std::to_string(lo)) +
                           (lo == 1 && hi == 1 ? " input" : " inputs") + " but is wired to " +
                           std::to_string(n.inputs.size()) + (n.inputs.empty() ? " (unconnected input)" : ""));
    } else {
      n.output_shape = p.input_shape;
      if (p.input_shape.numel() <= 0)
        throw wiring_error("graph: input '" + n.name + "' has an empty shape " + p.input_shape.to_string());
      g.inputs_.push_back(i);
    }
    nodes.push_back(std::move(n));
  }
  pending_.clear();
  if (g.inputs_.empty()) throw wiring_error("graph: no input declared");
  for (std::size_t i = 0; i < nodes.size(); ++i)
    for (std::size_t p : nodes[i].inputs) nodes[p].consumers.push_back(i);

  // Topological order (Kahn), ties broken by insertion order so the order is stable.
  std::vector<std::size_t> indegree(nodes.size());
  for (std::size_t i = 0; i < nodes.size(); ++i) indegree[i] = nodes[i].inputs.size();
  std::set<std::size_t> ready;
  for (std::size_t i = 0; i < nodes.size(); ++i)
    if (indegree[i] == 0) ready.insert(i);
  while (!ready.empty()) {
    const std::size_t i = *ready.begin();
    ready.erase(ready.begin());
    g.order_.push_back(i);
    for (std::size_t c : nodes[i].consumers)
      if (--indegree[c] == 0) ready.insert(c);
  }
  if (g.order_.size() != nodes.size()) {
    std::string cycle;
    for (std::size_t i = 0; i < nodes.size(); ++i)
      if (indegree[i] > 0) cycle += (cycle.empty() ? "'" : ", '") + nodes[i].name + "'";
    throw wiring_error("graph: the wiring has a cycle through " + cycle);
  }

  // Output: named, or the one node nothing consumes. Every other node must be consumed.
  if (!output_.empty()) {
    auto it = g.by_name_.find(output_);
    if (it == g.by_name_.end()) throw wiring_error("graph: the output '" + output_ + "' is not a node");
    g.output_ = it->second;
  } else {
    std::vector<std::size_t> sinks;
    for (std::size_t i = 0; i < nodes.size(); ++i)
      if (nodes[i].consumers.empty()) sinks.push_back(i);
    if (sinks.size() != 1) {
      std::string names;
      for (auto s : sinks) names += (names.empty() ? "'" : ", '") + nodes[s].name + "'";
      throw wiring_error("graph: no output named and " + std::to_string(sinks.size()) +
                         " nodes have unused outputs (" + names + "); call output(name)");
    }
    g.output_ = sinks[0];
  }
  for (std::size_t i = 0; i < nodes.size(); ++i)
    if (i != g.output_ && nodes[i].consumers.empty())
      throw wiring_error(std::string("graph: the output of ") + (nodes[i].layer ? "node '" : "input '") +
                         nodes[i].name + "' is not connected to anything (the graph output is '" +
                         nodes[g.output_].name + "')");

  // Shapes, producers first: a mismatch names both nodes and both shapes.
  for (std::size_t i : g.order_) {
    auto& n = nodes[i];
    if (!n.layer) continue;
    std::vector<shape> in;
    for (std::size_t p : n.inputs) in.push_back(nodes[p].output_shape);
    try {
      n.output_shape = n.layer->output_shape(in);
    } catch (const shape_error& e) {
      if (n.inputs.size() > 1) {
        // A join cannot tell which input changed: the one it compares against may be the
        // culprit (a conv that lost its padding) and the one it blames the unchanged skip
        // connection. Name every producer with its shape and let the reader judge.
        std::string got;
        for (std::size_t k = 0; k < n.inputs.size(); ++k) {
          const auto& producer = nodes[n.inputs[k]];
          got += std::string(k == 0 ? "" : k + 1 == n.inputs.size() ? " and " : ", ") + "'" + producer.name + "' " +
                 producer.output_shape.to_string() + " (input " + std::to_string(k) + ")";
        }
        throw wiring_error("graph: shape mismatch at '" + n.layer->label() + "', whose inputs do not fit together: got " +
                           got + " (" + e.what() + ")");
      }
      const std::size_t k = std::min(e.input(), n.inputs.size() - 1);
      const auto& producer = nodes[n.inputs[k]];
      throw wiring_error("graph: shape mismatch between '" + producer.name + "' and '" + n.name + "': '" +
                         producer.name + "' outputs " + producer.output_shape.to_string() + " but '" +
                         n.layer->label() + "' expects " + e.expected() + " at input " + std::to_string(k) + " (" +
                         e.what() + ")");
    }
  }

  // Tied weights: the same parameter names and shapes on both sides.
  for (const auto& [copy, owner] : ties_) {
    auto index = [&](const std::string& name, const char* role) {
      auto it = g.by_name_.find(name);
      if (it == g.by_name_.end() || !nodes[it->second].layer)
        throw wiring_error("graph: tie: the " + std::string(role) + " '" + name + "' is not a layer node");
      return it->second;
    };
    const typename basic_graph<Scalar>::tie t{index(copy, "copy"), index(owner, "owner")};
    if (t.copy == t.owner) throw wiring_error("graph: tie: node '" + copy + "' is tied to itself");
    for (const auto& other : g.ties_)
      if (other.copy == t.copy || other.copy == t.owner || other.owner == t.copy)
        throw wiring_error("graph: tie: node '" + (other.copy == t.copy ? copy : other.copy == t.owner ? owner : copy) +
                           "' is in two ties (a copy is tied once, and an owner is no copy)");
    auto a = nodes[t.copy].layer->parameters(), b = nodes[t.owner].layer->parameters();
    auto describe = [](const auto& ps) {
      std::string d;
      for (const auto& p : ps) d += (d.empty() ? "" : ", ") + p.name + " " + shape(p.torch_shape).to_string();
      return d.empty() ? std::string("no parameters") : d;
    };
    const bool same = !a.empty() && a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](auto& x, auto& y) {
      return x.name == y.name && x.torch_shape == y.torch_shape;
    });
    if (!same)
      throw wiring_error("graph: tie: '" + copy + "' (" + describe(a) + ") cannot share the weights of '" + owner +
                         "' (" + describe(b) + "): the parameters must have the same names and shapes");
    g.ties_.push_back(t);
  }
  ties_.clear();

  // Parameters: one documented stream, insertion order; a tied copy then starts from its owner.
  std::mt19937_64 rng(seed);
  for (auto& n : nodes)
    if (n.layer) n.layer->reset_parameters(rng);
  g.copy_tied();
  output_.clear();
  return g;
}

template <class Scalar>
basic_graph_builder<Scalar>& basic_graph_builder<Scalar>::tie(std::string copy, std::string owner) {
  ties_.emplace_back(std::move(copy), std::move(owner));
  return *this;
}

template class basic_graph<float>;
template class basic_graph<double>;
template class basic_graph_builder<float>;
template class basic_graph_builder<double>;

}  // namespace nerve::layers

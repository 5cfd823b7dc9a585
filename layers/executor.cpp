#include "layers/executor.hpp"

#include "layers/detail/vector_state.hpp"
#include "layers/plan.hpp"

namespace nerve::layers {

template <class Scalar>
auto basic_direct_executor<Scalar>::run_forward(std::vector<tensor_type> inputs, const forward_context& context,
                                                std::vector<basic_stash<Scalar>>* keep) -> tensor_type {
  auto& nodes = graph_.nodes();
  const auto& graph_inputs = graph_.inputs();
  if (inputs.size() != graph_inputs.size())
    throw std::invalid_argument("executor: the graph has " + std::to_string(graph_inputs.size()) + " inputs, got " +
                                std::to_string(inputs.size()) + " tensors");
  std::vector<tensor_type> outputs(nodes.size());
  // Uses left of each output: the last consumer takes it by move, the others get clones.
  std::vector<std::size_t> uses(nodes.size());
  for (std::size_t i = 0; i < nodes.size(); ++i) uses[i] = nodes[i].consumers.size();
  for (std::size_t k = 0; k < graph_inputs.size(); ++k) {
    const auto& n = nodes[graph_inputs[k]];
    if (inputs[k].sample_shape() != n.output_shape)
      throw std::invalid_argument("executor: input '" + n.name + "' expects samples of " + n.output_shape.to_string() +
                                  ", got " + inputs[k].shape_string());
    outputs[graph_inputs[k]] = std::move(inputs[k]);
  }
  if (keep) keep->resize(nodes.size());
  // A forward that keeps stashes is training (its backward follows); predict keeps none.
  const bool training = keep != nullptr;
  for (std::size_t i : graph_.order()) {
    auto& n = nodes[i];
    if (!n.layer) continue;
    std::vector<tensor_type> in;
    in.reserve(n.inputs.size());
    for (std::size_t p : n.inputs) in.push_back(--uses[p] == 0 ? std::move(outputs[p]) : outputs[p].clone());
    detail::enter_user_code();  // the layer and its hooks may be a user's, built without AVX
    auto r = n.layer->forward(std::move(in), context);
    detail::enter_user_code();
    for (auto& hook : n.forward_hooks) hook(hook_context{n.name, context.micro_batch, context.step, training}, r.output);
    outputs[i] = std::move(r.output);
    if (keep) (*keep)[i] = std::move(r.stash);
  }
  return std::move(outputs[graph_.output()]);
}

template <class Scalar>
auto basic_direct_executor<Scalar>::forward(std::vector<tensor_type> inputs, const forward_context& context)
    -> tensor_type {
  if (stashes_.count(context.micro_batch))
    throw std::invalid_argument("executor: micro-batch " + std::to_string(context.micro_batch) + " is already in flight");
  std::vector<basic_stash<Scalar>> keep;
  auto out = run_forward(std::move(inputs), context, &keep);
  stashes_.emplace(context.micro_batch, kept_forward{std::move(keep), context.step});
  return out;
}

template <class Scalar>
auto basic_direct_executor<Scalar>::forward(tensor_type input, const forward_context& context) -> tensor_type {
  std::vector<tensor_type> v;
  v.push_back(std::move(input));
  return forward(std::move(v), context);
}

template <class Scalar>
auto basic_direct_executor<Scalar>::predict(tensor_type input) -> tensor_type {
  std::vector<tensor_type> v;
  v.push_back(std::move(input));
  return run_forward(std::move(v), {}, nullptr);
}

template <class Scalar>
void basic_direct_executor<Scalar>::backward(std::uint64_t micro_batch, const tensor_type& grad_output) {
  auto it = stashes_.find(micro_batch);
  if (it == stashes_.end())
    throw std::invalid_argument("executor: backward of micro-batch " + std::to_string(micro_batch) +
                                ", which has no forward in flight");
  std::vector<basic_stash<Scalar>> stashes = std::move(it->second.stashes);
  const std::uint64_t step = it->second.step;
  stashes_.erase(it);
  auto& nodes = graph_.nodes();
  const auto& order = graph_.order();
  std::vector<tensor_type> grads(nodes.size());
  const std::size_t out = graph_.output();
  if (grad_output.sample_shape() != nodes[out].output_shape)
    throw std::invalid_argument("executor: output gradient " + grad_output.shape_string() + " does not match output '" +
                                nodes[out].name + "' " + nodes[out].output_shape.to_string());
  const tensor_type* dy_out = &grad_output;  // the output's gradient is read in place, never copied
  for (auto rit = order.rbegin(); rit != order.rend(); ++rit) {
    const std::size_t i = *rit;
    auto& n = nodes[i];
    if (!n.layer) continue;
    const tensor_type& dy = i == out ? *dy_out : grads[i];
    if (i != out && dy.empty()) continue;  // nothing downstream needed it (cannot happen in a validated graph)
    input_mask wanted = 0;
    for (std::size_t k = 0; k < n.inputs.size(); ++k)
      if (!nodes[n.inputs[k]].is_input()) wanted |= input_mask{1} << k;
    detail::enter_user_code();
    auto g = n.layer->backward_input(stashes[i], dy, wanted);
    detail::enter_user_code();
    n.layer->backward_weight(stashes[i], dy);
    detail::enter_user_code();
    for (auto& hook : n.backward_hooks) hook(hook_context{n.name, micro_batch, step, true}, g, dy);
    stashes[i] = {};
    if (i != out) grads[i] = tensor_type();
    for (std::size_t k = 0; k < n.inputs.size(); ++k) {
      if (!(wanted & (input_mask{1} << k)) || g[k].empty()) continue;
      auto& acc = grads[n.inputs[k]];
      if (acc.empty())
        acc = std::move(g[k]);
      else
        acc += g[k];  // fan-out: sum over consumers
    }
  }
}

template <class Scalar>
step_result basic_direct_executor<Scalar>::train_step(tensor_type input, const basic_targets<Scalar>& target,
                                                      const basic_loss<Scalar>& criterion,
                                                      basic_optimizer<Scalar>& opt, std::size_t micro_batches,
                                                      std::uint64_t step) {
  const std::int64_t n = input.batch();
  const auto split = split_micro_batches(n, micro_batches);
  graph_.zero_grad();
  step_result result;
  result.samples = n;
  for (std::size_t m = 0; m < micro_batches; ++m) {
    const auto [first, count] = split[m];
    forward_context ctx{m, step};
    tensor_type out = micro_batches == 1 ? forward(std::move(input), ctx) : forward(input.slice(first, count), ctx);
    auto r = micro_batches == 1 ? criterion.forward(out, target) : criterion.forward(out, target.slice(first, count));
    const double share = double(count) / double(n);
    result.loss += share * r.loss;
    result.correct += r.correct;
    backward(m, criterion.backward(r.stash, Scalar(share)));
  }
  // A tied weight is one parameter: its copies' gradients join the owner's, whose update
  // the copies then take.
  graph_.sum_tied_gradients();
  auto params = graph_.parameters();
  opt.step(params);
  graph_.copy_tied();
  return result;
}

template <class Scalar>
step_result basic_direct_executor<Scalar>::evaluate(tensor_type input, const basic_targets<Scalar>& target,
                                                    const basic_loss<Scalar>& criterion) {
  const std::int64_t n = input.batch();
  const auto r = criterion.forward(predict(std::move(input)), target);
  return {.loss = r.loss, .correct = r.correct, .samples = n};
}

template <class Scalar>
std::size_t basic_direct_executor<Scalar>::stash_bytes() const noexcept {
  std::size_t b = 0;
  for (const auto& [id, f] : stashes_)
    for (const auto& s : f.stashes) b += s.payload_bytes();
  return b;
}

template class basic_direct_executor<float>;
template class basic_direct_executor<double>;

}  // namespace nerve::layers

#include "gpu/layers/device_parameters.hpp"

#include "gpu/kernels.hpp"
#include "gpu/status.hpp"

#include <algorithm>
#include <stdexcept>

namespace nerve::gpu {

device_tensor upload(stream& s, const float* host, shape_t shape) {
  device_tensor t(s, std::move(shape));
  copy_async(s, t.data(), host, t.bytes());
  s.synchronize();
  return t;
}

std::vector<float> download(stream& s, const device_tensor& t) {
  std::vector<float> v(t.size());
  copy_async(s, v.data(), t.data(), t.bytes());
  s.synchronize();
  return v;
}

device_parameters::device_parameters(device_optimizer opt) : opt_(std::move(opt)) {
  if (opt_.kind != "sgd" && opt_.kind != "adam" && opt_.kind != "adamw")
    throw error(errc::invalid_argument, "unknown optimizer '" + opt_.kind + "' (sgd, adam, adamw)");
}

void device_parameters::add(stream& s, std::string name, device_parameter p) {
  entry e{std::move(name), p, {}, {}, {}, 0};
  auto zeroed = [&] {
    device_tensor t(s, p.value->shape());
    fill_zero_async(s, t.data(), t.bytes());
    return t;
  };
  if (opt_.kind == "sgd" && opt_.momentum != 0) {
    e.velocity = zeroed();
  } else if (opt_.kind != "sgd") {
    e.m = zeroed();
    e.v = zeroed();
  }
  params_.push_back(std::move(e));
}

void device_parameters::zero_grad(stream& s) {
  for (auto& e : params_) fill_zero_async(s, e.p.grad->data(), e.p.grad->bytes());
}

void device_parameters::step(stream& s, double lr) {
  const float rate = float(lr >= 0 ? lr : opt_.lr);
  for (auto& e : params_) {
    const std::size_t count = e.p.value->size();
    if (opt_.kind == "sgd") {
      sgd_update(s, e.p.value->data(), e.p.grad->data(), e.velocity.empty() ? nullptr : e.velocity.data(), count,
                 sgd_params{rate, float(opt_.momentum), float(opt_.weight_decay), opt_.nesterov});
    } else {
      const adam_params a{rate, float(opt_.beta1), float(opt_.beta2), float(opt_.eps), float(opt_.weight_decay),
                          opt_.kind == "adamw", ++e.t};
      adam_update(s, e.p.value->data(), e.p.grad->data(), e.m.data(), e.v.data(), count, a);
    }
  }
}

layers::basic_optimizer_state<float> device_parameters::state(stream& s) {
  layers::basic_optimizer_state<float> out;
  for (auto& e : params_) {
    if (!e.velocity.empty()) out.buffers.push_back({e.name, "momentum_buffer", download(s, e.velocity)});
    if (!e.m.empty()) {
      out.buffers.push_back({e.name, "exp_avg", download(s, e.m)});
      out.buffers.push_back({e.name, "exp_avg_sq", download(s, e.v)});
      out.counters[e.name + ".step"] = e.t;
    }
  }
  return out;
}

void device_parameters::load(stream& s, const layers::basic_optimizer_state<float>& st) {
  s.synchronize();
  for (const auto& b : st.buffers) {
    auto it = std::find_if(params_.begin(), params_.end(), [&](const entry& e) { return e.name == b.parameter; });
    device_tensor* to = nullptr;
    if (it != params_.end())
      to = b.name == "momentum_buffer" ? &it->velocity : b.name == "exp_avg" ? &it->m : b.name == "exp_avg_sq" ? &it->v : nullptr;
    if (!to || to->empty() || to->size() != b.values.size())
      throw std::invalid_argument("optimizer state: '" + b.parameter + "." + b.name + "' does not fit this " +
                                  opt_.kind + " optimizer's parameters on the device");
    *to = upload(s, b.values.data(), to->shape());
  }
  for (auto& e : params_)
    if (auto c = st.counters.find(e.name + ".step"); c != st.counters.end()) e.t = c->second;
}

}  // namespace nerve::gpu

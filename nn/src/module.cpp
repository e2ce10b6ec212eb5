#include "ampgrad/nn/module.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <sstream>
#include <typeinfo>

#include "ampgrad/autograd.h"
#include "ampgrad/backend.h"
#include "ampgrad/factories.h"
#include "ampgrad/nn/layers.h"
#include "ampgrad/ops/nn.h"
#include "ampgrad/ops/elementwise.h"
#include "ampgrad/ops/reduce.h"

namespace ampgrad::nn {

void Module::check_new_name(const std::string& name) const {
  AG_CHECK(!name.empty() && name.find('.') == std::string::npos, "register",
           "invalid name '", name, "' (must be non-empty and contain no '.')");
  auto taken = [&](const auto& v) {
    return std::any_of(v.begin(), v.end(), [&](const auto& p) { return p.first == name; });
  };
  AG_CHECK(!taken(params_) && !taken(buffers_) && !taken(children_), "register", "name '", name,
           "' is already registered in this ", type_name_);
}

Tensor Module::register_parameter(const std::string& name, Tensor t, bool requires_grad) {
  check_new_name(name);
  AG_CHECK(t.defined(), "register_parameter", "parameter '", name, "' is undefined");
  t = t.detach();
  if (requires_grad) t.requires_grad_(true);
  params_.emplace_back(name, t);
  return t;
}

Tensor Module::register_buffer(const std::string& name, Tensor t) {
  check_new_name(name);
  buffers_.emplace_back(name, t.defined() ? t.detach() : t);
  return buffers_.back().second;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> m) {
  check_new_name(name);
  AG_CHECK(m != nullptr, "register_module", "module '", name, "' is null");
  children_.emplace_back(name, std::move(m));
}

void Module::collect(const std::string& prefix, bool recurse, bool buffers,
                     std::vector<std::pair<std::string, Tensor>>& out) const {
  for (const auto& [n, t] : buffers ? buffers_ : params_)
    if (t.defined()) out.emplace_back(prefix + n, t);
  if (!recurse) return;
  for (const auto& [n, c] : children_) c->collect(prefix + n + ".", true, buffers, out);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", recurse, false, out);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", recurse, true, out);
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}

std::vector<std::shared_ptr<Module>> Module::children() const {
  std::vector<std::shared_ptr<Module>> out;
  for (const auto& [n, c] : children_) out.push_back(c);
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_children() const {
  return children_;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_modules() {
  AG_CHECK(!weak_from_this().expired(), "named_modules", "the ", type_name_,
           " is not held by a std::shared_ptr (make it with std::make_shared)");
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> out{{"", shared_from_this()}};
  for (const auto& [n, c] : children_)
    for (auto& [cn, m] : c->named_modules()) out.emplace_back(cn.empty() ? n : n + "." + cn, m);
  return out;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, c] : children_) c->train(on);
}

void set_data(const Tensor& param, const Tensor& value) {
  TensorImpl* p = param.unsafe_impl();
  const TensorImpl* v = value.unsafe_impl();
  const bool dtype_changes = p->dtype != v->dtype || param.device() != value.device();
  p->storage = v->storage;
  p->sizes = v->sizes;
  p->strides = v->strides;
  p->offset = v->offset;
  p->dtype = v->dtype;
  if (dtype_changes && p->autograd && p->autograd->grad.defined()) p->autograd->grad = Tensor();
}

Module& Module::to(DType dtype) {
  NoGradGuard ng;
  for (auto& [n, t] : named_parameters()) {
    AG_CHECK(is_floating(dtype), "Module::to", "parameters must be floating, got ", dtype_name(dtype));
    if (t.dtype() != dtype) set_data(t, t.to(dtype));
  }
  for (auto& [n, t] : named_buffers())
    if (t.is_floating_point() && t.dtype() != dtype) set_data(t, t.to(dtype));
  return *this;
}

Module& Module::to(Device device) {
  NoGradGuard ng;
  for (auto& [n, t] : named_parameters())
    if (t.device() != device) set_data(t, t.to(device));
  for (auto& [n, t] : named_buffers())
    if (t.device() != device) set_data(t, t.to(device));
  return *this;
}

void Module::zero_grad() {
  for (auto& t : parameters()) t.set_grad(Tensor());
}

StateDict Module::state_dict() const {
  StateDict d;
  for (auto& [n, t] : named_parameters()) d[n] = t.detach();
  for (auto& [n, t] : named_buffers()) d[n] = t.detach();
  return d;
}

void Module::load_state_dict(const StateDict& dict, bool strict) {
  auto own = named_parameters();
  auto bufs = named_buffers();
  own.insert(own.end(), bufs.begin(), bufs.end());
  std::vector<std::string> missing, unexpected, mismatched, wrong_kind;
  // A value converts into the model's dtype within its kind only (float64 into float32
  // does): a bool or an integer read into a floating weight was never a weight.
  auto kind = [](DType dt) { return is_floating(dt) ? 0 : dt == kBool ? 1 : 2; };
  auto fits = [&](const Tensor& value, const Tensor& t) {
    return value.sizes() == t.sizes() && kind(value.dtype()) == kind(t.dtype());
  };
  for (auto& [n, t] : own) {
    auto it = dict.find(n);
    if (it != dict.end())
      AG_CHECK(it->second.defined(), "load_state_dict", "the state dict's tensor '", n, "' is undefined");
    if (it == dict.end()) missing.push_back(n);
    else if (it->second.sizes() != t.sizes()) {
      std::ostringstream os;
      os << n << ": checkpoint " << it->second.sizes() << " vs model " << t.sizes();
      mismatched.push_back(os.str());
    } else if (!fits(it->second, t)) {
      wrong_kind.push_back(n + ": checkpoint " + dtype_name(it->second.dtype()) + " vs model " + dtype_name(t.dtype()));
    }
  }
  for (const auto& entry : dict)
    if (std::none_of(own.begin(), own.end(), [&](const auto& p) { return p.first == entry.first; }))
      unexpected.push_back(entry.first);
  if (strict && (!missing.empty() || !unexpected.empty() || !mismatched.empty() || !wrong_kind.empty())) {
    std::ostringstream os;
    auto list = [&](const char* what, const std::vector<std::string>& v) {
      if (v.empty()) return;
      os << " " << what << ": ";
      for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
      os << ";";
    };
    os << "[load_state_dict] the state dict does not match the " << type_name_ << ":";
    list("missing keys", missing);
    list("unexpected keys", unexpected);
    list("shape mismatches", mismatched);
    list("dtypes of another kind", wrong_kind);
    throw Error(os.str());
  }
  NoGradGuard ng;
  for (auto& [n, t] : own) {
    auto it = dict.find(n);
    if (it == dict.end() || !fits(it->second, t)) continue;
    Tensor dst = t;
    dst.copy_(it->second);
  }
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (auto& t : parameters()) n += t.numel();
  return n;
}

Sequential::Sequential(std::initializer_list<ModulePtr> modules) : Module("Sequential") {
  for (auto& m : modules) push_back(m);
}

Sequential::Sequential(const std::vector<ModulePtr>& modules) : Module("Sequential") {
  for (auto& m : modules) push_back(m);
}

void Sequential::push_back(ModulePtr m) {
  register_module(std::to_string(modules_.size()), m);
  modules_.push_back(std::move(m));
}

namespace {
// The module as a Linear, when it is exactly one.
const Linear* as_linear(const ModulePtr& m) {
  if (!m) return nullptr;
  const Module& mod = *m;  // typeid of a named reference: no side effect to evaluate
  return typeid(mod) == typeid(Linear) ? static_cast<const Linear*>(m.get()) : nullptr;
}
const Conv2d* as_conv(const ModulePtr& m) {
  if (!m) return nullptr;
  const Module& mod = *m;
  return typeid(mod) == typeid(Conv2d) ? static_cast<const Conv2d*>(m.get()) : nullptr;
}
const MaxPool2d* as_max_pool(const ModulePtr& m) {
  if (!m) return nullptr;
  const Module& mod = *m;
  return typeid(mod) == typeid(MaxPool2d) ? static_cast<const MaxPool2d*>(m.get()) : nullptr;
}
// The activation of a module that is exactly a ReLU or a GELU with a valid form.
std::optional<Activation> activation_of(const ModulePtr& m) {
  if (!m) return std::nullopt;
  const Module& mod = *m;
  if (typeid(mod) == typeid(ReLU)) return Activation::Relu;
  if (typeid(mod) == typeid(GELU)) {
    const std::string& a = static_cast<const GELU&>(*m).approximate;
    if (a == "none") return Activation::GeluErf;
    if (a == "tanh") return Activation::GeluTanh;
  }
  return std::nullopt;
}
}  // namespace

Tensor Sequential::forward(const Tensor& x) {
  Tensor h = x;
  const size_t n = modules_.size();
  auto at = [&](size_t i) -> const ModulePtr& {
    static const ModulePtr none;
    return i < n ? modules_[i] : none;
  };
  for (size_t i = 0; i < n;) {
    // Conv2d, [ReLU,] MaxPool2d: one conv2d_block.
    if (const Conv2d* c = fusion_ ? as_conv(at(i)) : nullptr) {
      const bool relu = activation_of(at(i + 1)) == Activation::Relu;
      if (const MaxPool2d* mp = as_max_pool(at(i + (relu ? 2 : 1)))) {
        const auto& o = c->options;
        h = conv2d_block(h, c->weight, c->bias,
                         {{o.stride, o.stride}, {o.padding, o.padding}, {o.dilation, o.dilation}, o.groups},
                         relu ? Activation::Relu : Activation::None,
                         {{mp->kernel_size, mp->kernel_size}, {mp->stride, mp->stride}, {mp->padding, mp->padding}});
        i += relu ? 3 : 2;
        continue;
      }
    }
    const Linear* l1 = fusion_ ? as_linear(at(i)) : nullptr;
    const std::optional<Activation> act = l1 ? activation_of(at(i + 1)) : std::nullopt;
    if (act) {
      const Linear* l2 = as_linear(at(i + 2));
      if (l2 && !activation_of(at(i + 3))) {
        h = feed_forward(h, l1->weight, l1->bias, *act, l2->weight, l2->bias);
        i += 3;
      } else {
        h = linear(h, l1->weight, l1->bias, *act);
        i += 2;
      }
      continue;
    }
    h = modules_[i]->forward(h);
    ++i;
  }
  return h;
}

Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm) {
  // A negative bound would flip every gradient's sign; infinity only measures the norm.
  AG_CHECK(max_norm >= 0, "clip_grad_norm_", "max_norm must be non-negative, got ", max_norm);
  NoGradGuard ng;
  // The gradients of each device, in one list: one backend call each, nothing read back.
  const auto by_device = gradients_by_device(params);
  if (by_device.empty()) return zeros({});
  const Device home = by_device.front().first;
  Tensor total_sq;
  for (auto& [dev, grads] : by_device) {
    Tensor sq = zeros({1}, TensorOptions(kFloat32).device(dev));
    backend(dev, "clip_grad_norm_").sum_of_squares(grads, sq);
    sq = sq.to(home);
    total_sq = total_sq.defined() ? add(total_sq, sq) : sq;
  }
  const Tensor total = sqrt(total_sq);
  // min(1, max_norm / (total + 1e-6)) on the device: no host branch; scaling by exactly 1
  // leaves every gradient as it was.
  const Tensor coef = clamp(reciprocal(total + 1e-6) * max_norm, std::nullopt, 1.0);
  for (auto& [dev, grads] : by_device) {
    backend(dev, "clip_grad_norm_").scale_and_check(grads, coef.to(dev), Tensor());
    for (const Tensor& g : grads) detail::bump_version(g);  // in-place writes
  }
  return total.reshape({});
}

}  // namespace ampgrad::nn

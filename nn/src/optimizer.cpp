#include "ampgrad/optim/optimizer.h"

#include <cmath>
#include <string>

#include "ampgrad/autograd.h"
#include "ampgrad/backend.h"
#include "ampgrad/factories.h"

namespace ampgrad::optim {

void Optimizer::add_group(std::vector<Tensor> params, double lr, const char* who) {
  AG_CHECK(lr >= 0 && std::isfinite(lr), who, "learning rate must be finite and non-negative, got ", lr);
  for (size_t j = 0; j < params.size(); ++j) {
    const Tensor& p = params[j];
    AG_CHECK(p.defined(), who, "parameter ", j, " of group ", groups_.size(), " is undefined");
    AG_CHECK(p.is_floating_point(), who, "parameters must be floating, got ", dtype_name(p.dtype()));
    AG_CHECK(p.is_leaf(), who, "parameter ", j, " of group ", groups_.size(),
             " is not a leaf tensor (shape ", p.sizes(), ")");
    AG_CHECK(p.is_contiguous(), who, "parameter ", j, " of group ", groups_.size(), " is not contiguous");
  }
  groups_.push_back({std::move(params), lr});
  state_.emplace_back(groups_.back().params.size());
}

void Optimizer::zero_grad() {
  for (auto& g : groups_)
    for (auto& p : g.params) p.set_grad(Tensor());
}

double Optimizer::lr(size_t group) const {
  AG_CHECK(group < groups_.size(), "optimizer", "group ", group, " does not exist (", groups_.size(), " groups)");
  return groups_[group].lr;
}

void Optimizer::set_lr(size_t group, double lr) {
  AG_CHECK(group < groups_.size(), "optimizer", "group ", group, " does not exist (", groups_.size(), " groups)");
  groups_[group].lr = lr;
}

void Optimizer::set_lr(double lr) {
  for (auto& g : groups_) g.lr = lr;
}

std::vector<Tensor> Optimizer::parameters() const {
  std::vector<Tensor> out;
  for (auto& g : groups_) out.insert(out.end(), g.params.begin(), g.params.end());
  return out;
}

Optimizer::ParamState& Optimizer::state(size_t g, size_t j) { return state_[g][j]; }

void Optimizer::init_master_weights() {
  for (size_t g = 0; g < groups_.size(); ++g)
    for (size_t j = 0; j < groups_[g].params.size(); ++j) {
      const Tensor p = groups_[g].params[j].detach();
      if (!p.is_floating_point() || p.dtype() == kFloat64) continue;
      // A copy even when p is float32 already: the master must not alias the parameter.
      state(g, j).master = p.dtype() == kFloat32 ? p.clone() : p.to(kFloat32);
    }
}

void SGD::set_master_weights(bool on) {
  for (auto& o : options_) o.master_weights = on;
}

void Adam::set_master_weights(bool on) {
  for (auto& o : options_) o.master_weights = on;
}

Tensor Optimizer::master_for(ParamState& s, const Tensor& param, bool master_weights) {
  if (!master_weights || !is_reduced_floating(param.dtype())) return Tensor();
  if (!s.master.defined()) s.master = param.detach().to(kFloat32);
  return s.master;
}

StateDict Optimizer::state_dict() const {
  StateDict d;
  d["steps"] = scalar_tensor(steps_, kInt64);
  for (size_t g = 0; g < groups_.size(); ++g) {
    const std::string gp = "param_groups." + std::to_string(g) + ".";
    d[gp + "lr"] = scalar_tensor(groups_[g].lr, kFloat64);
    d[gp + "size"] = scalar_tensor(int64_t(groups_[g].params.size()), kInt64);
    for (size_t j = 0; j < groups_[g].params.size(); ++j) {
      const auto& s = state_[g][j];
      const std::string sp = "state." + std::to_string(g) + "." + std::to_string(j) + ".";
      if (s.buf1.defined()) d[sp + "buf1"] = s.buf1.detach();
      if (s.buf2.defined()) d[sp + "buf2"] = s.buf2.detach();
      if (s.master.defined()) d[sp + "master"] = s.master.detach();
      if (s.step) d[sp + "step"] = scalar_tensor(s.step, kInt64);
    }
  }
  return d;
}

void Optimizer::load_state_dict(const StateDict& d) {
  auto get = [&](const std::string& k) -> const Tensor& {
    auto it = d.find(k);
    AG_CHECK(it != d.end(), "Optimizer::load_state_dict", "missing key '", k, "'");
    return it->second;
  };
  for (size_t g = 0; g < groups_.size(); ++g) {
    const std::string gp = "param_groups." + std::to_string(g) + ".";
    const int64_t n = get(gp + "size").item<int64_t>();
    AG_CHECK(n == int64_t(groups_[g].params.size()), "Optimizer::load_state_dict", "group ", g, " has ",
             groups_[g].params.size(), " parameters but the state dict has ", n);
  }
  AG_CHECK(d.count("param_groups." + std::to_string(groups_.size()) + ".lr") == 0,
           "Optimizer::load_state_dict", "the state dict has more than ", groups_.size(), " groups");
  NoGradGuard ng;
  for (size_t g = 0; g < groups_.size(); ++g) {
    groups_[g].lr = get("param_groups." + std::to_string(g) + ".lr").item<double>();
    for (size_t j = 0; j < groups_[g].params.size(); ++j) {
      const std::string sp = "state." + std::to_string(g) + "." + std::to_string(j) + ".";
      auto& s = state_[g][j];
      const Tensor& p = groups_[g].params[j];
      auto load = [&](const char* name, Tensor& dst) {
        auto it = d.find(sp + name);
        if (it == d.end()) {
          dst = Tensor();
          return;
        }
        AG_CHECK(it->second.sizes() == p.sizes(), "Optimizer::load_state_dict", "state '", sp + name,
                 "' has shape ", it->second.sizes(), " but the parameter has shape ", p.sizes());
        dst = it->second.to(p.device()).to(kFloat32).clone();
      };
      load("buf1", s.buf1);
      load("buf2", s.buf2);
      load("master", s.master);
      auto st = d.find(sp + "step");
      s.step = st == d.end() ? 0 : st->second.item<int64_t>();
    }
  }
  steps_ = get("steps").item<int64_t>();
}

// ---- SGD ------------------------------------------------------------------------------------

SGD::SGD(std::vector<Tensor> params, SGDOptions options) : SGD(std::vector<ParamGroup>{{std::move(params), options}}) {}

SGD::SGD(std::vector<ParamGroup> groups) {
  for (auto& g : groups) {
    const auto& o = g.options;
    AG_CHECK(o.momentum >= 0 && o.weight_decay >= 0, "SGD", "momentum and weight_decay must be non-negative, got ",
             o.momentum, " and ", o.weight_decay);
    AG_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0), "SGD",
             "nesterov momentum requires a momentum and zero dampening");
    add_group(std::move(g.params), o.lr, "SGD");
    options_.push_back(o);
  }
}

void SGD::step() {
  NoGradGuard ng;
  ++steps_;
  for_each_param_with_grad([&](size_t g, const Tensor& p, const Tensor& grad, ParamState& s) {
    const auto& o = options_[g];
    const bool first = o.momentum != 0 && !s.buf1.defined();
    if (first) s.buf1 = zeros(p.sizes().vec(), TensorOptions(kFloat32).device(p.device()));
    SgdStep st{groups_[g].lr, o.momentum, o.dampening, o.weight_decay, o.nesterov, first};
    backend(p.device(), "SGD").sgd_step(p, grad.contiguous(), s.buf1, master_for(s, p, o.master_weights), st);
  });
}

// ---- Adam and AdamW ---------------------------------------------------------------------------

Adam::Adam(std::vector<Tensor> params, AdamOptions options)
    : Adam(std::vector<ParamGroup>{{std::move(params), options}}) {}

Adam::Adam(std::vector<ParamGroup> groups) { add_groups(std::move(groups)); }

void Adam::add_groups(std::vector<ParamGroup> groups) {
  const char* who = decoupled_ ? "AdamW" : "Adam";
  for (auto& g : groups) {
    const auto& o = g.options;
    AG_CHECK(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1, who, "betas must be in [0, 1), got ",
             o.beta1, " and ", o.beta2);
    AG_CHECK(o.eps >= 0 && o.weight_decay >= 0, who, "eps and weight_decay must be non-negative");
    add_group(std::move(g.params), o.lr, who);
    options_.push_back(o);
  }
}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions options)
    : AdamW(std::vector<ParamGroup>{{std::move(params), options}}) {}

AdamW::AdamW(std::vector<ParamGroup> groups) : Adam(true) {
  std::vector<Adam::ParamGroup> converted;
  for (auto& g : groups) {
    const auto& o = g.options;
    converted.push_back({std::move(g.params), AdamOptions{o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, o.master_weights}});
  }
  add_groups(std::move(converted));
}

void Adam::step() {
  NoGradGuard ng;
  ++steps_;
  for_each_param_with_grad([&](size_t g, const Tensor& p, const Tensor& grad, ParamState& s) {
    const auto& o = options_[g];
    if (!s.buf1.defined()) {
      const auto opts = TensorOptions(kFloat32).device(p.device());
      s.buf1 = zeros(p.sizes().vec(), opts);
      s.buf2 = zeros(p.sizes().vec(), opts);
    }
    AdamStep st{groups_[g].lr, o.beta1, o.beta2, o.eps, o.weight_decay, decoupled_, ++s.step};
    backend(p.device(), decoupled_ ? "AdamW" : "Adam")
        .adam_step(p, grad.contiguous(), s.buf1, s.buf2, master_for(s, p, o.master_weights), st);
  });
}

}  // namespace ampgrad::optim

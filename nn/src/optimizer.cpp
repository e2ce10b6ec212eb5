#include "ampgrad/optim/optimizer.h"

#include <cmath>
#include <set>
#include <string>
#include <typeinfo>

#include "ampgrad/autograd.h"
#include "ampgrad/backend.h"
#include "ampgrad/cast_shadow.h"
#include "ampgrad/factories.h"
#include "ampgrad/ops/elementwise.h"
#include "ampgrad/ops/reduce.h"
#include "ampgrad/philox.h"
#include "ampgrad/state_number.h"

namespace ampgrad::optim {

// The rounding seed: one Philox block of the global generator's next counter, so that two
// optimizers made one after the other draw apart, and manual_seed decides both.
Optimizer::Optimizer() {
  const auto [seed, offset] = generator_advance(1);
  const kernels::Philox4x32 r(seed, offset);
  rounding_seed_ = uint64_t(r.out[0]) | uint64_t(r.out[1]) << 32;
}

void Optimizer::add_group(std::vector<Tensor> params, double lr, UpdateRounding rounding, const char* who) {
  AG_CHECK(lr >= 0 && std::isfinite(lr), who, "learning rate must be finite and non-negative, got ", lr);
  for (size_t j = 0; j < params.size(); ++j) {
    const Tensor& p = params[j];
    AG_CHECK(p.defined(), who, "parameter ", j, " of group ", groups_.size(), " is undefined");
    AG_CHECK(p.is_floating_point(), who, "parameters must be floating, got ", dtype_name(p.dtype()));
    AG_CHECK(p.is_leaf(), who, "parameter ", j, " of group ", groups_.size(),
             " is not a leaf tensor (shape ", p.sizes(), ")");
    AG_CHECK(p.is_contiguous(), who, "parameter ", j, " of group ", groups_.size(), " is not contiguous");
    // A parameter listed twice (or two that share elements) would be stepped twice per step.
    auto overlaps = [&](const Tensor& q) {
      return q.is_alias_of(p) && q.storage_offset() < p.storage_offset() + p.numel() &&
             p.storage_offset() < q.storage_offset() + q.numel();
    };
    for (size_t g = 0; g <= groups_.size(); ++g) {
      const std::vector<Tensor>& seen = g < groups_.size() ? groups_[g].params : params;
      const size_t n = g < groups_.size() ? seen.size() : j;
      for (size_t i = 0; i < n; ++i)
        AG_CHECK(!overlaps(seen[i]), who, "parameter ", j, " of group ", groups_.size(), " (shape ", p.sizes(),
                 ") is parameter ", i, " of group ", g, seen[i].unsafe_impl() == p.unsafe_impl() ? "" : " or shares memory with it",
                 ": each parameter may appear once");
    }
  }
  if (!step_count_.defined()) {
    const Device d = params.empty() ? Device(kCPU) : params.front().device();
    step_count_ = zeros({}, TensorOptions(kInt64).device(d));
  }
  groups_.push_back({std::move(params), lr, Tensor(), rounding, Tensor(), Tensor()});
  state_.emplace_back(groups_.back().params.size());
}

const Tensor& Optimizer::step_count() const {
  const Device d = groups_.front().params.front().device();
  if (step_count_.device() != d) step_count_ = step_count_.to(d);
  return step_count_;
}

void Optimizer::require_parameters() const {
  size_t n = 0;
  for (const Group& g : groups_) n += g.params.size();
  AG_CHECK(n > 0, name(), "got an empty parameter list (", groups_.size(), " groups, no parameter)");
}

void Optimizer::zero_grad() {
  for (auto& g : groups_)
    for (auto& p : g.params) p.set_grad(Tensor());
}

double Optimizer::lr(size_t group) const {
  AG_CHECK(group < groups_.size(), "optimizer", "group ", group, " does not exist (", groups_.size(), " groups)");
  const Group& g = groups_[group];
  return g.lr_tensor.defined() ? g.lr_tensor.item<double>() : g.lr;
}

void Optimizer::set_lr(size_t group, double lr) {
  AG_CHECK(group < groups_.size(), "optimizer", "group ", group, " does not exist (", groups_.size(), " groups)");
  groups_[group].lr = lr;
  groups_[group].lr_tensor = Tensor();
}

void Optimizer::set_lr(size_t group, const Tensor& lr) {
  AG_CHECK(group < groups_.size(), "optimizer", "group ", group, " does not exist (", groups_.size(), " groups)");
  AG_CHECK(lr.defined() && lr.numel() == 1 && lr.dtype() == kFloat64, "optimizer",
           "a learning-rate tensor must be float64 with one element, got ",
           lr.defined() ? dtype_name(lr.dtype()) : "an undefined tensor");
  AG_CHECK(lr.device() == step_count().device(), "optimizer", "the learning rate is on ", lr.device(),
           " but the parameters are on ", step_count().device());
  groups_[group].lr_tensor = lr;
}

void Optimizer::set_lr(double lr) {
  for (size_t g = 0; g < groups_.size(); ++g) set_lr(g, lr);
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

void Optimizer::set_master_weights(bool on) {
  for (Group& g : groups_) {
    if (on) g.rounding = UpdateRounding::Master;
    else if (g.rounding == UpdateRounding::Master) g.rounding = UpdateRounding::Nearest;
  }
}

UpdateRounding Optimizer::update_rounding(size_t group) const {
  AG_CHECK(group < groups_.size(), "optimizer", "group ", group, " does not exist (", groups_.size(), " groups)");
  return groups_[group].rounding;
}

void Optimizer::set_update_rounding(size_t group, UpdateRounding r) {
  AG_CHECK(group < groups_.size(), "optimizer", "group ", group, " does not exist (", groups_.size(), " groups)");
  groups_[group].rounding = r;
}

void Optimizer::set_update_rounding(UpdateRounding r) {
  for (Group& g : groups_) g.rounding = r;
}

size_t Optimizer::state_bytes(size_t group) const {
  AG_CHECK(group < groups_.size(), "optimizer", "group ", group, " does not exist (", groups_.size(), " groups)");
  size_t n = 0;
  for (const ParamState& s : state_[group])
    for (const Tensor* t : {&s.buf1, &s.buf2, &s.master, &s.comp})
      if (t->defined()) n += t->nbytes();
  return n;
}

size_t Optimizer::state_bytes() const {
  size_t n = 0;
  for (size_t g = 0; g < groups_.size(); ++g) n += state_bytes(g);
  return n;
}

void Optimizer::set_count_stalled(bool on) { count_stalled_ = on; }

const Tensor& Optimizer::stalled_count() const {
  const Device d = step_count().device();
  if (!stalled_count_.defined() || stalled_count_.device() != d)
    stalled_count_ = zeros({}, TensorOptions(kInt64).device(d));
  return stalled_count_;
}

const Tensor& Optimizer::stalled_count(size_t group) const {
  AG_CHECK(group < groups_.size(), "optimizer", "group ", group, " does not exist (", groups_.size(), " groups)");
  const Group& g = groups_[group];
  const Device d = g.params.empty() ? step_count().device() : g.params.front().device();
  if (!g.stalled.defined() || g.stalled.device() != d)
    const_cast<Group&>(g).stalled = zeros({}, TensorOptions(kInt64).device(d));
  return g.stalled;
}

const Tensor& Optimizer::stalled_counts(size_t group) const {
  AG_CHECK(group < groups_.size(), "optimizer", "group ", group, " does not exist (", groups_.size(), " groups)");
  const Group& g = groups_[group];
  const Device d = g.params.empty() ? step_count().device() : g.params.front().device();
  if (!g.stalled_per.defined() || g.stalled_per.device() != d)
    const_cast<Group&>(g).stalled_per = zeros({int64_t(g.params.size())}, TensorOptions(kInt64).device(d));
  return g.stalled_per;
}

double Optimizer::stalled_fraction(size_t group) const {
  const int64_t count = stalled_count(group).item<int64_t>();
  int64_t n = 0;
  for (const Tensor& p : groups_[group].params)
    if (is_reduced_floating(p.dtype())) n += p.numel();
  return n == 0 ? 0.0 : double(count) / double(n);
}

std::vector<double> Optimizer::stalled_fractions(size_t group) const {
  const std::vector<int64_t> counts = stalled_counts(group).to_vector<int64_t>();
  const std::vector<Tensor>& params = groups_[group].params;
  std::vector<double> f(params.size(), 0.0);
  for (size_t j = 0; j < params.size(); ++j)
    if (is_reduced_floating(params[j].dtype()) && params[j].numel() > 0)
      f[j] = double(counts[j]) / double(params[j].numel());
  return f;
}

Tensor Optimizer::master_for(ParamState& s, const Tensor& param, bool master_weights) {
  if (!master_weights || !is_reduced_floating(param.dtype())) return Tensor();
  if (!s.master.defined()) s.master = param.detach().to(kFloat32);
  return s.master;
}

StateDict Optimizer::state_dict() const {
  StateDict d;
  d["steps"] = step_count();
  // The seed's 64 bits as two 32-bit words (high, low) in int64: exact in every reader.
  d["rounding_seed"] =
      from_vector<int64_t>({int64_t(rounding_seed_ >> 32), int64_t(rounding_seed_ & 0xFFFFFFFFu)}, {2});
  for (size_t g = 0; g < groups_.size(); ++g) {
    const std::string gp = "param_groups." + std::to_string(g) + ".";
    d[gp + "lr"] = groups_[g].lr_tensor.defined() ? groups_[g].lr_tensor.reshape({}) : scalar_tensor(groups_[g].lr, kFloat64);
    d[gp + "size"] = scalar_tensor(int64_t(groups_[g].params.size()), kInt64);
    for (size_t j = 0; j < groups_[g].params.size(); ++j) {
      const auto& s = state_[g][j];
      const std::string sp = "state." + std::to_string(g) + "." + std::to_string(j) + ".";
      if (s.buf1.defined()) d[sp + "buf1"] = s.buf1.detach();
      if (s.buf2.defined()) d[sp + "buf2"] = s.buf2.detach();
      if (s.master.defined()) d[sp + "master"] = s.master.detach();
      if (s.comp.defined()) d[sp + "comp"] = s.comp.detach();
      if (s.step.defined()) d[sp + "step"] = s.step;
    }
  }
  return d;
}

void Optimizer::load_state_dict(const StateDict& d) {
  constexpr const char* kOp = "Optimizer::load_state_dict";
  auto get = [&](const std::string& k) -> const Tensor& {
    auto it = d.find(k);
    AG_CHECK(it != d.end(), kOp, "missing key '", k, "'");
    return it->second;
  };
  for (size_t g = 0; g < groups_.size(); ++g) {
    const std::string gp = "param_groups." + std::to_string(g) + ".";
    const int64_t n = detail::state_int(get(gp + "size"), kOp, gp + "size");
    AG_CHECK(n == int64_t(groups_[g].params.size()), kOp, "group ", g, " has ", groups_[g].params.size(),
             " parameters but the state dict has ", n);
  }
  AG_CHECK(d.count("param_groups." + std::to_string(groups_.size()) + ".lr") == 0, kOp,
           "the state dict has more than ", groups_.size(), " groups");
  // Every key is known (as a module's strict load refuses unexpected keys), and every number
  // passes the constructors' rules, before anything is assigned: a bad dict changes nothing.
  std::set<std::string> known{"steps", "rounding_seed"};
  for (size_t g = 0; g < groups_.size(); ++g) {
    const std::string gp = "param_groups." + std::to_string(g) + ".";
    known.insert({gp + "lr", gp + "size"});
    for (size_t j = 0; j < groups_[g].params.size(); ++j) {
      const std::string sp = "state." + std::to_string(g) + "." + std::to_string(j) + ".";
      known.insert({sp + "buf1", sp + "buf2", sp + "master", sp + "comp", sp + "step"});
    }
  }
  for (const auto& [k, v] : d) AG_CHECK(known.count(k), kOp, "unexpected key '", k, "'");
  std::vector<double> lrs;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const std::string key = "param_groups." + std::to_string(g) + ".lr";
    const double lr = detail::state_double(get(key), kOp, key);
    AG_CHECK(lr >= 0 && std::isfinite(lr), kOp, "'", key, "' must be a finite non-negative learning rate, got ", lr);
    lrs.push_back(lr);
  }
  const int64_t steps = detail::state_int(get("steps"), kOp, "steps");
  // A dict saved before the rounding seed existed keeps this optimizer's.
  const auto seed_it = d.find("rounding_seed");
  uint64_t seed = rounding_seed_;
  if (seed_it != d.end()) {
    const Tensor& t = seed_it->second;
    AG_CHECK(t.defined(), kOp, "'rounding_seed' is an undefined tensor");
    AG_CHECK(t.dtype() == kInt64 && t.numel() == 2, kOp,
             "'rounding_seed' must be an int64 tensor of two 32-bit words (high, low), got ", dtype_name(t.dtype()),
             " of shape ", t.sizes());
    const std::vector<int64_t> w = t.to(kCPU).contiguous().to_vector<int64_t>();
    AG_CHECK(w[0] >= 0 && w[0] <= 0xFFFFFFFFll && w[1] >= 0 && w[1] <= 0xFFFFFFFFll, kOp,
             "'rounding_seed' words must be in [0, 2^32), got ", w[0], " and ", w[1]);
    seed = uint64_t(w[0]) << 32 | uint64_t(w[1]);
  }
  std::vector<std::vector<int64_t>> param_steps(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g)
    for (size_t j = 0; j < groups_[g].params.size(); ++j) {
      const std::string sp = "state." + std::to_string(g) + "." + std::to_string(j) + ".";
      const Tensor& p = groups_[g].params[j];
      for (const char* name : {"buf1", "buf2", "master"}) {
        auto it = d.find(sp + name);
        if (it == d.end()) continue;
        AG_CHECK(it->second.defined() && it->second.is_floating_point(), kOp, "state '", sp + name,
                 "' must be a floating tensor, got ", it->second.defined() ? dtype_name(it->second.dtype()) : "undefined");
        AG_CHECK(it->second.sizes() == p.sizes(), kOp, "state '", sp + name, "' has shape ", it->second.sizes(),
                 " but the parameter has shape ", p.sizes());
      }
      // The compensation is in the parameter's own dtype (a float32 one would be a master).
      if (auto it = d.find(sp + "comp"); it != d.end()) {
        AG_CHECK(it->second.defined() && it->second.dtype() == p.dtype() && is_reduced_floating(p.dtype()), kOp,
                 "state '", sp + "comp", "' must be a ", dtype_name(p.dtype()),
                 " tensor like its parameter (a compensation is kept for float16 and bfloat16 parameters), got ",
                 it->second.defined() ? dtype_name(it->second.dtype()) : "undefined");
        AG_CHECK(it->second.sizes() == p.sizes(), kOp, "state '", sp + "comp", "' has shape ", it->second.sizes(),
                 " but the parameter has shape ", p.sizes());
      }
      // A state saved without a step count has taken one step if it has buffers: that is
      // all SGD's first-step rule needs to know.
      auto st = d.find(sp + "step");
      param_steps[g].push_back(st != d.end() ? detail::state_int(st->second, kOp, sp + "step")
                               : d.count(sp + "buf1")   ? 1
                                                        : -1);
    }
  NoGradGuard ng;
  for (size_t g = 0; g < groups_.size(); ++g) {
    groups_[g].lr = lrs[g];
    groups_[g].lr_tensor = Tensor();
    for (size_t j = 0; j < groups_[g].params.size(); ++j) {
      const std::string sp = "state." + std::to_string(g) + "." + std::to_string(j) + ".";
      auto& s = state_[g][j];
      const Tensor& p = groups_[g].params[j];
      auto load = [&](const char* name, Tensor& dst) {
        auto it = d.find(sp + name);
        dst = it == d.end() ? Tensor() : it->second.to(p.device()).to(kFloat32).clone();
      };
      load("buf1", s.buf1);
      load("buf2", s.buf2);
      load("master", s.master);
      auto comp = d.find(sp + "comp");
      s.comp = comp == d.end() ? Tensor() : comp->second.to(p.device()).clone();
      const int64_t step = param_steps[g][j];
      s.step = step >= 0 ? full({}, step, TensorOptions(kInt64).device(p.device())) : Tensor();
    }
  }
  step_count_ = full({}, steps, TensorOptions(kInt64).device(step_count().device()));
  rounding_seed_ = seed;
}

StepResult Optimizer::step(const Tensor& found_inf) {
  NoGradGuard ng;
  ++step_calls_;
  AG_CHECK(!found_inf.defined() || (found_inf.dtype() == kFloat32 && found_inf.numel() == 1), name(),
           "found_inf must be a float32 tensor of one element");
  int64_t first_id = 0;  // the id of group g's first parameter: its index in the optimizer
  for (size_t g = 0; g < groups_.size(); ++g) {
    const UpdateRounding rounding = groups_[g].rounding;
    // The group's counts restart at 0 each step (on the device).
    const Tensor stalled = count_stalled_ ? Tensor(stalled_counts(g)).zero_() : Tensor();
    // One list per device and dtype, in the order of their first parameter; slots[k][i]:
    // the index in the group of list k's parameter i.
    std::vector<OptimizerLists> lists;
    std::vector<std::pair<Device, DType>> keys;
    std::vector<std::vector<int64_t>> slots;
    for (size_t j = 0; j < groups_[g].params.size(); ++j) {
      const Tensor& p = groups_[g].params[j];
      const Tensor grad = p.grad();
      if (!grad.defined()) continue;
      ParamState& s = state(g, j);
      init_state(g, p, s);
      if (!s.step.defined()) s.step = zeros({}, TensorOptions(kInt64).device(p.device()));
      const std::pair<Device, DType> key{p.device(), p.dtype()};
      size_t k = 0;
      while (k < keys.size() && !(keys[k].first == key.first && keys[k].second == key.second)) ++k;
      if (k == keys.size()) {
        keys.push_back(key);
        lists.emplace_back();
        slots.emplace_back();
      }
      slots[k].push_back(int64_t(j));
      OptimizerLists& l = lists[k];
      l.params.push_back(p);
      l.grads.push_back(grad.contiguous());
      if (s.buf1.defined()) l.buf1.push_back(s.buf1);
      if (s.buf2.defined()) l.buf2.push_back(s.buf2);
      l.masters.push_back(master_for(s, p, uses_master_weights(g)));
      l.steps.push_back(s.step);
      l.ids.push_back(first_id + int64_t(j));
      if (rounding == UpdateRounding::Compensated && is_reduced_floating(p.dtype()) && !l.masters.back().defined() &&
          !s.comp.defined())
        s.comp = zeros(p.sizes().vec(), TensorOptions(p.dtype()).device(p.device()));
      l.comps.push_back(rounding == UpdateRounding::Compensated && !l.masters.back().defined() ? s.comp : Tensor());
      // The shadow autocast keeps of p, written by this step where it can be (see
      // ampgrad/cast_shadow.h); the lists hold an undefined entry for the rest.
      const bool casts = writes_casts() && p.dtype() == kFloat32 && !l.masters.back().defined() &&
                         backend(p.device(), name()).optimizer_writes_casts();
      l.casts.push_back(casts ? detail::shadow_buffer(p) : Tensor());
    }
    first_id += int64_t(groups_[g].params.size());
    for (size_t k = 0; k < lists.size(); ++k) {
      OptimizerLists& l = lists[k];
      const Device dev = keys[k].first;
      l.lr = {groups_[g].lr, groups_[g].lr_tensor};
      l.rounding = rounding == UpdateRounding::Master ? UpdateRounding::Nearest : rounding;
      l.seed = rounding_seed_;
      bool any_comp = false;
      for (const Tensor& c : l.comps) any_comp = any_comp || c.defined();
      if (!any_comp) l.comps.clear();
      // The list's parameters are group slots first..first+n-1 on the counts' device (one
      // dtype, every gradient there): the backend adds to that part of the counts itself.
      // Otherwise it counts into a tensor of its own, copied into the slots below (one copy
      // per run of consecutive slots; between devices, a copy, never a host sync).
      const std::vector<int64_t>& sl = slots[k];
      const bool in_place =
          stalled.defined() && stalled.device() == dev && sl.back() - sl.front() + 1 == int64_t(sl.size());
      if (stalled.defined())
        l.stalled = in_place ? stalled.narrow(0, sl.front(), int64_t(sl.size()))
                             : zeros({int64_t(sl.size())}, TensorOptions(kInt64).device(dev));
      AG_CHECK(!l.lr.tensor.defined() || l.lr.tensor.device() == dev, name(), "the learning rate of group ", g,
               " is on ", l.lr.tensor.defined() ? l.lr.tensor.device() : dev, " but its parameters on ", dev);
      // (a copy between devices when the flag lives elsewhere: never a host sync)
      if (found_inf.defined()) l.found_inf = found_inf.device() == dev ? found_inf : found_inf.to(dev);
      bool any_cast = false;
      for (const Tensor& c : l.casts) any_cast = any_cast || c.defined();
      if (!any_cast) l.casts.clear();
      step_lists(g, l);
      if (stalled.defined() && !in_place)
        for (size_t i = 0, r; i < sl.size(); i = r) {
          for (r = i + 1; r < sl.size() && sl[r] == sl[r - 1] + 1;) ++r;
          const int64_t len = int64_t(r - i);
          stalled.narrow(0, sl[i], len).copy_(l.stalled.narrow(0, int64_t(i), len));
        }
      // The parameters were written in place (a skipped step included: the host does not
      // know), so whatever was derived from their old values is stale; the casts written
      // along with them are the current ones.
      for (size_t i = 0; i < l.params.size(); ++i) {
        detail::bump_version(l.params[i]);
        if (!l.casts.empty() && l.casts[i].defined()) detail::shadow_written(l.params[i]);
      }
    }
  }
  if (count_stalled_) {
    Tensor total = Tensor(stalled_count()).zero_();
    for (size_t g = 0; g < groups_.size(); ++g) {
      Tensor(stalled_count(g)).copy_(sum(stalled_counts(g)));
      total.add_(stalled_count(g).to(total.device()));
    }
  }
  // The count advances on the device: by one, or by one unless the step was skipped.
  const Tensor& count = step_count();
  if (found_inf.defined()) Tensor(count).add_(eq(found_inf, 0.0).to(kInt64).sum().to(count.device()));
  else Tensor(count).add_(1);
  return found_inf.defined() ? StepResult::unless(found_inf) : StepResult(true);
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
    add_group(std::move(g.params), o.lr, o.update_rounding, "SGD");
    options_.push_back(o);
  }
  require_parameters();
}

void SGD::init_state(size_t g, const Tensor& p, ParamState& s) {
  const auto& o = options_[g];
  if (o.momentum != 0 && !s.buf1.defined()) s.buf1 = zeros(p.sizes().vec(), TensorOptions(kFloat32).device(p.device()));
}

bool SGD::writes_casts() const { return typeid(*this) == typeid(SGD); }

void SGD::step_lists(size_t g, const OptimizerLists& lists) {
  const auto& o = options_[g];
  backend(lists.params.front().device(), "SGD")
      .sgd_step(lists, {.momentum = o.momentum, .dampening = o.dampening, .weight_decay = o.weight_decay, .nesterov = o.nesterov});
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
    add_group(std::move(g.params), o.lr, o.update_rounding, who);
    options_.push_back(o);
  }
  require_parameters();
}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions options)
    : AdamW(std::vector<ParamGroup>{{std::move(params), options}}) {}

AdamW::AdamW(std::vector<ParamGroup> groups) : Adam(true) {
  std::vector<Adam::ParamGroup> converted;
  for (auto& g : groups) {
    const auto& o = g.options;
    converted.push_back(
        {std::move(g.params), AdamOptions{o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, o.update_rounding}});
  }
  add_groups(std::move(converted));
}

void Adam::init_state(size_t g, const Tensor& p, ParamState& s) {
  const auto opts = TensorOptions(kFloat32).device(p.device());
  if (!s.buf1.defined()) s.buf1 = zeros(p.sizes().vec(), opts);
  if (!s.buf2.defined()) s.buf2 = zeros(p.sizes().vec(), opts);
}

bool Adam::writes_casts() const { return typeid(*this) == typeid(Adam) || typeid(*this) == typeid(AdamW); }

void Adam::step_lists(size_t g, const OptimizerLists& lists) {
  const auto& o = options_[g];
  backend(lists.params.front().device(), name())
      .adam_step(lists, {.beta1 = o.beta1, .beta2 = o.beta2, .eps = o.eps, .weight_decay = o.weight_decay, .decoupled = decoupled_});
}

}  // namespace ampgrad::optim

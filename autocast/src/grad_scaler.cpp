// GradScaler: the per-optimizer state machine and the scale update rule (see the header
// and docs/grad-scaler.md). Scale arithmetic is in double on the host; gradients are
// unscaled by the backend's fused amp_unscale_and_check, one call per gradient, and the
// resulting flags are read back once per optimizer and device.
#include "ampgrad/autocast/grad_scaler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ampgrad/autograd.h"
#include "ampgrad/backend.h"
#include "ampgrad/factories.h"
#include "ampgrad/optim/optimizer.h"

namespace ampgrad {
namespace {

constexpr const char* kOp = "GradScaler";
constexpr double kFloatMax = double(std::numeric_limits<float>::max());

double get_double(const std::map<std::string, Tensor>& d, const std::string& key) {
  auto it = d.find(key);
  AG_CHECK(it != d.end(), kOp, "load_state_dict(): missing key \"", key, "\"");
  AG_CHECK(it->second.defined() && it->second.numel() == 1, kOp, "load_state_dict(): \"", key,
           "\" must hold one element");
  return it->second.item_double();
}

}  // namespace

GradScaler::GradScaler(GradScalerOptions o) : options_(o), scale_(o.init_scale) {
  AG_CHECK(o.min_scale >= 0 && o.min_scale <= o.max_scale, kOp,
           "expected 0 <= min_scale <= max_scale, got min_scale = ", o.min_scale,
           " and max_scale = ", o.max_scale);
  AG_CHECK(o.init_scale > 0 && std::isfinite(o.init_scale) && o.init_scale >= o.min_scale &&
               o.init_scale <= o.max_scale,
           kOp, "init_scale must be positive, finite and within [min_scale, max_scale] = [",
           o.min_scale, ", ", o.max_scale, "], got ", o.init_scale);
  AG_CHECK(o.growth_factor >= 1, kOp, "growth_factor must be >= 1, got ", o.growth_factor);
  AG_CHECK(o.backoff_factor > 0 && o.backoff_factor <= 1, kOp,
           "backoff_factor must be in (0, 1], got ", o.backoff_factor);
  AG_CHECK(o.growth_interval >= 1, kOp, "growth_interval must be >= 1, got ", o.growth_interval);
}

double GradScaler::get_scale() const { return options_.enabled ? scale_ : 1.0; }

Tensor GradScaler::scale(const Tensor& loss) {
  if (!options_.enabled) return loss;
  AG_CHECK(loss.defined() && loss.is_floating_point(), kOp,
           "scale(): expected a floating loss, got ",
           loss.defined() ? dtype_name(loss.dtype()) : "an undefined tensor");
  const DType dt = loss.dtype() == kFloat64 ? kFloat64 : kFloat32;
  const Tensor s = scalar_tensor(scale_, TensorOptions().dtype(dt).device(loss.device()));
  // The cast is part of the graph, so backward hands the loss a gradient of its own dtype.
  return (loss.dtype() == dt ? loss : loss.to(dt)).mul(s);
}

GradScaler::OptimizerState& GradScaler::state_of(const optim::Optimizer& opt) {
  return per_optimizer_[&opt];
}

void GradScaler::unscale_grads(optim::Optimizer& opt, OptimizerState& st) {
  const double inv_scale = 1.0 / scale_;  // double: exact for powers of two, else within 1 ulp
  // Check every gradient before touching any, so that a refused call changes nothing.
  std::vector<Tensor> params = opt.parameters();
  for (const Tensor& p : params) {
    const Tensor g = p.grad();
    AG_CHECK(!g.defined() || g.dtype() != kFloat16, kOp,
             "unscale_(): attempting to unscale float16 gradients; keep float32 master "
             "parameters (compute in float16, store in float32)");
  }
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (!g.is_contiguous()) {
      g = g.contiguous();
      p.set_grad(g);
    }
    Tensor* flag = nullptr;
    for (auto& [dev, f] : st.found_inf)
      if (dev == g.device()) flag = &f;
    if (!flag) {
      st.found_inf.emplace_back(g.device(), zeros({1}, TensorOptions().dtype(kFloat32).device(g.device())));
      flag = &st.found_inf.back().second;
    }
    backend(g.device(), "GradScaler::unscale_").amp_unscale_and_check(g, inv_scale, *flag);
    ++g.unsafe_impl()->storage->version;  // an in-place write, like every other one
  }
  st.read = false;
}

bool GradScaler::overflowed(OptimizerState& st) {
  if (!st.read) {
    st.overflow = false;
    for (auto& [dev, f] : st.found_inf) st.overflow |= f.item_double() != 0.0;
    st.read = true;
  }
  return st.overflow;
}

void GradScaler::unscale_(optim::Optimizer& opt) {
  if (!options_.enabled) return;
  OptimizerState& st = state_of(opt);
  AG_CHECK(st.stage != Stage::Unscaled, kOp,
           "unscale_() has already been called on this optimizer since the last update()");
  AG_CHECK(st.stage != Stage::Stepped, kOp, "unscale_() is being called after step()");
  unscale_grads(opt, st);
  st.stage = Stage::Unscaled;
}

bool GradScaler::step(optim::Optimizer& opt) {
  if (!options_.enabled) {
    opt.step();
    return true;
  }
  OptimizerState& st = state_of(opt);
  AG_CHECK(st.stage != Stage::Stepped, kOp,
           "step() has already been called on this optimizer since the last update()");
  if (st.stage == Stage::Ready) unscale_grads(opt, st);
  AG_CHECK(!st.found_inf.empty(), kOp,
           "step(): no inf checks were recorded for this optimizer (none of its parameters "
           "has a gradient)");
  st.stage = Stage::Unscaled;  // should opt.step() throw, a retry must not unscale again
  const bool skip = overflowed(st);
  if (skip) ++skipped_steps_;
  else opt.step();
  st.stage = Stage::Stepped;
  return !skip;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  bool any_check = false, found = false;
  for (auto& [opt, st] : per_optimizer_) {
    if (st.found_inf.empty()) continue;
    any_check = true;
    found |= overflowed(st);
  }
  AG_CHECK(any_check, kOp,
           "update(): no inf checks were recorded since the last update(); call step() or "
           "unscale_() first");
  if (found) {
    scale_ = std::max(scale_ * options_.backoff_factor, options_.min_scale);
    growth_tracker_ = 0;
    last_overflow_step_ = num_updates_;
  } else if (++growth_tracker_ >= options_.growth_interval) {
    // The scale is applied as a float32 tensor, so growth beyond float32 is refused.
    const double grown = scale_ * options_.growth_factor;
    if (grown <= kFloatMax) scale_ = std::min(grown, options_.max_scale);
    growth_tracker_ = 0;
  }
  ++num_updates_;
  per_optimizer_.clear();
}

void GradScaler::update(double new_scale) {
  if (!options_.enabled) return;
  AG_CHECK(new_scale > 0 && std::isfinite(new_scale), kOp,
           "update(new_scale): expected a positive finite scale, got ", new_scale);
  scale_ = new_scale;
  per_optimizer_.clear();
}

std::map<std::string, Tensor> GradScaler::state_dict() const {
  if (!options_.enabled) return {};
  auto f64 = [](double v) { return scalar_tensor(v, TensorOptions().dtype(kFloat64)); };
  auto i64 = [](int64_t v) { return scalar_tensor(v, TensorOptions().dtype(kInt64)); };
  return {{"scale", f64(scale_)},
          {"growth_factor", f64(options_.growth_factor)},
          {"backoff_factor", f64(options_.backoff_factor)},
          {"growth_interval", i64(options_.growth_interval)},
          {"growth_tracker", i64(growth_tracker_)},
          {"min_scale", f64(options_.min_scale)},
          {"max_scale", f64(options_.max_scale)},
          {"skipped_steps", i64(skipped_steps_)},
          {"num_updates", i64(num_updates_)},
          {"last_overflow_step", i64(last_overflow_step_)}};
}

void GradScaler::load_state_dict(const std::map<std::string, Tensor>& d) {
  if (!options_.enabled) return;
  AG_CHECK(!d.empty(), kOp,
           "load_state_dict(): the state dict is empty, possibly because it was saved from a "
           "disabled GradScaler");
  // Read everything before assigning, so a bad dict leaves the scaler as it was.
  const double scale = get_double(d, "scale");
  const double growth = get_double(d, "growth_factor");
  const double backoff = get_double(d, "backoff_factor");
  const auto interval = int64_t(get_double(d, "growth_interval"));
  const auto tracker = int64_t(get_double(d, "growth_tracker"));
  auto opt = [&](const char* key, double dflt) { return d.count(key) ? get_double(d, key) : dflt; };
  GradScalerOptions o = options_;
  o.init_scale = scale;
  o.growth_factor = growth;
  o.backoff_factor = backoff;
  o.growth_interval = interval;
  o.min_scale = opt("min_scale", o.min_scale);
  o.max_scale = opt("max_scale", o.max_scale);
  const GradScaler checked(o);  // the constructor validates the combination
  options_ = checked.options_;
  scale_ = scale;
  growth_tracker_ = tracker;
  skipped_steps_ = int64_t(opt("skipped_steps", double(skipped_steps_)));
  num_updates_ = int64_t(opt("num_updates", double(num_updates_)));
  last_overflow_step_ = int64_t(opt("last_overflow_step", double(last_overflow_step_)));
}

}  // namespace ampgrad

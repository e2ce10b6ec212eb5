// GradScaler: the per-optimizer state machine (on the host) over state that lives on the
// device (see the header and docs/grad-scaler.md). Per iteration: one scale_and_check call
// per optimizer and device, the optimizers' fused steps that skip themselves on the
// device, and one update_scale call; nothing is read back.
//
// Reference: kernels/reference/include/ampgrad/reference/grad_scaler.h (float64, the specification).
#include "ampgrad/optim/grad_scaler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <vector>

#include "ampgrad/autograd.h"
#include "ampgrad/backend.h"
#include "ampgrad/factories.h"
#include "ampgrad/ops/elementwise.h"
#include "ampgrad/ops/reduce.h"
#include "ampgrad/optim/optimizer.h"
#include "ampgrad/state_number.h"

namespace ampgrad {
namespace {

constexpr const char* kOp = "GradScaler";

// The loss and the gradients are multiplied by the scale and by its reciprocal in float32:
// both must be finite and non-zero there, so the scale is a normal float32 number.
bool float32_scale(double s) {
  return s >= double(std::numeric_limits<float>::min()) && s <= double(std::numeric_limits<float>::max());
}
constexpr const char* kScaleRange = "a positive normal float32 number, in [2^-126, 3.4e38]";

const Tensor& get(const std::map<std::string, Tensor>& d, const std::string& key) {
  auto it = d.find(key);
  AG_CHECK(it != d.end(), kOp, "load_state_dict(): missing key \"", key, "\"");
  return it->second;
}

double get_double(const std::map<std::string, Tensor>& d, const std::string& key) {
  return detail::state_double(get(d, key), "GradScaler::load_state_dict", key);
}

int64_t get_int(const std::map<std::string, Tensor>& d, const std::string& key, int64_t lo,
                int64_t hi = std::numeric_limits<int64_t>::max()) {
  return detail::state_int(get(d, key), "GradScaler::load_state_dict", key, lo, hi);
}

}  // namespace

GradScaler::GradScaler(GradScalerOptions o) : options_(o) {
  AG_CHECK(o.min_scale >= 0 && o.min_scale <= o.max_scale, kOp,
           "expected 0 <= min_scale <= max_scale, got min_scale = ", o.min_scale,
           " and max_scale = ", o.max_scale);
  AG_CHECK(float32_scale(o.init_scale) && o.init_scale >= o.min_scale && o.init_scale <= o.max_scale, kOp,
           "init_scale must be ", kScaleRange, ", within [min_scale, max_scale] = [", o.min_scale, ", ",
           o.max_scale, "], got ", o.init_scale);
  AG_CHECK(o.growth_factor >= 1, kOp, "growth_factor must be >= 1, got ", o.growth_factor);
  AG_CHECK(o.backoff_factor > 0 && o.backoff_factor <= 1, kOp,
           "backoff_factor must be in (0, 1], got ", o.backoff_factor);
  AG_CHECK(o.growth_interval >= 1, kOp, "growth_interval must be >= 1, got ", o.growth_interval);
  // On the CPU until the scaler first sees the parameters' device (place()).
  scale_ = full({}, o.init_scale, TensorOptions(kFloat64));
  growth_tracker_ = zeros({}, TensorOptions(kInt64));
  skipped_steps_ = zeros({}, TensorOptions(kInt64));
  last_overflow_step_ = full({}, -1, TensorOptions(kInt64));
}

void GradScaler::place(Device device) {
  if (scale_.device() == device) return;
  // A copy from the host (or between devices): never a host sync.
  scale_ = scale_.to(device);
  growth_tracker_ = growth_tracker_.to(device);
  skipped_steps_ = skipped_steps_.to(device);
  last_overflow_step_ = last_overflow_step_.to(device);
}

double GradScaler::get_scale() const { return options_.enabled ? scale_.item<double>() : 1.0; }

Tensor GradScaler::scale(const Tensor& loss) {
  if (!options_.enabled) return loss;
  AG_CHECK(loss.defined() && loss.is_floating_point(), kOp,
           "scale(): expected a floating loss, got ",
           loss.defined() ? dtype_name(loss.dtype()) : "an undefined tensor");
  if (scale_.device().is_cpu() && !loss.device().is_cpu()) place(loss.device());
  const DType dt = loss.dtype() == kFloat64 ? kFloat64 : kFloat32;
  Tensor s;
  {
    NoGradGuard ng;
    s = scale_.to(dt).to(loss.device());
  }
  // The cast is part of the graph, so backward hands the loss a gradient of its own dtype.
  return (loss.dtype() == dt ? loss : loss.to(dt)).mul(s);
}

GradScaler::OptimizerState& GradScaler::state_of(const optim::Optimizer& opt) {
  return per_optimizer_[&opt];
}

void GradScaler::unscale_grads(optim::Optimizer& opt, OptimizerState& st) {
  NoGradGuard ng;
  // Check every gradient before touching any, so that a refused call changes nothing.
  std::vector<Tensor> params = opt.parameters();
  for (const Tensor& p : params) {
    const Tensor g = p.grad();
    AG_CHECK(!g.defined() || g.dtype() != kFloat16, kOp,
             "unscale_(): attempting to unscale float16 gradients; keep float32 master "
             "parameters (compute in float16, store in float32)");
  }
  const auto by_device = gradients_by_device(params);
  if (!by_device.empty() && scale_.device().is_cpu()) place(by_device.front().first);
  for (auto& [dev, grads] : by_device) {
    Tensor* flag = nullptr;
    for (auto& [d, f] : st.found_inf)
      if (d == dev) flag = &f;
    if (!flag) {
      st.found_inf.emplace_back(dev, zeros({1}, TensorOptions().dtype(kFloat32).device(dev)));
      flag = &st.found_inf.back().second;
    }
    // 1 / scale in float64 on the device: exact for powers of two, else within 1 ulp.
    const Tensor inv_scale = reciprocal(scale_.to(dev));
    backend(dev, "GradScaler::unscale_").scale_and_check(grads, inv_scale, *flag);
    for (const Tensor& g : grads) detail::bump_version(g);  // in-place writes, like every other
  }
  // One flag on the scale's device for the optimizer's step and for update().
  st.any_inf = Tensor();
  for (auto& [d, f] : st.found_inf) {
    const Tensor here = f.to(scale_.device());
    st.any_inf = st.any_inf.defined() ? add(st.any_inf, here) : here;
  }
  if (reduce_found_inf_ && st.any_inf.defined()) reduce_found_inf_(st.any_inf);
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

StepResult GradScaler::step(optim::Optimizer& opt) {
  if (!options_.enabled) return opt.step();
  OptimizerState& st = state_of(opt);
  AG_CHECK(st.stage != Stage::Stepped, kOp,
           "step() has already been called on this optimizer since the last update()");
  if (st.stage == Stage::Ready) unscale_grads(opt, st);
  AG_CHECK(!st.found_inf.empty(), kOp,
           "step(): no inf checks were recorded for this optimizer (none of its parameters "
           "has a gradient)");
  st.stage = Stage::Unscaled;  // should opt.step() throw, a retry must not unscale again
  const StepResult r = opt.step(st.any_inf);
  {
    NoGradGuard ng;
    skipped_steps_.add_(ne(st.any_inf, 0.0).to(kInt64).sum());
  }
  st.stage = Stage::Stepped;
  return r;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  NoGradGuard ng;
  Tensor found;
  for (auto& [opt, st] : per_optimizer_) {
    if (!st.any_inf.defined()) continue;
    found = found.defined() ? add(found, st.any_inf) : st.any_inf;
  }
  AG_CHECK(found.defined(), kOp,
           "update(): no inf checks were recorded since the last update(); call step() or "
           "unscale_() first");
  backend(scale_.device(), "GradScaler::update")
      .update_scale(scale_, growth_tracker_, found,
                    {.growth_factor = options_.growth_factor, .backoff_factor = options_.backoff_factor,
                     .min_scale = options_.min_scale, .max_scale = options_.max_scale,
                     .growth_interval = options_.growth_interval});
  last_overflow_step_.copy_(where(eq(found, 0.0), last_overflow_step_, Scalar(num_updates_)).reshape({}));
  ++num_updates_;
  per_optimizer_.clear();
}

void GradScaler::update(double new_scale) {
  if (!options_.enabled) return;
  AG_CHECK(float32_scale(new_scale), kOp, "update(new_scale): the scale must be ", kScaleRange, ", got ",
           new_scale);
  NoGradGuard ng;
  scale_.fill_(new_scale);
  per_optimizer_.clear();
}

std::map<std::string, Tensor> GradScaler::state_dict() const {
  if (!options_.enabled) return {};
  auto f64 = [](double v) { return scalar_tensor(v, TensorOptions().dtype(kFloat64)); };
  auto i64 = [](int64_t v) { return scalar_tensor(v, TensorOptions().dtype(kInt64)); };
  return {{"scale", scale_.clone()},
          {"growth_factor", f64(options_.growth_factor)},
          {"backoff_factor", f64(options_.backoff_factor)},
          {"growth_interval", i64(options_.growth_interval)},
          {"growth_tracker", growth_tracker_.clone()},
          {"min_scale", f64(options_.min_scale)},
          {"max_scale", f64(options_.max_scale)},
          {"skipped_steps", skipped_steps_.clone()},
          {"num_updates", i64(num_updates_)},
          {"last_overflow_step", last_overflow_step_.clone()}};
}

void GradScaler::load_state_dict(const std::map<std::string, Tensor>& d) {
  if (!options_.enabled) return;
  AG_CHECK(!d.empty(), kOp,
           "load_state_dict(): the state dict is empty, possibly because it was saved from a "
           "disabled GradScaler");
  // Read everything before assigning, so a bad dict leaves the scaler as it was. Every
  // key is known, and every number passes the constructor's rules (the counters: integers,
  // the growth tracker within its interval).
  static const std::set<std::string> known{"scale",     "growth_factor", "backoff_factor", "growth_interval",
                                           "growth_tracker", "min_scale", "max_scale",    "skipped_steps",
                                           "num_updates",    "last_overflow_step"};
  for (const auto& [k, v] : d)
    AG_CHECK(known.count(k), kOp, "load_state_dict(): unexpected key \"", k, "\"");
  const double scale = get_double(d, "scale");
  AG_CHECK(float32_scale(scale), kOp, "load_state_dict(): \"scale\" must be ", kScaleRange, ", got ", scale);
  const double growth = get_double(d, "growth_factor");
  const double backoff = get_double(d, "backoff_factor");
  const int64_t interval = get_int(d, "growth_interval", 1);
  const int64_t tracker = get_int(d, "growth_tracker", 0, interval - 1);
  auto opt = [&](const char* key, double dflt) { return d.count(key) ? get_double(d, key) : dflt; };
  GradScalerOptions o = options_;
  o.init_scale = scale;
  o.growth_factor = growth;
  o.backoff_factor = backoff;
  o.growth_interval = interval;
  o.min_scale = opt("min_scale", o.min_scale);
  o.max_scale = opt("max_scale", o.max_scale);
  const GradScaler checked(o);  // the constructor validates the combination
  const int64_t skipped = d.count("skipped_steps") ? get_int(d, "skipped_steps", 0) : skipped_steps();
  const int64_t updates = d.count("num_updates") ? get_int(d, "num_updates", 0) : num_updates_;
  const int64_t last_overflow =
      d.count("last_overflow_step") ? get_int(d, "last_overflow_step", -1) : last_overflow_step();
  options_ = checked.options_;
  NoGradGuard ng;
  scale_.fill_(scale);
  growth_tracker_.fill_(tracker);
  skipped_steps_.fill_(skipped);
  num_updates_ = updates;
  last_overflow_step_.fill_(last_overflow);
}

}  // namespace ampgrad

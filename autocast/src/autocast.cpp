// Autocast state (per thread, per device type), the guard, the cast cache and the hook
// that core's ops reach through dispatch::autocast before they record autograd.
#include <memory>
#include <unordered_map>

#include "ampgrad/autocast/autocast.h"
#include "ampgrad/autograd.h"
#include "ampgrad/cast_shadow.h"
#include "ampgrad/dispatch.h"
#include "ampgrad/hw/profile.h"
#include "ampgrad/ops/elementwise.h"

namespace ampgrad {

const char* cast_policy_name(CastPolicy p) {
  switch (p) {
    case CastPolicy::LowerPrecision: return "lower_precision";
    case CastPolicy::Float32: return "float32";
    case CastPolicy::Promote: return "promote";
    case CastPolicy::PassThrough: return "pass_through";
  }
  return "?";
}

namespace autocast {
namespace {

struct State {
  bool enabled = false;
  DType dtype;
  bool cache_enabled = true;
  int depth = 0;
};

struct CacheKey {
  const TensorImpl* src;
  uint64_t version;
  DType dtype;
  bool grad_mode;
  bool operator==(const CacheKey& o) const {
    return src == o.src && version == o.version && dtype == o.dtype && grad_mode == o.grad_mode;
  }
};
struct CacheKeyHash {
  size_t operator()(const CacheKey& k) const {
    return std::hash<const void*>()(k.src) ^ (k.version * 0x9E3779B97F4A7C15ull) ^
           (size_t(k.dtype) << 1) ^ size_t(k.grad_mode);
  }
};
struct CacheEntry {
  std::weak_ptr<TensorImpl> src;  // guards against a freed parameter's address being reused
  Tensor cast;
};

struct ThreadState {
  State st[kNumDeviceTypes] = {{false, kBFloat16, true, 0}, {false, kFloat16, true, 0}};
  int enabled_count = 0;
  std::unordered_map<CacheKey, CacheEntry, CacheKeyHash> cache;
};

thread_local ThreadState t_state;

State& state(DeviceType t) { return t_state.st[int(t)]; }

// A leaf parameter that owns its whole storage: the only kind the cache keeps.
bool cacheable(const Tensor& t) {
  return t.dtype() == kFloat32 && t.is_leaf() && t.requires_grad() && t.storage_offset() == 0 &&
         t.nbytes() == t.unsafe_impl()->storage->nbytes;
}

Tensor cast_to(const Tensor& t, DType dtype, const State& s) {
  if (t.dtype() == dtype) return t;
  if (!s.cache_enabled || !cacheable(t)) return t.to(dtype);
  const CacheKey key{t.unsafe_impl(), t.version(), dtype, GradMode::is_enabled()};
  auto it = t_state.cache.find(key);
  if (it != t_state.cache.end() && it->second.src.lock().get() == t.unsafe_impl()) return it->second.cast;
  // The rounding that the last optimizer step wrote (ampgrad/cast_shadow.h), else a cast
  // whose buffer the next step rewrites.
  Tensor c;
  if (Tensor sh = detail::shadow_cast(t, dtype); sh.defined()) {
    c = detail::cast_from_shadow(t, sh);
  } else {
    c = t.to(dtype);
    detail::keep_cast(t, c);
  }
  t_state.cache[key] = {t.impl_ptr(), c};
  return c;
}

// Floating tensors of the guarded device type, except float64.
bool eligible(const Tensor& t, DeviceType type) {
  return t.defined() && t.is_floating_point() && t.dtype() != kFloat64 && t.device().type == type;
}

}  // namespace

// The engine's backward pass excludes autocast (dispatch::ExcludeAutocastGuard): there it
// is off, whatever guards are open.
bool is_enabled(DeviceType t) { return state(t).enabled && !dispatch::autocast_excluded(); }
DType get_dtype(DeviceType t) { return state(t).dtype; }
bool is_cache_enabled(DeviceType t) { return state(t).cache_enabled; }
int depth(DeviceType t) { return state(t).depth; }
size_t cache_size() { return t_state.cache.size(); }
bool any_enabled() { return t_state.enabled_count > 0 && !dispatch::autocast_excluded(); }

std::vector<DType> cast_dtypes(OpName op, DeviceType type, DType autocast_dtype,
                               const std::vector<DType>& inputs) {
  std::vector<DType> out = inputs;
  auto castable = [](DType d) { return is_floating(d) && d != kFloat64; };
  const CastPolicy p = policy(op, type);
  if (p == CastPolicy::PassThrough) return out;
  DType target = p == CastPolicy::Float32 ? kFloat32 : autocast_dtype;
  if (p == CastPolicy::Promote) {
    // The widest castable floating dtype among the inputs: low precision only when every
    // floating input already is.
    bool any = false;
    for (DType d : inputs)
      if (castable(d)) {
        target = any ? promote_types(target, d) : d;
        any = true;
      }
    if (!any) return out;
  }
  for (DType& d : out)
    if (castable(d)) d = target;
  return out;
}

std::vector<Tensor> cast_inputs(OpName op, std::vector<Tensor> inputs) {
  if (!any_enabled()) return inputs;
  const Tensor* first = nullptr;
  for (const Tensor& t : inputs)
    if (t.defined()) {
      first = &t;
      break;
    }
  if (!first) return inputs;
  const DeviceType type = first->device().type;
  const State& s = state(type);
  if (!s.enabled) return inputs;
  // Tensors of another device type are not this region's to cast.
  std::vector<DType> dts;
  for (const Tensor& t : inputs)
    dts.push_back(eligible(t, type) ? t.dtype() : kInt64);
  const std::vector<DType> target = cast_dtypes(op, type, s.dtype, dts);
  for (size_t i = 0; i < inputs.size(); ++i)
    if (eligible(inputs[i], type) && target[i] != inputs[i].dtype()) inputs[i] = cast_to(inputs[i], target[i], s);
  return inputs;
}

std::optional<std::vector<Tensor>> cast_if_needed(OpId op, const std::vector<Tensor>& inputs) {
  if (!any_enabled()) return std::nullopt;
  std::vector<Tensor> out = cast_inputs(OpName{op}, inputs);
  for (size_t i = 0; i < out.size(); ++i)
    if (out[i].unsafe_impl() != inputs[i].unsafe_impl()) return out;
  return std::nullopt;
}

}  // namespace autocast

namespace {
void check_supported(DeviceType type, DType dtype) {
  AG_CHECK(is_reduced_floating(dtype) || dtype == kFloat32, "AutocastGuard",
           "autocast casts to float16, bfloat16 or float32, got ", dtype_name(dtype));
  const hw::Verdict v = hw::verdict(hw::query(), Device(type), dtype);
  if (v.support == hw::Support::Unsupported) {
    const DType other = dtype == kFloat16 ? kBFloat16 : kFloat16;
    const bool other_ok = hw::verdict(hw::query(), Device(type), other).support != hw::Support::Unsupported;
    AG_ERROR("AutocastGuard", dtype_name(dtype), " is unsupported on ", device_type_name(type), ": ", v.reason,
             other_ok ? std::string("; use ") + dtype_name(other) + " instead" : std::string("; use float32"));
  }
}
}  // namespace

AutocastGuard::AutocastGuard(DeviceType t, DType dtype, bool enabled, bool cache_enabled) : type_(t) {
  if (enabled) check_supported(t, dtype);
  auto& s = autocast::state(t);
  prev_enabled_ = s.enabled;
  prev_cache_ = s.cache_enabled;
  prev_dtype_ = s.dtype;
  s.enabled = enabled;
  s.dtype = dtype;
  s.cache_enabled = cache_enabled;
  ++s.depth;
  // Core's ops call the hook only while this thread's flag is up; installing the hook here,
  // on every path that can raise the flag, keeps it from depending on static registration
  // (which a static library's linker may drop).
  if (enabled) dispatch::set_autocast_hook(&autocast::cast_if_needed);
  autocast::t_state.enabled_count += int(s.enabled) - int(prev_enabled_);
  dispatch::set_autocast_enabled(autocast::t_state.enabled_count > 0);
}

AutocastGuard::AutocastGuard(DeviceType t, bool enabled)
    : AutocastGuard(t, autocast::state(t).dtype, enabled, autocast::state(t).cache_enabled) {}

AutocastGuard::~AutocastGuard() {
  auto& s = autocast::state(type_);
  autocast::t_state.enabled_count += int(prev_enabled_) - int(s.enabled);
  dispatch::set_autocast_enabled(autocast::t_state.enabled_count > 0);
  s.enabled = prev_enabled_;
  s.dtype = prev_dtype_;
  s.cache_enabled = prev_cache_;
  if (--s.depth == 0) {
    // The outermost region of this device type ends; the cache empties when no region of
    // any device type remains.
    bool any_open = false;
    for (int i = 0; i < kNumDeviceTypes; ++i) any_open = any_open || autocast::t_state.st[i].depth > 0;
    if (!any_open) autocast::t_state.cache.clear();
  }
}

}  // namespace ampgrad

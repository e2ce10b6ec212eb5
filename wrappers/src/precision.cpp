// Precision strings, accelerator and precision resolution, and the six plugins.
#include "ampgrad/wrappers/precision.h"

#include <algorithm>
#include <cstdlib>
#include <set>
#include <sstream>

#include "ampgrad/error.h"

namespace ampgrad {

namespace {

constexpr Precision kAll[] = {Precision::True32,  Precision::True64, Precision::Mixed16,
                              Precision::MixedBF16, Precision::True16, Precision::TrueBF16};

std::string allowed_values() {
  std::string s;
  for (Precision p : kAll) s += std::string("\"") + precision_name(p) + "\", ";
  return s + "\"auto\", \"auto:measure\" (or the old \"32\", \"64\", \"16\", \"bf16\")";
}

}  // namespace

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::True32: return "32-true";
    case Precision::True64: return "64-true";
    case Precision::Mixed16: return "16-mixed";
    case Precision::MixedBF16: return "bf16-mixed";
    case Precision::True16: return "16-true";
    case Precision::TrueBF16: return "bf16-true";
  }
  return "?";
}

DType parameter_dtype(Precision p) {
  switch (p) {
    case Precision::True64: return kFloat64;
    case Precision::True16: return kFloat16;
    case Precision::TrueBF16: return kBFloat16;
    default: return kFloat32;
  }
}

DType compute_dtype(Precision p) {
  switch (p) {
    case Precision::Mixed16: return kFloat16;
    case Precision::MixedBF16: return kBFloat16;
    default: return parameter_dtype(p);
  }
}

bool is_mixed(Precision p) { return p == Precision::Mixed16 || p == Precision::MixedBF16; }

std::optional<Precision> precision_from_name(std::string_view s) {
  for (Precision p : kAll)
    if (s == precision_name(p)) return p;
  return std::nullopt;
}

PrecisionRequest parse_precision(std::string_view s) {
  if (auto p = precision_from_name(s)) return {*p, ""};
  if (s == "auto") return {std::nullopt, ""};
  if (s == "auto:measure") return {std::nullopt, "", true};
  struct Old {
    const char* name;
    Precision p;
  };
  for (const Old& o : {Old{"32", Precision::True32}, Old{"64", Precision::True64}, Old{"16", Precision::Mixed16},
                       Old{"bf16", Precision::MixedBF16}})
    if (s == o.name)
      return {o.p, std::string("precision \"") + o.name + "\" is deprecated; use \"" + precision_name(o.p) + "\""};
  AG_ERROR("precision", "unknown precision \"", s, "\"; allowed: ", allowed_values());
}

std::string default_precision_string() {
  const char* env = std::getenv("AMPGRAD_PRECISION");
  return env && *env ? std::string(env) : std::string("32-true");
}

// ---- accelerator ---------------------------------------------------------------------------

AcceleratorChoice resolve_accelerator(std::string_view acc, const hw::HardwareProfile& profile) {
  const auto why_no_cuda = [&]() -> std::string {
    if (!profile.built_with_cuda) return "ampgrad was built without CUDA";
    return "no CUDA device was found (no GPU, or no driver)";
  };
  if (acc == "cpu") return {{Device(kCPU)}, "the CPU was requested"};
  if (acc == "auto") {
    if (profile.built_with_cuda && !profile.cuda.empty())
      return {{Device(kCUDA, 0)}, "auto: a CUDA device is present (" + profile.cuda[0].name + ")"};
    return {{Device(kCPU)}, "auto: the CPU, because " + why_no_cuda()};
  }
  if (acc == "cuda" || acc == "gpu" || acc.rfind("cuda:", 0) == 0) {
    // The string is parsed before anything is asked of the hardware: a malformed list is a
    // mistake in the string on any machine. Items are plain decimal numbers (no sign, no
    // spaces), one per comma.
    std::vector<int> indices;
    if (acc.rfind("cuda:", 0) == 0) {
      std::string_view list = acc.substr(5);
      while (true) {
        const size_t comma = list.find(',');
        const std::string_view item = list.substr(0, comma);
        const bool digits = !item.empty() && item.size() <= 7 &&
                            std::all_of(item.begin(), item.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
        AG_CHECK(digits, "accelerator", "bad CUDA device list in \"", acc, "\": ",
                 item.empty() ? std::string("an empty item") : std::string("\"").append(item).append("\" is not a device index"),
                 "; expected \"cuda\", \"cuda:N\" or \"cuda:N,M,...\"");
        indices.push_back(std::stoi(std::string(item)));
        if (comma == std::string_view::npos) break;
        list = list.substr(comma + 1);
      }
    }
    AG_CHECK(profile.built_with_cuda && !profile.cuda.empty(), "accelerator", "accelerator \"", acc,
             "\" was requested, but ", why_no_cuda(), "; use \"cpu\" or \"auto\"");
    AcceleratorChoice c;
    if (acc == "cuda" || acc == "gpu") {
      for (const auto& d : profile.cuda) c.devices.push_back(Device(kCUDA, d.index));
      c.reason = "CUDA was requested: " + std::to_string(c.devices.size()) + " device" +
                 (c.devices.size() == 1 ? "" : "s");
      return c;
    }
    std::set<int> seen;
    for (int idx : indices) {
      AG_CHECK(idx < int(profile.cuda.size()), "accelerator", "cuda:", idx, " does not exist (",
               profile.cuda.size(), " CUDA device", profile.cuda.size() == 1 ? "" : "s", " found)");
      if (seen.insert(idx).second) c.devices.push_back(Device(kCUDA, idx));
    }
    c.reason = "CUDA device" + std::string(c.devices.size() == 1 ? " " : "s ");
    for (size_t i = 0; i < c.devices.size(); ++i) c.reason += (i ? ", " : "") + c.devices[i].str();
    c.reason += " requested";
    return c;
  }
  AG_ERROR("accelerator", "unknown accelerator \"", acc,
           "\"; allowed: \"cpu\", \"cuda\", \"cuda:N\", \"cuda:N,M\", \"gpu\", \"auto\"");
}

// ---- precision resolution -----------------------------------------------------------------

namespace {

// "auto" on the devices in use, with its reason.
std::pair<Precision, std::string> auto_precision(const std::vector<Device>& devices,
                                                 const hw::HardwareProfile& profile) {
  if (devices.front().is_cpu()) {
    // The verdict decides (it knows the build too); the reason names the feature.
    const hw::Verdict v = hw::verdict(profile, devices.front(), kBFloat16);
    const auto& f = profile.cpu;
    if (v.support == hw::Support::Native)
      return {Precision::MixedBF16, std::string("auto: the CPU has ") + (f.amx_bf16 ? "AMX-BF16" : "AVX512-BF16") +
                                        ", so bfloat16 matmuls run natively"};
    if (f.amx_bf16 || f.avx512_bf16)
      return {Precision::True32, "auto: bfloat16 would only be emulated (" + v.reason + "); float32 is faster"};
    return {Precision::True32,
            "auto: the CPU has neither AMX-BF16 nor AVX512-BF16, so bfloat16 would only be emulated "
            "through float32; float32 is faster"};
  }
  // The weakest device decides: lowest compute capability.
  const hw::CudaDevice* weakest = nullptr;
  for (const Device& d : devices) {
    const hw::CudaDevice& c = profile.cuda.at(size_t(d.index));
    if (!weakest || c.cc() < weakest->cc()) weakest = &c;
  }
  const std::string who = "cuda:" + std::to_string(weakest->index) + " (" + weakest->name + ", compute capability " +
                          weakest->compute_capability() + ")" +
                          (devices.size() > 1 ? ", the weakest of the " + std::to_string(devices.size()) + " in use," : "");
  // An emulated device decides as the GPU it emulates: the emulated build tests that GPU's path.
  const std::string emulated =
      profile.cuda_emulated ? " (emulated on the CPU, which decides as that GPU would)" : "";
  if (weakest->bf16_native())
    return {Precision::MixedBF16, "auto: " + who + " has native bfloat16 (8.0+)" + emulated};
  if (weakest->fp16_tensor_cores())
    return {Precision::Mixed16, "auto: " + who +
                                    " has float16 tensor cores but no native bfloat16 (8.0+); float16 needs the "
                                    "grad scaler" + emulated};
  return {Precision::True32,
          "auto: " + who + " has no float16 tensor cores (7.0+) and no native bfloat16 (8.0+)" + emulated};
}

}  // namespace

PrecisionDecision resolve_precision(std::string_view requested, std::string_view accelerator,
                                    const hw::HardwareProfile& profile) {
  const PrecisionRequest req = parse_precision(requested);
  AcceleratorChoice acc = resolve_accelerator(accelerator, profile);
  const auto [auto_p, auto_reason] = auto_precision(acc.devices, profile);
  PrecisionDecision d;
  d.devices = acc.devices;
  d.accelerator_reason = acc.reason;
  d.warning = req.warning;
  if (!req.precision) {
    d.precision = auto_p;
    d.reason = auto_reason;
    if (req.measure) d.reason += "; auto:measure: the table's choice until a trial runs";
    return d;
  }
  d.precision = *req.precision;
  const DType dt = compute_dtype(d.precision);
  std::vector<std::string> emulated;
  for (const Device& dev : acc.devices) {
    const hw::Verdict v = hw::verdict(profile, dev, dt);
    AG_CHECK(v.support != hw::Support::Unsupported, "precision", "precision \"", precision_name(d.precision),
             "\" is unsupported on ", dev.str(), ": ", v.reason, "; \"auto\" would pick \"", precision_name(auto_p),
             "\" there");
    if (v.support == hw::Support::Emulated) emulated.push_back(dev.str() + ": " + v.reason);
  }
  d.reason = std::string("requested explicitly (\"auto\" would pick \"") + precision_name(auto_p) + "\")";
  if (!emulated.empty()) {
    std::string w = std::string("precision \"") + precision_name(d.precision) + "\" runs emulated and slower (";
    for (size_t i = 0; i < emulated.size(); ++i) w += (i ? "; " : "") + emulated[i];
    w += ")";
    d.warning = d.warning.empty() ? w : d.warning + "; " + w;
  }
  return d;
}

// ---- plugins -------------------------------------------------------------------------------

void PrecisionPlugin::convert_module(nn::Module& module) const {
  const DType dt = parameter_dtype(precision_);
  if (dt != kFloat32) module.to(dt);
}

std::unique_ptr<DefaultDTypeGuard> PrecisionPlugin::module_init_context() const {
  return std::make_unique<DefaultDTypeGuard>(parameter_dtype(precision_));
}

Tensor PrecisionPlugin::convert_input(const Tensor& t) const {
  if (!t.defined() || !t.is_floating_point()) return t;
  return t.to(parameter_dtype(precision_));
}

Tensor PrecisionPlugin::convert_output(const Tensor& t, DType dtype) {
  if (!t.defined() || !t.is_floating_point()) return t;
  return t.to(dtype);
}

void PrecisionPlugin::backward(const Tensor& loss) { loss.backward(); }

StepResult PrecisionPlugin::optimizer_step(optim::Optimizer& optimizer) { return optimizer.step(); }

namespace {

// 32-true, 64-true, 16-true and bf16-true: one class each; the base's hooks already do
// what they need from the precision (convert the module and inputs to its dtype).
template <Precision P>
class TruePlugin final : public PrecisionPlugin {
 public:
  explicit TruePlugin(DeviceType t) : PrecisionPlugin(P, t) {}
};

class BF16MixedPlugin final : public PrecisionPlugin {
 public:
  explicit BF16MixedPlugin(DeviceType t) : PrecisionPlugin(Precision::MixedBF16, t) {}
  ForwardContext forward_context() const override { return ForwardContext(device_type(), kBFloat16); }
};

// float16 autocast plus the grad scaler.
class F16MixedPlugin final : public PrecisionPlugin {
 public:
  F16MixedPlugin(DeviceType t, const GradScalerOptions& o) : PrecisionPlugin(Precision::Mixed16, t), scaler_(o) {}
  ForwardContext forward_context() const override { return ForwardContext(device_type(), kFloat16); }
  void backward(const Tensor& loss) override { scaler_.scale(loss).backward(); }
  void unscale_gradients(optim::Optimizer& optimizer) override { scaler_.unscale_(optimizer); }
  StepResult optimizer_step(optim::Optimizer& optimizer) override { return scaler_.step(optimizer); }
  bool scales_loss() const override { return scaler_.is_enabled(); }
  double loss_scale() const override { return scaler_.get_scale(); }
  GradScaler* scaler() override { return &scaler_; }
  std::map<std::string, Tensor> state_dict() const override { return scaler_.state_dict(); }
  void load_state_dict(const std::map<std::string, Tensor>& state) override { scaler_.load_state_dict(state); }

 private:
  GradScaler scaler_;
};

}  // namespace

std::unique_ptr<PrecisionPlugin> make_precision_plugin(Precision p, DeviceType device_type,
                                                       const PrecisionPluginOptions& options) {
  switch (p) {
    case Precision::Mixed16: return std::make_unique<F16MixedPlugin>(device_type, options.scaler);
    case Precision::MixedBF16: return std::make_unique<BF16MixedPlugin>(device_type);
    case Precision::True32: return std::make_unique<TruePlugin<Precision::True32>>(device_type);
    case Precision::True64: return std::make_unique<TruePlugin<Precision::True64>>(device_type);
    case Precision::True16: return std::make_unique<TruePlugin<Precision::True16>>(device_type);
    case Precision::TrueBF16: return std::make_unique<TruePlugin<Precision::TrueBF16>>(device_type);
  }
  AG_ERROR("precision", "unknown precision value ", int(p));
}

}  // namespace ampgrad

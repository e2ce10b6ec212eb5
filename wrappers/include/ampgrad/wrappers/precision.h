// Precision: the six training precisions, "auto", and one plugin class per precision.
//
//   "32-true"    float32 parameters and compute (the default)
//   "64-true"    float64 parameters and compute
//   "16-mixed"   float32 parameters, float16 autocast in forward, grad scaler
//   "bf16-mixed" float32 parameters, bfloat16 autocast in forward (no scaler needed)
//   "16-true"    float16 parameters and inputs (optional float32 master weights)
//   "bf16-true"  bfloat16 parameters and inputs (optional float32 master weights)
//   "auto"       resolve_precision() picks one from the hardware, and says why
//   "auto:measure" the same until Lite::measure_precision() runs a trial on the model
//                and switches to what it measured best (precision_trial.h)
//
// The old spellings "32", "64", "16" and "bf16" are accepted (mapped to 32-true, 64-true,
// 16-mixed, bf16-mixed) with a one-line deprecation warning; anything else is an error that
// lists every allowed value. docs/precision.md has the resolution table.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ampgrad/autocast/autocast.h"
#include "ampgrad/optim/grad_scaler.h"
#include "ampgrad/hw/profile.h"
#include "ampgrad/nn/module.h"
#include "ampgrad/optim/optimizer.h"

namespace ampgrad {

enum class Precision { True32, True64, Mixed16, MixedBF16, True16, TrueBF16 };

/// "32-true", "64-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true".
const char* precision_name(Precision p);
/// The dtype the parameters are kept in (float32 for the mixed precisions).
DType parameter_dtype(Precision p);
/// The dtype the heavy ops compute in (the autocast dtype for the mixed precisions).
DType compute_dtype(Precision p);
bool is_mixed(Precision p);
/// The precision whose precision_name() is s; nullopt for anything else ("auto" and the
/// old spellings included).
std::optional<Precision> precision_from_name(std::string_view s);

/// What a precision string asked for: a precision, or "auto".
struct PrecisionRequest {
  std::optional<Precision> precision;  ///< nullopt: "auto" or "auto:measure"
  /// A one-line deprecation warning for an old spelling ("16" -> "16-mixed"); else empty.
  std::string warning;
  /// "auto:measure": a trial on the model may decide (Lite::measure_precision).
  bool measure = false;
};

/// Parses a precision string (see the list above). Throws ag::Error listing every allowed
/// value for anything else.
PrecisionRequest parse_precision(std::string_view s);

/// The precision to use when the program passes none: AMPGRAD_PRECISION from the
/// environment if set and not empty, else "32-true".
std::string default_precision_string();

/// The devices an accelerator string stands for.
struct AcceleratorChoice {
  /// The devices in use: {cpu}, or the CUDA devices ("cuda" means all of them).
  std::vector<Device> devices;
  /// Why this accelerator (for "auto": CUDA present or not).
  std::string reason;
};

/// Resolves "cpu", "cuda", "cuda:N", "cuda:N,M", "gpu" (= "cuda") or "auto" (CUDA when
/// built with it and a device is present, else the CPU) against `profile`. Throws
/// ag::Error for an unknown string, for CUDA without the build, a driver or a device, and
/// for a device index that does not exist.
AcceleratorChoice resolve_accelerator(std::string_view accelerator, const hw::HardwareProfile& profile);

/// The precision chosen and the sentence that says why.
struct PrecisionDecision {
  Precision precision = Precision::True32;
  std::string reason;
  /// The devices in use, and why that accelerator (from resolve_accelerator).
  std::vector<Device> devices;
  std::string accelerator_reason;
  /// One line when an explicit precision runs emulated (correct but slower) on one of the
  /// devices, or a deprecated spelling was used; else empty.
  std::string warning;
};

/// Decides the precision for `requested` (a precision string, "auto" included) on
/// `accelerator`, as a pure function of its arguments. "auto":
///   - CUDA with native bfloat16 (compute capability 8.0+): bf16-mixed;
///   - CUDA with float16 tensor cores but no bfloat16 (7.x): 16-mixed, with the scaler;
///   - a CPU with AMX-BF16 or AVX512-BF16: bf16-mixed;
///   - anything else: 32-true, and the reason says what was missing.
///   Several CUDA devices: the weakest of those in use decides.
/// An explicit precision whose dtype the hardware verdict calls unsupported on a device in
/// use throws ag::Error naming the device, what it lacks and what "auto" would pick; an
/// emulated one is accepted with `warning` set.
PrecisionDecision resolve_precision(std::string_view requested, std::string_view accelerator,
                                    const hw::HardwareProfile& profile);

/// Restores the default dtype on destruction (see PrecisionPlugin::module_init_context).
class DefaultDTypeGuard {
 public:
  explicit DefaultDTypeGuard(DType dtype) : prev_(get_default_dtype()) { set_default_dtype(dtype); }
  ~DefaultDTypeGuard() { set_default_dtype(prev_); }
  DefaultDTypeGuard(const DefaultDTypeGuard&) = delete;
  DefaultDTypeGuard& operator=(const DefaultDTypeGuard&) = delete;

 private:
  DType prev_;
};

/// An autocast region for the mixed precisions, nothing for the others. Movable, so that
/// Lite::autocast() can return one.
class ForwardContext {
 public:
  ForwardContext() = default;
  ForwardContext(DeviceType device_type, DType dtype)
      : guard_(std::make_unique<AutocastGuard>(device_type, dtype)) {}
  bool active() const { return guard_ != nullptr; }

 private:
  std::unique_ptr<AutocastGuard> guard_;
};

/// What a precision does at each point of training. One subclass per precision, made by
/// make_precision_plugin; the Lite wrappers call these hooks and nothing else.
class PrecisionPlugin {
 public:
  virtual ~PrecisionPlugin() = default;
  Precision precision() const { return precision_; }
  /// The device type autocast regions refer to.
  DeviceType device_type() const { return device_type_; }

  /// Converts the module's parameters and floating buffers in place (the -true
  /// precisions other than 32-true); no-op otherwise.
  virtual void convert_module(nn::Module& module) const;
  /// Sets the default dtype to the parameter dtype while a model is built in it.
  std::unique_ptr<DefaultDTypeGuard> module_init_context() const;
  /// A floating tensor converted to the parameter dtype; integer and bool tensors (and
  /// undefined ones) unchanged.
  Tensor convert_input(const Tensor& t) const;
  /// The region the wrapped forward runs in: autocast for the mixed precisions.
  virtual ForwardContext forward_context() const { return {}; }
  /// A floating output converted to `dtype`; integer and bool tensors unchanged.
  static Tensor convert_output(const Tensor& t, DType dtype);
  /// Runs backward from the loss (scaled under 16-mixed).
  virtual void backward(const Tensor& loss);
  /// Divides the optimizer's gradients by the loss scale (16-mixed); no-op otherwise.
  virtual void unscale_gradients(optim::Optimizer& optimizer) { (void)optimizer; }
  /// Steps the optimizer unless its gradients overflowed (16-mixed: decided on the device);
  /// the result's bool, whether it stepped, is a host sync when decided there.
  virtual StepResult optimizer_step(optim::Optimizer& optimizer);
  /// Whether backward() scales the loss (only 16-mixed).
  virtual bool scales_loss() const { return false; }
  /// The current loss scale; 1 when the loss is not scaled.
  virtual double loss_scale() const { return 1.0; }
  /// The scaler, under 16-mixed; else null.
  virtual GradScaler* scaler() { return nullptr; }
  /// State to checkpoint (the scaler's, under 16-mixed); empty otherwise.
  virtual std::map<std::string, Tensor> state_dict() const { return {}; }
  virtual void load_state_dict(const std::map<std::string, Tensor>& state) { (void)state; }

 protected:
  PrecisionPlugin(Precision p, DeviceType device_type) : precision_(p), device_type_(device_type) {}

 private:
  Precision precision_;
  DeviceType device_type_;
};

/// Options of the plugins that have any.
struct PrecisionPluginOptions {
  /// 16-mixed: the scaler's options.
  GradScalerOptions scaler;
};

/// The plugin for `p` on devices of `device_type`.
std::unique_ptr<PrecisionPlugin> make_precision_plugin(Precision p, DeviceType device_type,
                                                       const PrecisionPluginOptions& options = {});

}  // namespace ampgrad

// Optimizers: SGD, Adam, AdamW, with PyTorch's update rules, parameter groups, and state
// that is always float32.
//
// Options are plain structs filled with designated initializers:
//   ag::optim::AdamW opt(net->parameters(), {.lr = 1e-3, .weight_decay = 0.01});
// A step is one fused multi-tensor backend call per group, device and dtype
// (kernels/*/optim), one pass over each parameter, gradient and moments.
//
// 16-bit parameters: the update is computed in float32, and a float16 or bfloat16 parameter
// stores it as its group's update_rounding says (ampgrad/update_rounding.h): Nearest (an
// update below half a 16-bit ulp of the weight is lost: bf16-true training can stall),
// Stochastic (unbiased random rounding, no extra memory), Compensated (Kahan summation with
// a compensation buffer of the parameter's dtype, 2 bytes per element) or Master (a float32
// copy kept in the state, 4 bytes per element, which accumulates small updates; the
// parameter receives its rounding; the same as master_weights). Float32 and float64
// parameters ignore the mode. state_bytes() reports what a mode costs, and
// set_count_stalled(true) counts, each step and per parameter, the elements whose update
// was lost (stalled_counts, stalled_fractions: which parameters lose the most).
//
// Nothing in a step is read back to the host: step counters are device tensors, the
// learning rate may be one (set_lr with a tensor), and a step the grad scaler skips is
// skipped on the device (step(found_inf)), so a training loop never waits for the device.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ampgrad/backend.h"
#include "ampgrad/nn/module.h"
#include "ampgrad/step_result.h"
#include "ampgrad/tensor.h"
#include "ampgrad/update_rounding.h"

namespace ampgrad::optim {

using ampgrad::parse_update_rounding;
using ampgrad::update_rounding_name;
using ampgrad::UpdateRounding;

/// Parameters, gradients and moments in a checkpointable form: tensors by name
/// ("param_groups.0.lr", "state.3.exp_avg", ...).
using StateDict = nn::StateDict;

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  /// Updates every parameter that has a gradient. `found_inf` (a float32 one-element flag
  /// on the parameters' device, raised by the grad scaler when a gradient overflowed)
  /// makes the backend skip the update on the device: parameters, state and step counters
  /// keep their values. The result is lazy: converting it to bool is a host sync when
  /// found_inf is given, and free otherwise.
  StepResult step(const Tensor& found_inf = Tensor());
  /// Drops every parameter's gradient (PyTorch's set_to_none).
  void zero_grad();
  /// Turns float32 master weights for float16/bfloat16 parameters on or off in every group:
  /// on is update_rounding Master; off turns a Master group to Nearest and leaves the other
  /// modes. Masters already made are kept while on.
  void set_master_weights(bool on);
  /// A group's update rounding (the update_rounding option), and its change, for one group
  /// or every group. Stochastic draws come from the optimizer's rounding seed; Compensated
  /// makes a compensation buffer (zero) for each 16-bit parameter at its next step; buffers
  /// and masters already made are kept when the mode changes.
  UpdateRounding update_rounding(size_t group = 0) const;
  void set_update_rounding(size_t group, UpdateRounding r);
  void set_update_rounding(UpdateRounding r);
  /// The key of the stochastic rounding's draws: taken from the global generator
  /// (generator_advance) when the optimizer is made, so manual_seed decides it; saved in
  /// the state dict ("rounding_seed").
  uint64_t rounding_seed() const { return rounding_seed_; }
  void set_rounding_seed(uint64_t seed) { rounding_seed_ = seed; }
  /// Bytes of optimizer state (moment buffers, float32 masters, compensation buffers; not
  /// the step counters) of every group, or of one; divided by the group's parameter
  /// elements, the bytes per parameter its mode and rule cost. State is made at a
  /// parameter's first step.
  size_t state_bytes() const;
  size_t state_bytes(size_t group) const;
  /// Counting of stalled updates (off by default: a step then counts nothing): each step
  /// counts, on the device and without a host sync, the elements of float16/bfloat16
  /// parameters whose update was nonzero but whose stored value (the master under Master)
  /// did not change (backend.h's OptimizerLists::stalled). Under Compensated such an update
  /// is kept in the compensation, not lost. A skipped step (found_inf) counts nothing.
  void set_count_stalled(bool on);
  bool count_stalled() const { return count_stalled_; }
  /// The last counted step's count over every group: a 0-dim int64 tensor on the
  /// parameters' device (0 before the first counted step).
  const Tensor& stalled_count() const;
  /// The last counted step's count of one group: the sum of stalled_counts(group), a 0-dim
  /// int64 tensor on its parameters' device, summed there.
  const Tensor& stalled_count(size_t group) const;
  /// The last counted step's count of each parameter of the group: a 1-D int64 tensor on
  /// the group's (first) parameter's device, element j for parameter j of the group (0
  /// for one that is not float16/bfloat16, or that had no gradient at that step).
  const Tensor& stalled_counts(size_t group) const;
  /// stalled_count(group) over the group's float16/bfloat16 elements (0 without any): a
  /// host read.
  double stalled_fraction(size_t group = 0) const;
  /// Each parameter's stalled_counts(group) element over its element count (0 for one that
  /// is not float16/bfloat16): a host read. The largest name the parameters whose updates
  /// are most often lost.
  std::vector<double> stalled_fractions(size_t group = 0) const;
  /// Makes the float32 master copy of every parameter now, from its current value: called
  /// before a model is converted to 16 bits, the masters keep the full float32 values.
  void init_master_weights();
  size_t num_groups() const { return groups_.size(); }
  /// A group's learning rate; a host sync when it is a device tensor (set_lr(group, Tensor)).
  double lr(size_t group = 0) const;
  void set_lr(size_t group, double lr);
  /// A learning rate on the device (a one-element float64 tensor on the parameters'
  /// device, e.g. computed from step_count() by a schedule): steps read it there.
  void set_lr(size_t group, const Tensor& lr);
  /// Sets every group's learning rate.
  void set_lr(double lr);
  std::vector<Tensor> parameters() const;
  /// Steps that updated the parameters (skipped ones not counted): a 0-dim int64 tensor on
  /// the parameters' device, advanced on the device. It follows the parameters when their
  /// module moves after the optimizer was made (Lite's setup, Module::to): one copy then.
  const Tensor& step_count() const;
  /// step_count() read on the host (a host sync).
  int64_t steps() const { return step_count().item<int64_t>(); }
  /// step() calls so far, skipped ones included: host bookkeeping, an upper bound of steps().
  int64_t step_calls() const { return step_calls_; }
  /// Learning rates, step counts, the rounding seed and state (moments, masters,
  /// compensation buffers "state.G.J.comp"). Like PyTorch's, the state tensors are live
  /// views: clone them (or save the dict) before stepping on if you need a snapshot.
  /// Betas, eps, weight decay and the update rounding modes are not included; they come
  /// from the constructor.
  StateDict state_dict() const;
  /// Restores learning rates, step count and per-parameter state; the parameter layout
  /// (groups and shapes) must match, else ag::Error names the difference.
  void load_state_dict(const StateDict& dict);

 protected:
  Optimizer();
  struct Group {
    std::vector<Tensor> params;
    double lr;
    Tensor lr_tensor;  // when defined, the rate steps read (on the device)
    UpdateRounding rounding = UpdateRounding::Nearest;
    Tensor stalled;      // int64, 0-dim: the sum of stalled_per (when counting)
    Tensor stalled_per;  // int64, one element per parameter: the last counted step's counts
  };
  struct ParamState {
    Tensor buf1, buf2;  // momentum, or (exp_avg, exp_avg_sq); float32
    Tensor master;      // float32 copy of a 16-bit parameter, under Master
    Tensor comp;        // Kahan's compensation of a 16-bit parameter (its dtype), under Compensated
    Tensor step;        // int64, one element: updates applied to this parameter
  };
  /// Appends a group; refuses a parameter that is not a floating, contiguous leaf, or that
  /// is already in this optimizer (or shares elements with one that is).
  void add_group(std::vector<Tensor> params, double lr, UpdateRounding rounding, const char* who);
  /// Refuses an optimizer without parameters (the constructors' last check).
  void require_parameters() const;
  /// State of parameter j of group g.
  ParamState& state(size_t g, size_t j);
  /// Creates what a parameter's state lacks (buffers, master) before its first step.
  virtual void init_state(size_t group, const Tensor& param, ParamState& s) = 0;
  /// One fused backend call over `lists` (parameters of one group, device and dtype).
  virtual void step_lists(size_t group, const OptimizerLists& lists) = 0;
  /// Whether step_lists hands lists.casts to the backend, which writes them (SGD, Adam and
  /// AdamW themselves: true; a class derived from them says false unless it overrides this
  /// too, since its step_lists may update the parameters some other way). An optimizer
  /// that says false gets no casts, and autocast casts its parameters afresh after each
  /// step (ampgrad/cast_shadow.h).
  virtual bool writes_casts() const { return false; }
  /// The float32 copy to update, or undefined when the parameter itself is updated.
  Tensor master_for(ParamState& s, const Tensor& param, bool master_weights);
  /// A name for error messages ("SGD", "Adam", "AdamW").
  virtual const char* name() const = 0;
  /// Whether group g updates 16-bit parameters through float32 master weights.
  bool uses_master_weights(size_t group) const { return groups_[group].rounding == UpdateRounding::Master; }

  std::vector<Group> groups_;
  std::vector<std::vector<ParamState>> state_;
  mutable Tensor step_count_;  // on the first parameter's device: step_count() moves it there
  int64_t step_calls_ = 0;
  uint64_t rounding_seed_ = 0;
  bool count_stalled_ = false;
  mutable Tensor stalled_count_;  // the sum of the groups' counts, on step_count()'s device
};

struct SGDOptions {
  double lr = 1e-2;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
  /// How float16/bfloat16 parameters store the update (Master: float32 master weights).
  UpdateRounding update_rounding = UpdateRounding::Nearest;
};

class SGD : public Optimizer {
 public:
  struct ParamGroup {
    std::vector<Tensor> params;
    SGDOptions options;
  };
  SGD(std::vector<Tensor> params, SGDOptions options = {});
  SGD(std::vector<ParamGroup> groups);

 protected:
  void init_state(size_t group, const Tensor& param, ParamState& s) override;
  void step_lists(size_t group, const OptimizerLists& lists) override;
  bool writes_casts() const override;
  const char* name() const override { return "SGD"; }

 private:
  std::vector<SGDOptions> options_;
};

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;  // L2 penalty added to the gradient
  UpdateRounding update_rounding = UpdateRounding::Nearest;  // as SGDOptions'
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;  // decoupled: param *= 1 - lr * weight_decay
  UpdateRounding update_rounding = UpdateRounding::Nearest;  // as SGDOptions'
};

class Adam : public Optimizer {
 public:
  struct ParamGroup {
    std::vector<Tensor> params;
    AdamOptions options;
  };
  Adam(std::vector<Tensor> params, AdamOptions options = {});
  Adam(std::vector<ParamGroup> groups);

 protected:
  void init_state(size_t group, const Tensor& param, ParamState& s) override;
  void step_lists(size_t group, const OptimizerLists& lists) override;
  bool writes_casts() const override;
  const char* name() const override { return decoupled_ ? "AdamW" : "Adam"; }
  explicit Adam(bool decoupled) : decoupled_(decoupled) {}
  void add_groups(std::vector<ParamGroup> groups);
  std::vector<AdamOptions> options_;
  bool decoupled_ = false;
};

class AdamW : public Adam {
 public:
  struct ParamGroup {
    std::vector<Tensor> params;
    AdamWOptions options;
  };
  AdamW(std::vector<Tensor> params, AdamWOptions options = {});
  AdamW(std::vector<ParamGroup> groups);
};

}  // namespace ampgrad::optim

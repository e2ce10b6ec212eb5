// GradScaler: dynamic loss scaling for float16 training, with PyTorch's semantics.
//
// A float16 gradient underflows to zero below 2^-24; multiplying the loss by a large scale
// S before backward lifts the gradients into float16's range, and dividing them by S
// before the optimizer step restores their true size. When a gradient overflows (inf or
// NaN), the step is skipped and S shrinks; after `growth_interval` clean iterations S grows.
//
//   ag::GradScaler scaler({.init_scale = 65536.0, .growth_interval = 2000});
//   for (auto& [x, y] : loader) {
//     opt.zero_grad();
//     ag::Tensor loss = loss_fn(model(x), y);
//     scaler.scale(loss).backward();
//     scaler.unscale_(opt);              // optional: clip or inspect unscaled grads here
//     scaler.step(opt);                  // skipped (on the device) when a gradient was inf or NaN
//     scaler.update();                   // once per iteration, after every step()
//   }
//
// Each optimizer goes through a small state machine per iteration (docs/grad-scaler.md):
//
//   READY --unscale_()--> UNSCALED --step()--> STEPPED --update()--> READY (all optimizers)
//   READY --step()-----------------------------^ (step unscales first)
//
// Misuse throws ag::Error: unscale_() twice, or after step(), before update(); step()
// twice; update() with no inf check recorded since the last update(); step() on an
// optimizer none of whose parameters has a gradient; float16 gradients (the master
// parameters must be float32 or bfloat16: a float16 gradient cannot hold an unscaled value
// reliably, which is PyTorch's rule too).
//
// Nothing is read back to the host during an iteration. The scale, the growth tracker and
// the counters are tensors on the parameters' device; one backend call per device unscales
// and checks all of an optimizer's gradients (scale_and_check, with inv_scale = 1 / scale
// computed there in float64) and raises a device flag, found_inf; the optimizer's fused
// step reads the flag on the device and skips itself; the update rule runs on the device
// (update_scale, PyTorch's _amp_update_scale_). Only the state machine's bookkeeping
// (which optimizer is at which stage) lives on the host. Reading a value (get_scale(),
// skipped_steps(), the bool of a StepResult) is a host sync.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ampgrad/step_result.h"
#include "ampgrad/tensor.h"

namespace ampgrad {

namespace optim {
class Optimizer;
}

/// Options, in declaration order for designated initializers:
///   ag::GradScalerOptions{.init_scale = 1024, .growth_interval = 100, .max_scale = 1 << 20}
struct GradScalerOptions {
  double init_scale = 65536.0;
  /// Factor applied after growth_interval clean iterations in a row.
  double growth_factor = 2.0;
  /// Factor applied on an iteration whose gradients overflowed.
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  /// When false every call is a pass-through: scale() returns the loss, step() just steps.
  bool enabled = true;
  /// Beyond PyTorch: the scale never backs off below min_scale (0: no floor) ...
  double min_scale = 0.0;
  /// ... nor grows above max_scale.
  double max_scale = std::numeric_limits<double>::infinity();
};

class GradScaler {
 public:
  /// Checks the options: init_scale in [min_scale, max_scale] and a positive normal
  /// float32 number (the scale and its reciprocal multiply in float32), growth_factor
  /// >= 1, backoff_factor in (0, 1], growth_interval >= 1.
  explicit GradScaler(GradScalerOptions options = {});

  /// loss * scale, recorded by autograd so that backward yields scaled gradients. The scale
  /// is a float32 scalar tensor (float64 for a float64 loss) and the product is computed in
  /// that type: a float16 or bfloat16 loss gives a float32 result, so the scaled loss
  /// itself never overflows. (PyTorch keeps the loss's dtype; the gradient entering a
  /// float16 graph is the same either way, cast to float16 by the backward of the cast.)
  /// Disabled: returns the loss itself.
  Tensor scale(const Tensor& loss);

  /// Divides every gradient of the optimizer's parameters by the scale in place and
  /// records whether any was inf or NaN. Optional: step() does it when it was not called.
  void unscale_(optim::Optimizer& optimizer);

  /// Unscales (unless unscale_ was called) and steps the optimizer with the inf flag, so
  /// that the step is skipped on the device when a gradient of this optimizer was inf or
  /// NaN. The result is lazy: its bool (whether the optimizer stepped) is a host sync.
  /// Disabled: steps, and the result is true.
  StepResult step(optim::Optimizer& optimizer);

  /// Updates the scale once per iteration, from every optimizer's inf checks since the
  /// last update: any overflow multiplies the scale by backoff_factor (not below
  /// min_scale) and zeroes the growth tracker; otherwise the tracker counts one more clean
  /// iteration, and when it reaches growth_interval the scale is multiplied by
  /// growth_factor (kept only if finite as a float32 and capped at max_scale) and the
  /// tracker restarts at 0. Then every optimizer is READY again.
  void update();
  /// Sets the scale to new_scale (a positive normal float32 number) instead of applying the rule; the
  /// tracker is kept. Like update(), makes every optimizer READY.
  void update(double new_scale);

  /// Beyond PyTorch, for data-parallel training: a function applied in place to each
  /// optimizer's inf flag (one float32 element on the scale's device, nonzero after an
  /// overflow) once unscaling raised it and before the step reads it. Lite's "ddp" passes
  /// one that takes the maximum over the ranks, so that every rank skips the same steps and
  /// the scales never diverge. Null: none.
  void set_found_inf_reduction(std::function<void(const Tensor&)> reduce) { reduce_found_inf_ = std::move(reduce); }

  /// The current scale (a host sync); 1 when disabled.
  double get_scale() const;
  /// The scale itself: a 0-dim float64 tensor on the parameters' device (read by nothing
  /// on the host).
  const Tensor& scale_tensor() const { return scale_; }
  /// A host sync.
  int64_t get_growth_tracker() const { return growth_tracker_.item<int64_t>(); }
  bool is_enabled() const { return options_.enabled; }
  const GradScalerOptions& options() const { return options_; }

  /// Counters for the trainer (beyond PyTorch). Optimizer steps skipped for inf/NaN (a host
  /// sync).
  int64_t skipped_steps() const { return skipped_steps_.item<int64_t>(); }
  /// update() calls so far that applied the rule: the iteration counter.
  int64_t num_updates() const { return num_updates_; }
  /// The iteration (0-based num_updates() at the time) of the last update() that saw an
  /// overflow; -1 if none (a host sync).
  int64_t last_overflow_step() const { return last_overflow_step_.item<int64_t>(); }

  /// scale, growth_factor, backoff_factor, growth_interval and growth_tracker (as PyTorch),
  /// plus min_scale, max_scale, skipped_steps, num_updates and last_overflow_step, each a
  /// 0-dim tensor (float64 or int64; the state's own on the parameters' device, copies of
  /// the options on the CPU). Empty when disabled, as in PyTorch.
  std::map<std::string, Tensor> state_dict() const;
  /// Restores a state_dict(). The five PyTorch keys are required; the others are optional
  /// (absent ones keep their value). No-op when disabled; an empty dict is refused.
  void load_state_dict(const std::map<std::string, Tensor>& dict);

 private:
  enum class Stage { Ready, Unscaled, Stepped };
  struct OptimizerState {
    Stage stage = Stage::Ready;
    /// One flag per device holding gradients of this optimizer (float32, one element).
    std::vector<std::pair<Device, Tensor>> found_inf;
    /// The flags combined on the scale's device: nonzero when any gradient overflowed.
    Tensor any_inf;
  };
  OptimizerState& state_of(const optim::Optimizer& opt);
  void unscale_grads(optim::Optimizer& opt, OptimizerState& st);
  /// Moves the state tensors to `device` (the first time the scaler sees the parameters').
  void place(Device device);

  GradScalerOptions options_;
  Tensor scale_;               // float64, 0-dim
  Tensor growth_tracker_;      // int64, 0-dim
  Tensor skipped_steps_;       // int64, 0-dim
  Tensor last_overflow_step_;  // int64, 0-dim
  int64_t num_updates_ = 0;    // update() calls: host bookkeeping, not a value
  std::function<void(const Tensor&)> reduce_found_inf_;
  // Keyed by address: the scaler never dereferences a key except through the reference
  // handed to unscale_/step, and update() forgets them all.
  std::map<const optim::Optimizer*, OptimizerState> per_optimizer_;
};

}  // namespace ampgrad

// StepResult: whether an optimizer step updated the parameters, kept where it was decided.
//
// Under the grad scaler the decision is taken on the device (a step is skipped when a
// gradient overflowed, without the host looking), so the answer stays there until asked
// for. Converting it to bool is a host sync, counted by ag::host_sync_count(); a training
// loop that never asks never waits.
#pragma once

#include "ampgrad/tensor.h"

namespace ampgrad {

class StepResult {
 public:
  /// A result known on the host.
  StepResult(bool stepped = true) : known_(stepped) {}  // NOLINT: implicit on purpose
  /// Decided on the device: the step happened when `found_inf` (float32, one element) is 0.
  static StepResult unless(const Tensor& found_inf);
  /// Whether the parameters were updated; a host sync when the answer is on the device.
  explicit operator bool() const;
  /// True when the answer is on the device (converting it syncs).
  bool on_device() const { return flag_.defined(); }
  /// The device flag (nonzero: skipped); undefined when the answer is known on the host.
  const Tensor& found_inf() const { return flag_; }

  /// Under a grad scaler (Lite's 16-mixed): the loss scale before the step and after the
  /// iteration's scale update, as 0-dim tensors on the device (copies: later updates do not
  /// change them). Undefined without a scaler.
  StepResult& with_scales(Tensor before, Tensor after);
  const Tensor& scale_before_tensor() const { return scale_before_; }
  const Tensor& scale_after_tensor() const { return scale_after_; }
  /// Those scales read on the host (a host sync each); NaN without a scaler.
  double scale_before() const;
  double scale_after() const;

 private:
  bool known_ = true;
  Tensor flag_;
  Tensor scale_before_, scale_after_;
};

}  // namespace ampgrad

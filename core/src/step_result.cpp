#include "ampgrad/step_result.h"

namespace ampgrad {

StepResult StepResult::unless(const Tensor& found_inf) {
  AG_CHECK(found_inf.defined() && found_inf.dtype() == kFloat32 && found_inf.numel() == 1, "StepResult",
           "expected a float32 flag of one element");
  StepResult r;
  r.flag_ = found_inf;
  return r;
}

StepResult::operator bool() const {
  if (!flag_.defined()) return known_;
  const Tensor h = detail::host_values(flag_, "StepResult");
  return *static_cast<const float*>(h.raw_data()) == 0.0f;
}

}  // namespace ampgrad

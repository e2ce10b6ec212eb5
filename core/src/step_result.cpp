#include "ampgrad/step_result.h"

#include <limits>

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

StepResult& StepResult::with_scales(Tensor before, Tensor after) {
  scale_before_ = std::move(before);
  scale_after_ = std::move(after);
  return *this;
}

namespace {
double scalar_or_nan(const Tensor& t) {
  if (!t.defined()) return std::numeric_limits<double>::quiet_NaN();
  const Tensor h = detail::host_values(t.to(kFloat64), "StepResult");
  return *static_cast<const double*>(h.raw_data());
}
}  // namespace

double StepResult::scale_before() const { return scalar_or_nan(scale_before_); }
double StepResult::scale_after() const { return scalar_or_nan(scale_after_); }

}  // namespace ampgrad

// The grad scaler's two rules, in float64: unscaling with the overflow check, and the
// scale update. The specification that the kernels (kernels/cpu/amp.cpp, kernels/cuda)
// and nn/src/grad_scaler.cpp implement, following PyTorch's _amp_foreach_non_finite_check_
// _and_unscale_ and _amp_update_scale_. Plain loops, no dependency on the library.
#pragma once

#include <cstdint>
#include <limits>
#include <span>

namespace ampgrad::reference {

/// Multiplies every gradient by 1 / scale in place. Returns found_inf: whether any value was
/// inf or NaN before the multiplication (a huge finite gradient that overflows only after
/// it, when 1 / scale > 1, does not count).
bool unscale_and_check(std::span<double> grads, double scale);

struct ScaleUpdateOptions {
  double growth_factor = 2.0, backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  /// Beyond PyTorch: the scale never backs off below min_scale nor grows above max_scale.
  double min_scale = 0, max_scale = std::numeric_limits<double>::infinity();
};
/// One update, at the end of an iteration. An overflow: scale *= backoff_factor (not below
/// min_scale), tracker = 0. Otherwise the tracker counts the clean iteration; at
/// growth_interval, scale *= growth_factor (only when the result is still a finite float32,
/// since the scale multiplies float32 values, and not above max_scale), tracker = 0.
void update_scale(double& scale, int64_t& growth_tracker, bool found_inf, const ScaleUpdateOptions& o);

}  // namespace ampgrad::reference

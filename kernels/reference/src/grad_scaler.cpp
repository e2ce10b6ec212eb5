// Dynamic loss scaling. The loss is multiplied by a scale S before backward so that small
// float16 gradients do not underflow; the gradients are then S times too large and are
// divided by S before the step. If S was too large, some gradient overflowed to inf (or
// became NaN): that step is skipped and S shrinks. After growth_interval clean steps in a
// row S grows again, probing for the largest scale that does not overflow.
#include "ampgrad/reference/grad_scaler.h"

#include <algorithm>
#include <cmath>

namespace ampgrad::reference {

bool unscale_and_check(std::span<double> grads, double scale) {
  const double inv_scale = 1 / scale;
  bool found_inf = false;
  for (double& g : grads) {
    found_inf = found_inf || !std::isfinite(g);  // checked before scaling
    g *= inv_scale;
  }
  return found_inf;
}

void update_scale(double& scale, int64_t& growth_tracker, bool found_inf, const ScaleUpdateOptions& o) {
  if (found_inf) {
    scale = std::max(scale * o.backoff_factor, o.min_scale);
    growth_tracker = 0;
    return;
  }
  ++growth_tracker;
  if (growth_tracker < o.growth_interval) return;
  const double grown = scale * o.growth_factor;
  if (grown <= double(std::numeric_limits<float>::max())) scale = std::min(grown, o.max_scale);
  growth_tracker = 0;
}

}  // namespace ampgrad::reference

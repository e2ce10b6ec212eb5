// The optimizers' update rules, one step, in float64: the specification that the fused
// multi-tensor steps (kernels/cpu/optim.cpp, kernels/cuda) implement, following PyTorch's
// documented torch.optim.SGD / Adam / AdamW pseudo-code. Plain loops, no dependency on
// the library: read it alone.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace ampgrad::reference {

struct SgdOptions {
  double lr = 0, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
};
/// The momentum buffer and how many steps were taken.
struct SgdState {
  std::vector<double> buf;
  int64_t step = 0;
};
/// One step on parameters p with gradients g (same size), in place.
void sgd_step(std::span<double> p, std::span<const double> g, SgdState& s, const SgdOptions& o);

struct AdamOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  /// false: Adam's L2 penalty (weight_decay * p added to the gradient); true: AdamW's
  /// decoupled decay (p *= 1 - lr * weight_decay before the update).
  bool decoupled = false;
};
/// The first and second moments and how many steps were taken.
struct AdamState {
  std::vector<double> m, v;
  int64_t step = 0;
};
/// One step on parameters p with gradients g (same size), in place.
void adam_step(std::span<double> p, std::span<const double> g, AdamState& s, const AdamOptions& o);

// ---- storing an update in a 16-bit parameter (UpdateRounding) ----------------------------
/// A 16-bit floating format: significand bits (the implicit one included), the smallest
/// normal exponent, the largest finite value.
struct Format16 {
  int digits;
  int min_exponent;
  double max_finite;
};
inline constexpr Format16 kBFloat16Format{8, -126, 0x1.fep127};
inline constexpr Format16 kHalfFormat{11, -14, 65504.0};

/// x rounded to the format, to nearest with ties to even; beyond the largest finite value
/// by half an ulp or more, infinity.
double round_nearest(double x, Format16 f);
/// x rounded to the format stochastically with the uniform draw u in [0, 1): with tz the
/// format's value of |x| rounded toward zero and ulp the step to the next one away from
/// zero, |x| becomes tz + ulp when u < (|x| - tz) / ulp, else tz (sign kept): each neighbour
/// with probability proportional to closeness, a representable x exactly. NaN, infinity
/// and |x| beyond the largest finite value round to nearest.
double round_stochastic(double x, Format16 f, double u);
/// Kahan's compensated update of a stored value w by `update`, with the compensation c
/// (a value of the format, updated in place): y = update + c, w' = round(w + y),
/// c = round(y - (w' - w)); returns w'. Rounding is round_nearest.
double kahan_update(double w, double update, double& c, Format16 f);

}  // namespace ampgrad::reference

// SGD and Adam(W), step t (1-based), for each element, as PyTorch's documentation writes
// them.
#include "ampgrad/reference/optim.h"

#include <algorithm>
#include <cmath>

namespace ampgrad::reference {

// g += wd p                          (L2 penalty)
// b  = g at the first step, else momentum b + (1 - dampening) g
// g  = nesterov ? g + momentum b : b (with momentum)
// p -= lr g
void sgd_step(std::span<double> p, std::span<const double> grad, SgdState& s, const SgdOptions& o) {
  const bool first = s.step == 0;
  if (first) s.buf.assign(p.size(), 0.0);
  for (size_t i = 0; i < p.size(); ++i) {
    double g = grad[i] + o.weight_decay * p[i];
    if (o.momentum != 0) {
      s.buf[i] = first ? g : o.momentum * s.buf[i] + (1 - o.dampening) * g;
      g = o.nesterov ? g + o.momentum * s.buf[i] : s.buf[i];
    }
    p[i] -= o.lr * g;
  }
  ++s.step;
}

// Adam keeps exponential moving averages of the gradient and of its square,
//   m = beta1 m + (1 - beta1) g,   v = beta2 v + (1 - beta2) g^2,
// which start at 0 and so are biased towards 0 early on: after t steps of a constant g,
// m = (1 - beta1^t) g. Dividing by (1 - beta^t) removes that bias:
//   mhat = m / (1 - beta1^t),   vhat = v / (1 - beta2^t),
//   p -= lr mhat / (sqrt(vhat) + eps).
// Weight decay: Adam adds wd p to g (an L2 penalty, then scaled by the adaptive step like
// the rest of g); AdamW shrinks p by (1 - lr wd) directly, decoupled from the moments.
void adam_step(std::span<double> p, std::span<const double> grad, AdamState& s, const AdamOptions& o) {
  if (s.step == 0) s.m.assign(p.size(), 0.0), s.v.assign(p.size(), 0.0);
  const int64_t t = ++s.step;
  const double bc1 = 1 - std::pow(o.beta1, double(t)), bc2 = 1 - std::pow(o.beta2, double(t));
  for (size_t i = 0; i < p.size(); ++i) {
    double g = grad[i];
    if (o.decoupled) p[i] *= 1 - o.lr * o.weight_decay;
    else g += o.weight_decay * p[i];
    s.m[i] = o.beta1 * s.m[i] + (1 - o.beta1) * g;
    s.v[i] = o.beta2 * s.v[i] + (1 - o.beta2) * g * g;
    const double mhat = s.m[i] / bc1, vhat = s.v[i] / bc2;
    p[i] -= o.lr * mhat / (std::sqrt(vhat) + o.eps);
  }
}

// A value of the format is a multiple of its ulp at that magnitude: 2^(e - digits + 1) for
// |x| in [2^e, 2^(e+1)), e not below min_exponent (the subnormals share the smallest
// normal's ulp). |x| / ulp = q is then split into its integer part (the value toward zero)
// and the fraction, the rounding's only input.
namespace {
double ulp_of(double a, Format16 f) {
  int e = 0;
  std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1): a in [2^(e-1), 2^e)
  return std::ldexp(1.0, std::max(e - 1, f.min_exponent) - f.digits + 1);
}
}  // namespace

double round_nearest(double x, Format16 f) {
  if (std::isnan(x) || std::isinf(x) || x == 0) return x;
  const double a = std::fabs(x), ulp = ulp_of(a, f);
  const double q = a / ulp, tz = std::floor(q), frac = q - tz;
  double n = tz;
  if (frac > 0.5 || (frac == 0.5 && std::fmod(tz, 2.0) != 0)) n = tz + 1;
  double r = n * ulp;
  if (r > f.max_finite) r = INFINITY;  // at or past max + ulp/2 (the next value up, as IEEE rounds)
  return std::copysign(r, x);
}

double round_stochastic(double x, Format16 f, double u) {
  const double a = std::fabs(x);
  if (!(a < f.max_finite)) return round_nearest(x, f);
  if (a == 0) return x;
  const double ulp = ulp_of(a, f);
  const double q = a / ulp, tz = std::floor(q);
  return std::copysign((u < q - tz ? tz + 1 : tz) * ulp, x);
}

double kahan_update(double w, double update, double& c, Format16 f) {
  const double y = update + c;
  const double next = round_nearest(w + y, f);
  c = round_nearest(y - (next - w), f);
  return next;
}

}  // namespace ampgrad::reference

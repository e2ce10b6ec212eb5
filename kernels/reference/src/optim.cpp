// SGD and Adam(W), step t (1-based), for each element, as PyTorch's documentation writes
// them.
#include "ampgrad/reference/optim.h"

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

}  // namespace ampgrad::reference

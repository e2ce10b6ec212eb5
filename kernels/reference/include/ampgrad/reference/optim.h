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

}  // namespace ampgrad::reference

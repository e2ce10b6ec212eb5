// Cross entropy with class-index targets (and nll_loss), forward and backward, in float64:
// the specification that the fused kernels (kernels/cpu/loss.cpp, kernels/cuda) and the
// frontend's reductions (core/src/ops/loss.cpp) implement. Plain loops, no dependency on
// the library: read it alone.
//
// Layout: logits are row-major [N, C, S] (S = the product of any spatial dims after the
// class dim; S = 1 for plain [N, C]); targets are [N, S], one class index per position.
// A target equal to ignore_index contributes a loss of 0 and no gradient, and is not
// counted by the mean. Any other target must be in [0, C).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace ampgrad::reference {

struct CrossEntropyOptions {
  int64_t ignore_index = -100;
  /// In [0, 1]: the target distribution is (1 - ls) onehot(t) + ls / C.
  double label_smoothing = 0;
};

/// The loss of each position [N, S]: -sum_c q_c log softmax(x)_c, with q the (smoothed)
/// target distribution; 0 at ignored positions.
std::vector<double> cross_entropy(std::span<const double> logits, std::span<const int64_t> target, int64_t N, int64_t C,
                                  int64_t S, const CrossEntropyOptions& o = {});

/// nll_loss: -logp[t] at each position of log-probabilities [N, C, S]; 0 where ignored.
std::vector<double> nll_loss(std::span<const double> log_probs, std::span<const int64_t> target, int64_t N, int64_t C,
                             int64_t S, int64_t ignore_index = -100);

enum class Reduction { None, Sum, Mean };
/// Reduces per-position losses: None returns them; Sum adds them; Mean divides the sum by
/// the number of positions whose target is not ignore_index (NaN when none is: 0 / 0).
std::vector<double> reduce_loss(std::span<const double> losses, std::span<const int64_t> target, int64_t ignore_index,
                                Reduction r);

/// The gradient with respect to the logits [N, C, S] for the incoming gradient of each
/// position's loss dloss [N, S] (for Sum: all ones; for Mean: 1 / count at the counted
/// positions): dloss (softmax(x) - q), zero at ignored positions.
std::vector<double> cross_entropy_backward(std::span<const double> logits, std::span<const int64_t> target,
                                           std::span<const double> dloss, int64_t N, int64_t C, int64_t S,
                                           const CrossEntropyOptions& o = {});

}  // namespace ampgrad::reference

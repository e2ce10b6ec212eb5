// Cross entropy from its definition. With p = softmax(x) the model's distribution over C
// classes and q the target distribution,
//   loss = -sum_c q_c log p_c,
// and for a class index t with label smoothing ls, q = (1 - ls) onehot(t) + ls / C:
//   loss = (1 - ls) (-log p_t) + ls (-(1/C) sum_c log p_c).
// log p comes from log_softmax (softmax.h), which is stable for any logits.
#include "ampgrad/reference/loss.h"

#include <cmath>
#include <limits>

#include "ampgrad/reference/softmax.h"

namespace ampgrad::reference {

namespace {

// Element (n, c, s) of [N, C, S].
size_t at(int64_t n, int64_t c, int64_t s, int64_t C, int64_t S) { return size_t((n * C + c) * S + s); }

}  // namespace

std::vector<double> cross_entropy(std::span<const double> logits, std::span<const int64_t> target, int64_t N, int64_t C,
                                  int64_t S, const CrossEntropyOptions& o) {
  // log_softmax along the class dim: [N, C, S] is its [outer, n, inner].
  const std::vector<double> lp = log_softmax(logits, N, C, S);
  std::vector<double> loss(size_t(N * S), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t s = 0; s < S; ++s) {
      const int64_t t = target[size_t(n * S + s)];
      if (t == o.ignore_index) continue;
      double mean_lp = 0;
      for (int64_t c = 0; c < C; ++c) mean_lp += lp[at(n, c, s, C, S)];
      mean_lp /= double(C);
      loss[size_t(n * S + s)] = (1 - o.label_smoothing) * -lp[at(n, t, s, C, S)] + o.label_smoothing * -mean_lp;
    }
  return loss;
}

std::vector<double> nll_loss(std::span<const double> log_probs, std::span<const int64_t> target, int64_t N, int64_t C,
                             int64_t S, int64_t ignore_index) {
  std::vector<double> loss(size_t(N * S), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t s = 0; s < S; ++s) {
      const int64_t t = target[size_t(n * S + s)];
      if (t != ignore_index) loss[size_t(n * S + s)] = -log_probs[at(n, t, s, C, S)];
    }
  return loss;
}

std::vector<double> reduce_loss(std::span<const double> losses, std::span<const int64_t> target, int64_t ignore_index,
                                Reduction r) {
  if (r == Reduction::None) return {losses.begin(), losses.end()};
  double total = 0, count = 0;
  for (size_t i = 0; i < losses.size(); ++i) {
    total += losses[i];
    count += target[i] != ignore_index;
  }
  return {r == Reduction::Sum ? total : total / count};
}

// d(-log p_t)/dx_c = p_c - [c == t] (log p_t = x_t - lse(x), d lse/dx_c = p_c), and
// d(-(1/C) sum_k log p_k)/dx_c = p_c - 1/C. Mixed with weights (1 - ls) and ls:
//   dloss/dx_c = p_c - (1 - ls) [c == t] - ls / C = p_c - q_c.
std::vector<double> cross_entropy_backward(std::span<const double> logits, std::span<const int64_t> target,
                                           std::span<const double> dloss, int64_t N, int64_t C, int64_t S,
                                           const CrossEntropyOptions& o) {
  const std::vector<double> p = softmax(logits, N, C, S);
  std::vector<double> dx(logits.size(), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t s = 0; s < S; ++s) {
      const int64_t t = target[size_t(n * S + s)];
      if (t == o.ignore_index) continue;
      const double g = dloss[size_t(n * S + s)];
      for (int64_t c = 0; c < C; ++c) {
        const double q = (c == t ? 1 - o.label_smoothing : 0.0) + o.label_smoothing / double(C);
        dx[at(n, c, s, C, S)] = g * (p[at(n, c, s, C, S)] - q);
      }
    }
  return dx;
}

}  // namespace ampgrad::reference

// Softmax from its definition, with the one step every real implementation needs: the
// line's maximum m is subtracted before exponentiating. exp(x_i - m) / sum_j exp(x_j - m)
// equals exp(x_i) / sum_j exp(x_j) (the factor exp(-m) cancels), but never overflows:
// every exponent is <= 0, and the largest term is exactly 1, so the sum is >= 1.
#include "ampgrad/reference/softmax.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace ampgrad::reference {

namespace {

// Element i of line (o, c) in the [outer, n, inner] layout.
size_t at(int64_t o, int64_t i, int64_t c, int64_t n, int64_t inner) { return size_t((o * n + i) * inner + c); }

// The line's maximum m and sum_j exp(x_j - m).
struct MaxSum {
  double m, s;
};
MaxSum max_and_sum(std::span<const double> x, int64_t o, int64_t c, int64_t n, int64_t inner) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[at(o, i, c, n, inner)]);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(x[at(o, i, c, n, inner)] - m);
  return {m, s};
}

}  // namespace

std::vector<double> log_softmax(std::span<const double> x, int64_t outer, int64_t n, int64_t inner) {
  std::vector<double> y(x.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t c = 0; c < inner; ++c) {
      // Written as (x_i - m) - log(s) rather than x_i - lse: exact near the maximum.
      const auto [m, s] = max_and_sum(x, o, c, n, inner);
      for (int64_t i = 0; i < n; ++i) y[at(o, i, c, n, inner)] = x[at(o, i, c, n, inner)] - m - std::log(s);
    }
  return y;
}

std::vector<double> softmax(std::span<const double> x, int64_t outer, int64_t n, int64_t inner) {
  std::vector<double> y(x.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t c = 0; c < inner; ++c) {
      const auto [m, s] = max_and_sum(x, o, c, n, inner);
      for (int64_t i = 0; i < n; ++i) y[at(o, i, c, n, inner)] = std::exp(x[at(o, i, c, n, inner)] - m) / s;
    }
  return y;
}

// The Jacobian of softmax is dy_i/dx_k = y_i (delta_ik - y_k). The gradient is the
// vector-Jacobian product dx_k = sum_i dy_i y_i (delta_ik - y_k) = y_k (dy_k - sum_i dy_i y_i):
// one dot product per line, never the n x n matrix.
std::vector<double> softmax_backward(std::span<const double> y, std::span<const double> dy, int64_t outer, int64_t n,
                                     int64_t inner) {
  std::vector<double> dx(y.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t c = 0; c < inner; ++c) {
      double dot = 0;
      for (int64_t i = 0; i < n; ++i) dot += dy[at(o, i, c, n, inner)] * y[at(o, i, c, n, inner)];
      for (int64_t i = 0; i < n; ++i) {
        const size_t k = at(o, i, c, n, inner);
        dx[k] = y[k] * (dy[k] - dot);
      }
    }
  return dx;
}

// log_softmax_i = x_i - lse(x), and d lse / dx_k = softmax_k = exp(y_k); so
// dy_i/dx_k = delta_ik - exp(y_k), and dx_k = dy_k - exp(y_k) sum_i dy_i.
std::vector<double> log_softmax_backward(std::span<const double> y, std::span<const double> dy, int64_t outer,
                                         int64_t n, int64_t inner) {
  std::vector<double> dx(y.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t c = 0; c < inner; ++c) {
      double sum = 0;
      for (int64_t i = 0; i < n; ++i) sum += dy[at(o, i, c, n, inner)];
      for (int64_t i = 0; i < n; ++i) {
        const size_t k = at(o, i, c, n, inner);
        dx[k] = dy[k] - std::exp(y[k]) * sum;
      }
    }
  return dx;
}

}  // namespace ampgrad::reference

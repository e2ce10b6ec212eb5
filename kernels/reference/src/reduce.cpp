// The reductions by their definitions, in plain sequential loops (float64 sums of the
// sizes tests use are accurate far beyond the float32 and 16-bit kernels they check).
#include "ampgrad/reference/reduce.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace ampgrad::reference {

double sum(std::span<const double> x) {
  double s = 0;
  for (double v : x) s += v;
  return s;
}

double mean(std::span<const double> x) { return sum(x) / double(x.size()); }

// Two passes: the mean first, then the squared deviations from it (the one-pass form
// E[x^2] - E[x]^2 cancels catastrophically when the mean is large).
double var(std::span<const double> x, double correction) {
  const double m = mean(x);
  double s = 0;
  for (double v : x) s += (v - m) * (v - m);
  return s / std::max(0.0, double(x.size()) - correction);
}

namespace {

// The index of the extreme value: `better(a, b)` says a beats b; a NaN beats everything
// and the first one wins, as does the first of equal values.
template <class Better>
int64_t arg_extreme(std::span<const double> x, Better better) {
  int64_t best = 0;
  for (size_t i = 1; i < x.size(); ++i) {
    if (std::isnan(x[size_t(best)])) break;
    if (std::isnan(x[i]) || better(x[i], x[size_t(best)])) best = int64_t(i);
  }
  return best;
}

}  // namespace

int64_t argmax(std::span<const double> x) {
  return arg_extreme(x, [](double a, double b) { return a > b; });
}
int64_t argmin(std::span<const double> x) {
  return arg_extreme(x, [](double a, double b) { return a < b; });
}
double max(std::span<const double> x) { return x[size_t(argmax(x))]; }
double min(std::span<const double> x) { return x[size_t(argmin(x))]; }

// exp(x_i) overflows for x_i > 709; factoring out m = max(x) keeps every exponent <= 0.
double logsumexp(std::span<const double> x) {
  const double m = max(x);
  if (!std::isfinite(m)) return m;
  double s = 0;
  for (double v : x) s += std::exp(v - m);
  return m + std::log(s);
}

double norm(std::span<const double> x, double p) {
  if (std::isinf(p)) {
    double m = p > 0 ? 0 : std::numeric_limits<double>::infinity();
    for (double v : x) m = p > 0 ? std::max(m, std::fabs(v)) : std::min(m, std::fabs(v));
    return m;
  }
  if (p == 0) {
    double count = 0;
    for (double v : x) count += v != 0;
    return count;
  }
  double s = 0;
  for (double v : x) s += std::pow(std::fabs(v), p);
  return std::pow(s, 1 / p);
}

// var = S / (n - c) with S = sum_i (x_i - m)^2; dS/dx_j = 2 (x_j - m) - 2 sum_i (x_i - m) / n,
// and the deviations sum to 0.
std::vector<double> var_backward(std::span<const double> x, double correction) {
  const double m = mean(x), denom = std::max(0.0, double(x.size()) - correction);
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) g[i] = 2 * (x[i] - m) / denom;
  return g;
}

// d/dx_i log sum_j exp(x_j) = exp(x_i) / sum_j exp(x_j).
std::vector<double> logsumexp_backward(std::span<const double> x) {
  const double l = logsumexp(x);
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) g[i] = std::exp(x[i] - l);
  return g;
}

// N = S^(1/p) with S = sum |x_i|^p: dN/dx_i = (1/p) S^(1/p - 1) p |x_i|^(p-1) sign(x_i)
// = sign(x_i) |x_i|^(p-1) / N^(p-1).
std::vector<double> norm_backward(std::span<const double> x, double p) {
  const double nrm = norm(x, p);
  std::vector<double> g(x.size(), 0.0);
  if (nrm == 0) return g;
  for (size_t i = 0; i < x.size(); ++i) {
    const double sign = x[i] > 0 ? 1.0 : x[i] < 0 ? -1.0 : 0.0;
    g[i] = sign * std::pow(std::fabs(x[i]) / nrm, p - 1);
  }
  return g;
}

}  // namespace ampgrad::reference

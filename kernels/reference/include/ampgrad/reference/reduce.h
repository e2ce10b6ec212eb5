// The reductions, in float64, over one group of values: the specification that the fast
// kernels (kernels/cpu/reduce.cpp, kernels/cuda) implement. Reducing a tensor over a set
// of dims applies these to each group of elements that share the kept indices. Plain
// loops, no dependency on the library: read it alone.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace ampgrad::reference {

/// sum_i x_i (0 for no values).
double sum(std::span<const double> x);
/// sum / n (NaN for no values: 0 / 0).
double mean(std::span<const double> x);
/// sum_i (x_i - mean)^2 / max(0, n - correction): correction 1 is Bessel's (the sample
/// variance), 0 the population variance.
double var(std::span<const double> x, double correction);
/// The largest / smallest value; NaN when any value is NaN (NaN propagates). n >= 1.
double max(std::span<const double> x);
double min(std::span<const double> x);
/// The index of the largest / smallest value: the first one on ties, and the first NaN
/// when there is one (NaN counts as the extreme). n >= 1.
int64_t argmax(std::span<const double> x);
int64_t argmin(std::span<const double> x);
/// log sum_i exp(x_i), computed as m + log sum_i exp(x_i - m) with m = max(x); m itself
/// when m is not finite (all -inf gives -inf, any +inf gives +inf).
double logsumexp(std::span<const double> x);
/// The p-norm (sum_i |x_i|^p)^(1/p); p = inf: max |x_i|; p = -inf: min |x_i|; p = 0: the
/// number of nonzero values.
double norm(std::span<const double> x, double p);

/// Gradients of the smooth reductions with respect to x, for an incoming gradient of 1 on
/// the result (multiply by the actual incoming gradient).
/// var: 2 (x_i - mean) / (n - correction).
std::vector<double> var_backward(std::span<const double> x, double correction);
/// logsumexp: softmax, exp(x_i - logsumexp(x)).
std::vector<double> logsumexp_backward(std::span<const double> x);
/// norm, finite p != 0: sign(x_i) |x_i|^(p-1) / norm^(p-1); 0 where the norm is 0.
std::vector<double> norm_backward(std::span<const double> x, double p);

}  // namespace ampgrad::reference

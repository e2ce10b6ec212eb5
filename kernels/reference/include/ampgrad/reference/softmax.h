// Softmax and log-softmax, forward and backward, in float64: the specification that the
// fast kernels (kernels/cpu/norm.cpp, kernels/cuda) implement. Plain loops, no dependency
// on the library: read it alone.
//
// Layout: x is a row-major array viewed as [outer, n, inner]; the softmax runs along the
// middle axis (n values, `inner` apart), once for each of the outer * inner lines. A
// softmax over dim d of a tensor of shape s is outer = s[0] * ... * s[d-1], n = s[d],
// inner = s[d+1] * ... (inner = 1: the last dim).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace ampgrad::reference {

/// y_i = exp(x_i) / sum_j exp(x_j) along each line.
std::vector<double> softmax(std::span<const double> x, int64_t outer, int64_t n, int64_t inner);

/// y_i = x_i - log sum_j exp(x_j) along each line.
std::vector<double> log_softmax(std::span<const double> x, int64_t outer, int64_t n, int64_t inner);

/// The gradient with respect to x, given y = softmax(x) and the gradient dy of a loss with
/// respect to y: dx_i = y_i (dy_i - sum_j dy_j y_j).
std::vector<double> softmax_backward(std::span<const double> y, std::span<const double> dy, int64_t outer, int64_t n,
                                     int64_t inner);

/// The gradient with respect to x, given y = log_softmax(x) and dy:
/// dx_i = dy_i - exp(y_i) sum_j dy_j.
std::vector<double> log_softmax_backward(std::span<const double> y, std::span<const double> dy, int64_t outer,
                                         int64_t n, int64_t inner);

}  // namespace ampgrad::reference

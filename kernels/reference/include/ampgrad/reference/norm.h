// Layer normalization, forward and backward, in float64: the specification that the fast
// kernels (kernels/cpu/norm.cpp, kernels/cuda) implement. Plain loops, no dependency on
// the library: read it alone.
//
// Layout: x is row-major [rows, n]; each row of n values is normalized on its own (a
// layer_norm over normalized_shape of numel n of a tensor of numel rows * n).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace ampgrad::reference {

/// y = (x - mean) / sqrt(var + eps) * w + b per row, var the biased (population) variance.
/// w and b have n elements each, or are empty (no weight: 1; no bias: 0).
std::vector<double> layer_norm(std::span<const double> x, int64_t rows, int64_t n, std::span<const double> w,
                               std::span<const double> b, double eps);

/// The gradients of layer_norm for the incoming gradient dy ([rows, n]): dx [rows, n], and
/// dw and db [n] summed over the rows (w empty: a weight of ones).
struct LayerNormGrads {
  std::vector<double> dx, dw, db;
};
LayerNormGrads layer_norm_backward(std::span<const double> x, std::span<const double> dy, int64_t rows, int64_t n,
                                   std::span<const double> w, double eps);

}  // namespace ampgrad::reference

// Layer norm, derived step by step. For one row x of n values:
//   mu   = (1/n) sum_i x_i
//   var  = (1/n) sum_i (x_i - mu)^2          (two passes: no cancellation of x^2 - mu^2)
//   rstd = 1 / sqrt(var + eps)
//   xhat = (x - mu) rstd                      (mean 0, variance var / (var + eps) ~ 1)
//   y    = w xhat + b
#include "ampgrad/reference/norm.h"

#include <cmath>

namespace ampgrad::reference {

namespace {

// mu and rstd of row r.
struct RowStats {
  double mu, rstd;
};
RowStats row_stats(std::span<const double> x, int64_t r, int64_t n, double eps) {
  const double* row = x.data() + r * n;
  double mu = 0;
  for (int64_t i = 0; i < n; ++i) mu += row[i];
  mu /= double(n);
  double var = 0;
  for (int64_t i = 0; i < n; ++i) var += (row[i] - mu) * (row[i] - mu);
  var /= double(n);
  return {mu, 1 / std::sqrt(var + eps)};
}

double weight(std::span<const double> w, int64_t i) { return w.empty() ? 1.0 : w[size_t(i)]; }

}  // namespace

std::vector<double> layer_norm(std::span<const double> x, int64_t rows, int64_t n, std::span<const double> w,
                               std::span<const double> b, double eps) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    const auto [mu, rstd] = row_stats(x, r, n, eps);
    for (int64_t i = 0; i < n; ++i) {
      const size_t k = size_t(r * n + i);
      const double xhat = (x[k] - mu) * rstd;
      y[k] = xhat * weight(w, i) + (b.empty() ? 0.0 : b[size_t(i)]);
    }
  }
  return y;
}

// Backward, one row at a time. The parameters are the easy part: y_i = w_i xhat_i + b_i, so
//   dw_i += dy_i xhat_i,   db_i += dy_i   (summed over the rows that share w and b).
// For x, let g_i = dy_i w_i be the gradient with respect to xhat. xhat depends on every x_j
// through mu and rstd:
//   d xhat_i / d x_j = rstd (delta_ij - 1/n) - (x_i - mu) rstd^3 (1/n) (x_j - mu)
//                    = (rstd / n) (n delta_ij - 1 - xhat_i xhat_j)
// (using d mu/dx_j = 1/n and d var/dx_j = (2/n)(x_j - mu), whose mean-term vanishes because
// the deviations sum to 0). Contracting with g:
//   dx_j = sum_i g_i d xhat_i / d x_j = rstd (g_j - mean(g) - xhat_j mean(g xhat)).
LayerNormGrads layer_norm_backward(std::span<const double> x, std::span<const double> dy, int64_t rows, int64_t n,
                                   std::span<const double> w, double eps) {
  LayerNormGrads out{std::vector<double>(x.size()), std::vector<double>(size_t(n), 0.0),
                     std::vector<double>(size_t(n), 0.0)};
  std::vector<double> xhat(static_cast<size_t>(n));
  for (int64_t r = 0; r < rows; ++r) {
    const auto [mu, rstd] = row_stats(x, r, n, eps);
    double mean_g = 0, mean_gxhat = 0;
    for (int64_t i = 0; i < n; ++i) {
      const size_t k = size_t(r * n + i);
      xhat[size_t(i)] = (x[k] - mu) * rstd;
      const double g = dy[k] * weight(w, i);
      mean_g += g;
      mean_gxhat += g * xhat[size_t(i)];
      out.dw[size_t(i)] += dy[k] * xhat[size_t(i)];
      out.db[size_t(i)] += dy[k];
    }
    mean_g /= double(n);
    mean_gxhat /= double(n);
    for (int64_t i = 0; i < n; ++i) {
      const size_t k = size_t(r * n + i);
      out.dx[k] = rstd * (dy[k] * weight(w, i) - mean_g - xhat[size_t(i)] * mean_gxhat);
    }
  }
  return out;
}

}  // namespace ampgrad::reference

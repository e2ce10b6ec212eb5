// Attention as the textbook writes it, one batch entry b at a time:
//   S = scale q k^T + mask      [Tq, Tk]   (-inf where the causal rule hides a key)
//   P = softmax of each row of S
//   P' = P * dropout            (elementwise; P' = P without dropout)
//   O = P' v                    [Tq, Dv]
// The fast kernels never hold S: they walk it in tiles with a running max (the online
// softmax). This holds it, row by row.
#include "ampgrad/reference/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace ampgrad::reference {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Row i of P for batch entry b (Tk values), undropped; all zeros when the row sees no key.
std::vector<double> probabilities(std::span<const double> q, std::span<const double> k, const AttentionShape& sh,
                                  const AttentionOptions& o, int64_t b, int64_t i) {
  const int64_t Tk = sh.Tk, D = sh.D;
  std::vector<double> s(static_cast<size_t>(Tk));
  double m = -kInf;
  for (int64_t j = 0; j < Tk; ++j) {
    double dot = 0;
    for (int64_t c = 0; c < D; ++c) dot += q[size_t((b * sh.Tq + i) * D + c)] * k[size_t((b * Tk + j) * D + c)];
    const double add = o.mask.empty() ? 0.0 : o.mask[size_t((b * sh.Tq + i) * Tk + j)];
    s[size_t(j)] = o.causal && j > i ? -kInf : o.scale * dot + add;
    m = std::max(m, s[size_t(j)]);
  }
  if (m == -kInf) return std::vector<double>(size_t(Tk), 0.0);  // no visible key: no weight anywhere
  double z = 0;
  for (double& e : s) z += (e = std::exp(e - m));  // the softmax, max subtracted (softmax.h)
  for (double& e : s) e /= z;
  return s;
}

double drop(const AttentionOptions& o, const AttentionShape& sh, int64_t b, int64_t i, int64_t j) {
  return o.dropout.empty() ? 1.0 : o.dropout[size_t((b * sh.Tq + i) * sh.Tk + j)];
}

}  // namespace

std::vector<double> attention(std::span<const double> q, std::span<const double> k, std::span<const double> v,
                              const AttentionShape& sh, const AttentionOptions& o) {
  std::vector<double> out(size_t(sh.B * sh.Tq * sh.Dv), 0.0);
  for (int64_t b = 0; b < sh.B; ++b)
    for (int64_t i = 0; i < sh.Tq; ++i) {
      const std::vector<double> p = probabilities(q, k, sh, o, b, i);
      for (int64_t j = 0; j < sh.Tk; ++j) {
        const double pj = p[size_t(j)] * drop(o, sh, b, i, j);
        for (int64_t c = 0; c < sh.Dv; ++c)
          out[size_t((b * sh.Tq + i) * sh.Dv + c)] += pj * v[size_t((b * sh.Tk + j) * sh.Dv + c)];
      }
    }
  return out;
}

// Backward through the same steps in reverse, per row i of entry b (dO_i the row of dout):
//   dv_j  += P'_ij dO_i                        (O = P' v)
//   dP'_ij = dO_i . v_j
//   dP_ij  = dP'_ij dropout_ij                 (P' = P * dropout)
//   dS_ij  = P_ij (dP_ij - sum_l dP_il P_il)   (softmax's backward, softmax.h)
//   dq_i  += scale sum_j dS_ij k_j,   dk_j += scale dS_ij q_i     (S = scale q k^T + mask)
// The mask is a constant and gets no gradient. (sum_l dP_il P_il equals dO_i . O_i, the
// form FlashAttention-2 uses, since O_i = sum_l P'_il v_l.)
AttentionGrads attention_backward(std::span<const double> q, std::span<const double> k, std::span<const double> v,
                                  std::span<const double> dout, const AttentionShape& sh, const AttentionOptions& o) {
  const int64_t Tq = sh.Tq, Tk = sh.Tk, D = sh.D, Dv = sh.Dv;
  AttentionGrads g{std::vector<double>(q.size(), 0.0), std::vector<double>(k.size(), 0.0),
                   std::vector<double>(v.size(), 0.0)};
  std::vector<double> dp(static_cast<size_t>(Tk));
  for (int64_t b = 0; b < sh.B; ++b)
    for (int64_t i = 0; i < Tq; ++i) {
      const std::vector<double> p = probabilities(q, k, sh, o, b, i);
      const double* dO = dout.data() + (b * Tq + i) * Dv;
      double dot = 0;
      for (int64_t j = 0; j < Tk; ++j) {
        const double dr = drop(o, sh, b, i, j);
        double dpj = 0;
        for (int64_t c = 0; c < Dv; ++c) {
          const size_t vj = size_t((b * Tk + j) * Dv + c);
          g.dv[vj] += p[size_t(j)] * dr * dO[c];
          dpj += dO[c] * v[vj];
        }
        dp[size_t(j)] = dpj * dr;
        dot += dp[size_t(j)] * p[size_t(j)];
      }
      for (int64_t j = 0; j < Tk; ++j) {
        const double ds = p[size_t(j)] * (dp[size_t(j)] - dot);
        for (int64_t c = 0; c < D; ++c) {
          g.dq[size_t((b * Tq + i) * D + c)] += o.scale * ds * k[size_t((b * Tk + j) * D + c)];
          g.dk[size_t((b * Tk + j) * D + c)] += o.scale * ds * q[size_t((b * Tq + i) * D + c)];
        }
      }
    }
  return g;
}

}  // namespace ampgrad::reference

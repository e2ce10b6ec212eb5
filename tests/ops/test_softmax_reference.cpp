// softmax and log_softmax, values and gradients in float32 and bfloat16 against the
// float64 reference (kernels/reference), with a random upstream gradient, under several
// leading shapes: along the last dim on rows of 7 to 1000 (the row form of
// kernels/cpu/norm.cpp sums in rows.h's eight lanes and a tail), and along an inner dim (the
// column form's blocks of up to 16 columns, and a partial block). The kernels run their
// AVX-512 variant where the CPU has it (cpu_has_avx512) and their baseline build elsewhere:
// each machine checks the one it runs.
#include <gtest/gtest.h>

#include <ampgrad/ampgrad.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "ampgrad/reference/softmax.h"
#include "support/testing.h"

namespace {

using ag::DType;
using ag::Tensor;

double unit_roundoff(DType dt) { return dt == ag::kBFloat16 ? 0x1p-8 : 0x1p-24; }

// |got - want| <= tol elementwise; the failure names the worst element (by its ratio to tol).
::testing::AssertionResult within(const Tensor& got, const std::vector<double>& want, const std::vector<double>& tol) {
  const std::vector<double> g = got.to_vector<double>();
  if (g.size() != want.size()) return ::testing::AssertionFailure() << g.size() << " elements, want " << want.size();
  size_t worst = 0;
  double ratio = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double r = std::abs(g[i] - want[i]) / tol[i];
    if (!(r <= ratio)) worst = i, ratio = r;  // NaN counts as the worst
  }
  if (ratio <= 1) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "element " << worst << ": got " << g[worst] << ", want " << want[worst]
                                       << " (tolerance " << tol[worst] << ", exceeded " << ratio << " times)";
}

struct Expected {
  std::vector<double> y, y_tol, dx, dx_tol;
};

// The float64 values and gradient (for upstream gradient g) of softmax or log-softmax of x
// along dim, and what the kernel may be off by: its float32 arithmetic (exp within 1.5 ulp
// of e^x, eight-lane sums whose relative error is at most gamma) and the rounding to dt of
// the stored output, which the backward reads, and of the gradient.
Expected reference(const Tensor& x, const Tensor& g, int64_t dim, bool log, DType dt) {
  const std::vector<double> xv = x.to_vector<double>(), gv = g.to_vector<double>();
  const std::vector<double> p = agt::ref_softmax(x, dim, false).to_vector<double>();
  const std::vector<double> lp = agt::ref_softmax(x, dim, true).to_vector<double>();
  // Named copies, not a structured binding: the lambdas below capture them (clang before 16
  // refuses to capture bindings).
  const auto lines = agt::lines_along(x, dim);
  const int64_t outer = lines.outer, n = lines.n, inner = lines.inner;
  // the float64 gradients, by the reference; what follows bounds the kernel's error
  const std::vector<double> dp = ampgrad::reference::softmax_backward(p, gv, outer, n, inner);
  const std::vector<double> dlp = ampgrad::reference::log_softmax_backward(lp, gv, outer, n, inner);
  const double u = unit_roundoff(dt), e = 0x1p-24;
  const double gamma = (double(n) / 8 + 12) * e;  // a lane's n/8 terms, the combining and the tail
  Expected r;
  for (auto* v : {&r.y, &r.y_tol, &r.dx, &r.dx_tol}) v->resize(xv.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t c = 0; c < inner; ++c) {
      const auto at = [&](int64_t i) { return size_t((o * n + i) * inner + c); };
      double m = -INFINITY, dot = 0, sum = 0, abs_dot = 0, abs_sum = 0;
      for (int64_t i = 0; i < n; ++i) {
        const size_t k = at(i);
        m = std::max(m, xv[k]);
        dot += gv[k] * p[k], sum += gv[k];
        abs_dot += std::abs(gv[k]) * p[k], abs_sum += std::abs(gv[k]);
      }
      // the stored softmax's relative error: x - m rounded (amplified by |x - m| through exp),
      // exp, the sum, the scaling and the storage
      double delta = 0;
      for (int64_t i = 0; i < n; ++i) delta = std::max(delta, u + gamma + e * (std::abs(xv[at(i)] - m) + 4));
      for (int64_t i = 0; i < n; ++i) {
        const size_t k = at(i);
        if (!log) {
          r.y[k] = p[k];
          r.y_tol[k] = delta * p[k];
          // y (g - <g, y>): the stored y's error in both factors, the dot's sum, two roundings, the storage
          r.dx[k] = dp[k];  // y (g - <g, y>)
          r.dx_tol[k] = 2 * ((delta + gamma + 2 * e) * p[k] * (std::abs(gv[k] - dot) + abs_dot) + u * std::abs(r.dx[k]));
        } else {
          r.y[k] = lp[k];
          // x - m and the subtracted log of the sum (its rounding and the sum's) rounded, and the storage
          r.y_tol[k] = (u + 4 * e) * (std::abs(lp[k]) + std::abs(xv[k] - m) + std::log(double(n)) + 1) + gamma;
          // g - exp(y) sum(g): the stored y's absolute error becomes exp(y)'s relative one; exp,
          // the sum, two roundings, the storage
          r.dx[k] = dlp[k];  // g - exp(y) sum(g)
          r.dx_tol[k] = 2 * (p[k] * (std::abs(sum) * (r.y_tol[k] + 4 * e) + gamma * abs_sum) + (u + e) * std::abs(r.dx[k]));
        }
      }
    }
  return r;
}

struct SoftmaxShape {
  std::vector<int64_t> sizes;
  int64_t dim;
};

// Row lengths around the lane counts and past them, each along the last dim and along an
// inner dim (of 3, 16 or 21 columns: one partial block, one full block, a block and a tail),
// under no, one and two leading dims.
std::vector<SoftmaxShape> shapes() {
  std::vector<SoftmaxShape> out;
  const std::vector<std::vector<int64_t>> leads = {{}, {3}, {2, 3}};
  const int64_t inners[] = {3, 16, 21};
  int k = 0;
  for (int64_t n : {7, 8, 9, 16, 17, 33, 100, 1000})
    for (const auto& lead : leads) {
      std::vector<int64_t> s = lead;
      s.push_back(n);
      out.push_back({s, -1});
      s.push_back(inners[k++ % 3]);
      out.push_back({s, -2});
    }
  return out;
}

TEST(SoftmaxReference, ValuesAndGradientsAgainstFloat64) {
  ag::manual_seed(43);
  for (DType dt : {ag::kFloat32, ag::kBFloat16})
    for (const SoftmaxShape& s : shapes())
      for (bool log : {false, true}) {
        SCOPED_TRACE(std::string(log ? "log_softmax " : "softmax ") + ag::dtype_name(dt) + " " +
                     ::testing::PrintToString(s.sizes) + " dim " + std::to_string(s.dim));
        Tensor x = (ag::randn(s.sizes) * 2.0).to(dt);
        x.requires_grad_(true);
        const Tensor g = agt::randf(s.sizes, dt);
        const Tensor y = log ? ag::log_softmax(x, s.dim) : ag::softmax(x, s.dim);
        y.backward(g);
        ASSERT_EQ(x.grad().dtype(), dt);
        const Expected want = reference(x.detach(), g, s.dim, log, dt);
        EXPECT_TRUE(within(y, want.y, want.y_tol));
        EXPECT_TRUE(within(x.grad(), want.dx, want.dx_tol));
      }
}

}  // namespace

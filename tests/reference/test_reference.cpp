// The reference kernels (kernels/reference) checked on their own: each backward against
// central finite differences of its own forward, in float64, and identities that can be
// derived by hand (softmax sums to 1, a normalized row has mean 0 and variance 1, Adam's
// bias correction makes a constant gradient's step lr sign(g), ...). The library's kernels
// are checked against these references in the ops, nn and autocast suites.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "ampgrad/reference/attention.h"
#include "ampgrad/reference/grad_scaler.h"
#include "ampgrad/reference/loss.h"
#include "ampgrad/reference/norm.h"
#include "ampgrad/reference/optim.h"
#include "ampgrad/reference/reduce.h"
#include "ampgrad/reference/softmax.h"

namespace {

namespace ref = ampgrad::reference;
using Vec = std::vector<double>;

Vec uniform(size_t n, double lo, double hi, unsigned seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  Vec v(n);
  for (double& x : v) x = d(gen);
  return v;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// df/dx_i by central differences, (f(x + h e_i) - f(x - h e_i)) / 2h: error O(h^2) from
// the truncation plus O(eps_machine / h) from the rounding, about 1e-10 at h = 1e-6.
Vec numeric_grad(const std::function<double(const Vec&)>& f, Vec x, double h = 1e-6) {
  Vec g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double xi = x[i];
    x[i] = xi + h;
    const double up = f(x);
    x[i] = xi - h;
    const double down = f(x);
    x[i] = xi;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

// |got - want| <= atol + rtol |want| elementwise; the failure names the worst element.
::testing::AssertionResult close(const Vec& got, const Vec& want, double atol = 1e-7, double rtol = 1e-6) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << got.size() << " values, want " << want.size();
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::abs(got[i] - want[i]) <= atol + rtol * std::abs(want[i])))
      return ::testing::AssertionFailure() << "element " << i << ": got " << got[i] << ", want " << want[i];
  return ::testing::AssertionSuccess();
}

constexpr double kInf = std::numeric_limits<double>::infinity();

}  // namespace

// ---- softmax --------------------------------------------------------------------------------

TEST(Reference, SoftmaxBackwardMatchesFiniteDifferences) {
  // [outer 2, n 5, inner 3]: along a middle dim, so the lines are strided.
  const int64_t outer = 2, n = 5, inner = 3;
  const Vec x = uniform(30, -3, 3, 1), dy = uniform(30, -1, 1, 2);
  for (bool log : {false, true}) {
    SCOPED_TRACE(log ? "log_softmax" : "softmax");
    auto f = [&](const Vec& v) {
      return dot(dy, log ? ref::log_softmax(v, outer, n, inner) : ref::softmax(v, outer, n, inner));
    };
    const Vec y = log ? ref::log_softmax(x, outer, n, inner) : ref::softmax(x, outer, n, inner);
    const Vec dx =
        log ? ref::log_softmax_backward(y, dy, outer, n, inner) : ref::softmax_backward(y, dy, outer, n, inner);
    EXPECT_TRUE(close(dx, numeric_grad(f, x)));
  }
}

TEST(Reference, SoftmaxIdentities) {
  const int64_t outer = 3, n = 7, inner = 2;
  Vec x = uniform(42, -5, 5, 3);
  x[0] = 800;  // exp(800) overflows: the max is subtracted first
  const Vec p = ref::softmax(x, outer, n, inner), lp = ref::log_softmax(x, outer, n, inner);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t c = 0; c < inner; ++c) {
      double s = 0;
      for (int64_t i = 0; i < n; ++i) s += p[size_t((o * n + i) * inner + c)];
      EXPECT_NEAR(s, 1, 1e-15) << "line " << o << ", " << c;
    }
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_GE(p[i], 0);
    EXPECT_NEAR(std::exp(lp[i]), p[i], 1e-15);
  }
  // shifting a line changes nothing; the uniform line is 1/n
  Vec shifted = x;
  for (double& v : shifted) v += 100;
  EXPECT_TRUE(close(ref::softmax(shifted, outer, n, inner), p, 1e-15, 1e-12));
  EXPECT_TRUE(close(ref::softmax(Vec(4, 2.5), 1, 4, 1), Vec(4, 0.25), 0, 0));
  // a gradient constant along the line is invisible to softmax (its outputs sum to 1)
  EXPECT_TRUE(close(ref::softmax_backward(p, Vec(42, 3.0), outer, n, inner), Vec(42, 0.0), 1e-15, 0));
}

// ---- layer norm -----------------------------------------------------------------------------

TEST(Reference, LayerNormBackwardMatchesFiniteDifferences) {
  const int64_t rows = 4, n = 6;
  const Vec x = uniform(24, -2, 2, 4), w = uniform(6, 0.5, 1.5, 5), b = uniform(6, -1, 1, 6),
            dy = uniform(24, -1, 1, 7);
  for (bool affine : {true, false}) {
    SCOPED_TRACE(affine ? "weight and bias" : "no weight");
    const Vec wv = affine ? w : Vec{}, bv = affine ? b : Vec{};
    const ref::LayerNormGrads g = ref::layer_norm_backward(x, dy, rows, n, wv, 1e-5);
    EXPECT_TRUE(
        close(g.dx, numeric_grad([&](const Vec& v) { return dot(dy, ref::layer_norm(v, rows, n, wv, bv, 1e-5)); }, x)))
        << "dx";
    if (!affine) continue;
    EXPECT_TRUE(
        close(g.dw, numeric_grad([&](const Vec& v) { return dot(dy, ref::layer_norm(x, rows, n, v, b, 1e-5)); }, w)))
        << "dw";
    EXPECT_TRUE(
        close(g.db, numeric_grad([&](const Vec& v) { return dot(dy, ref::layer_norm(x, rows, n, w, v, 1e-5)); }, b)))
        << "db";
  }
}

TEST(Reference, LayerNormRowsHaveMeanZeroAndVarianceOne) {
  const int64_t rows = 3, n = 50;
  Vec x = uniform(150, -4, 4, 8);
  for (int64_t i = 0; i < n; ++i) x[size_t(i)] = 1e6 + double(i);  // a large mean: two passes do not cancel
  const Vec y = ref::layer_norm(x, rows, n, {}, {}, 0);
  for (int64_t r = 0; r < rows; ++r) {
    const std::span<const double> row(y.data() + r * n, size_t(n));
    EXPECT_NEAR(ref::mean(row), 0, 1e-12) << "row " << r;
    EXPECT_NEAR(ref::var(row, 0), 1, 1e-12) << "row " << r;
  }
  // eps makes the variance var / (var + eps): a constant row normalizes to 0, not NaN
  const Vec c = ref::layer_norm(Vec(8, 3.0), 1, 8, {}, {}, 1e-5);
  EXPECT_TRUE(close(c, Vec(8, 0.0), 0, 0));
  // the affine part: y = w xhat + b
  const Vec w = uniform(size_t(n), 0.5, 2, 9), b = uniform(size_t(n), -1, 1, 10);
  const Vec ya = ref::layer_norm(x, rows, n, w, b, 0);
  for (size_t k = 0; k < ya.size(); ++k) EXPECT_NEAR(ya[k], y[k] * w[k % size_t(n)] + b[k % size_t(n)], 1e-12);
}

// ---- reductions -----------------------------------------------------------------------------

TEST(Reference, ReductionBackwardsMatchFiniteDifferences) {
  const Vec x = uniform(9, -2, 2, 11);
  for (double c : {0.0, 1.0}) {
    SCOPED_TRACE("var, correction " + std::to_string(c));
    EXPECT_TRUE(close(ref::var_backward(x, c), numeric_grad([&](const Vec& v) { return ref::var(v, c); }, x)));
  }
  EXPECT_TRUE(close(ref::logsumexp_backward(x), numeric_grad([](const Vec& v) { return ref::logsumexp(v); }, x)));
  for (double p : {1.0, 2.0, 3.0, 0.5}) {
    SCOPED_TRACE("norm p " + std::to_string(p));
    EXPECT_TRUE(close(ref::norm_backward(x, p), numeric_grad([&](const Vec& v) { return ref::norm(v, p); }, x)));
  }
}

TEST(Reference, ReductionIdentities) {
  const Vec v{1, 2, 3, 4};
  EXPECT_EQ(ref::sum(v), 10);
  EXPECT_EQ(ref::mean(v), 2.5);
  EXPECT_NEAR(ref::var(v, 1), 5.0 / 3, 1e-15);  // squared deviations 2.25 + 0.25 + 0.25 + 2.25 = 5
  EXPECT_NEAR(ref::var(v, 0), 5.0 / 4, 1e-15);
  EXPECT_EQ(ref::var(Vec(5, 1e8 + 0.5), 1), 0);                                     // no cancellation
  EXPECT_TRUE(std::isinf(ref::var(Vec{2}, 1)) || std::isnan(ref::var(Vec{2}, 1)));  // n - correction = 0
  EXPECT_TRUE(std::isnan(ref::mean(Vec{})));
  // extremes: the first of ties, NaN is the extreme
  const Vec t{1, 5, 5, -2, -2};
  EXPECT_EQ(ref::argmax(t), 1);
  EXPECT_EQ(ref::argmin(t), 3);
  EXPECT_EQ(ref::max(t), 5);
  EXPECT_EQ(ref::min(t), -2);
  const Vec nan{1, NAN, 9, NAN};
  EXPECT_EQ(ref::argmax(nan), 1);
  EXPECT_EQ(ref::argmin(nan), 1);
  EXPECT_TRUE(std::isnan(ref::max(nan)));
  // logsumexp: n equal values give x + log n, without overflow at 1000; infinities pass
  EXPECT_NEAR(ref::logsumexp(Vec(8, 1000)), 1000 + std::log(8.0), 1e-12);
  EXPECT_EQ(ref::logsumexp(Vec{-kInf, -kInf}), -kInf);
  EXPECT_EQ(ref::logsumexp(Vec{1, kInf}), kInf);
  // norms of (3, -4, 0)
  const Vec n{3, -4, 0};
  EXPECT_EQ(ref::norm(n, 2), 5);
  EXPECT_EQ(ref::norm(n, 1), 7);
  EXPECT_EQ(ref::norm(n, kInf), 4);
  EXPECT_EQ(ref::norm(n, -kInf), 0);
  EXPECT_EQ(ref::norm(n, 0), 2);
  EXPECT_NEAR(ref::norm(n, 3), std::cbrt(91.0), 1e-14);
}

// ---- cross entropy --------------------------------------------------------------------------

TEST(Reference, CrossEntropyBackwardMatchesFiniteDifferences) {
  // [N 3, C 4, S 2], one position ignored, with and without label smoothing
  const int64_t N = 3, C = 4, S = 2;
  const Vec x = uniform(24, -3, 3, 12), dl = uniform(6, 0.2, 1, 13);
  const std::vector<int64_t> t{0, 3, -100, 2, 1, 1};
  for (double ls : {0.0, 0.3, 1.0}) {
    SCOPED_TRACE("label smoothing " + std::to_string(ls));
    const ref::CrossEntropyOptions o{.ignore_index = -100, .label_smoothing = ls};
    const Vec dx = ref::cross_entropy_backward(x, t, dl, N, C, S, o);
    EXPECT_TRUE(
        close(dx, numeric_grad([&](const Vec& v) { return dot(dl, ref::cross_entropy(v, t, N, C, S, o)); }, x)));
    for (int64_t c = 0; c < C; ++c) EXPECT_EQ(dx[size_t((1 * C + c) * S + 0)], 0.0) << "ignored position";
  }
}

TEST(Reference, CrossEntropyIdentities) {
  // uniform logits: every class has probability 1/C, the loss is log C whatever the target
  // or the smoothing
  for (double ls : {0.0, 0.25})
    EXPECT_TRUE(close(ref::cross_entropy(Vec(10, 0.7), std::vector<int64_t>{0, 4}, 2, 5, 1, {-100, ls}),
                      Vec(2, std::log(5.0)), 1e-15, 1e-15));
  // cross entropy is nll of log_softmax; smoothing 1 is the mean of -log p over classes
  const Vec x = uniform(12, -2, 2, 14);
  const std::vector<int64_t> t{2, 0, 3};
  EXPECT_TRUE(close(ref::cross_entropy(x, t, 3, 4, 1), ref::nll_loss(ref::log_softmax(x, 3, 4, 1), t, 3, 4, 1), 1e-15));
  const Vec lp = ref::log_softmax(x, 3, 4, 1);
  const Vec all = ref::cross_entropy(x, t, 3, 4, 1, {-100, 1.0});
  for (int64_t n = 0; n < 3; ++n)
    EXPECT_NEAR(all[size_t(n)], -ref::mean(std::span<const double>(lp.data() + n * 4, 4)), 1e-14);
  // reductions: Mean counts only the targets that are not ignored; none counted: NaN
  const Vec l{1, 2, 3};
  const std::vector<int64_t> ti{0, 7, 1};
  EXPECT_EQ(ref::reduce_loss(l, ti, 7, ref::Reduction::Sum), Vec{6});
  EXPECT_EQ(ref::reduce_loss(l, ti, 7, ref::Reduction::Mean), Vec{3});
  EXPECT_EQ(ref::reduce_loss(l, ti, 7, ref::Reduction::None), l);
  EXPECT_TRUE(std::isnan(ref::reduce_loss(Vec{0, 0}, std::vector<int64_t>{7, 7}, 7, ref::Reduction::Mean)[0]));
  // a confident right answer costs nearly nothing; the gradient of p - onehot sums to 0
  EXPECT_NEAR(ref::cross_entropy(Vec{50, 0, 0}, std::vector<int64_t>{0}, 1, 3, 1)[0], 0, 1e-20);
  const Vec g = ref::cross_entropy_backward(x, t, Vec(3, 1.0), 3, 4, 1);
  for (int64_t n = 0; n < 3; ++n) EXPECT_NEAR(ref::sum(std::span<const double>(g.data() + n * 4, 4)), 0, 1e-15);
}

// ---- attention ------------------------------------------------------------------------------

TEST(Reference, AttentionBackwardMatchesFiniteDifferences) {
  const ref::AttentionShape sh{2, 4, 5, 3, 2};
  const Vec q = uniform(24, -1, 1, 15), k = uniform(30, -1, 1, 16), v = uniform(20, -1, 1, 17);
  const Vec dout = uniform(16, -1, 1, 18);
  Vec mask = uniform(40, -1, 1, 19);
  mask[3] = -kInf;                                           // a hidden key
  for (int j = 0; j < 5; ++j) mask[size_t(20 + j)] = -kInf;  // a row of entry 1 that sees no key
  Vec drop(40);
  for (size_t i = 0; i < drop.size(); ++i) drop[i] = i % 3 == 0 ? 0.0 : 1.5;  // p = 1/3
  struct Case {
    const char* what;
    ref::AttentionOptions o;
  };
  for (const Case& c : {Case{"plain", {.scale = 0.7}}, Case{"causal", {.scale = 0.7, .causal = true}},
                        Case{"mask", {.scale = 0.7, .mask = mask}},
                        Case{"mask and dropout", {.scale = -1.2, .mask = mask, .dropout = drop}}}) {
    SCOPED_TRACE(c.what);
    const ref::AttentionGrads g = ref::attention_backward(q, k, v, dout, sh, c.o);
    EXPECT_TRUE(close(g.dq, numeric_grad([&](const Vec& x) { return dot(dout, ref::attention(x, k, v, sh, c.o)); }, q)))
        << "dq";
    EXPECT_TRUE(close(g.dk, numeric_grad([&](const Vec& x) { return dot(dout, ref::attention(q, x, v, sh, c.o)); }, k)))
        << "dk";
    EXPECT_TRUE(close(g.dv, numeric_grad([&](const Vec& x) { return dot(dout, ref::attention(q, k, x, sh, c.o)); }, v)))
        << "dv";
  }
}

TEST(Reference, AttentionIdentities) {
  // one key: every query returns its value; equal keys: the mean of the values
  const Vec q = uniform(6, -1, 1, 20), v1 = uniform(2, -1, 1, 21), v3 = uniform(6, -1, 1, 22);
  const Vec one = ref::attention(q, Vec{0.3, -0.2}, v1, {1, 3, 1, 2, 2}, {.scale = 1});
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(close({one[size_t(2 * i)], one[size_t(2 * i + 1)]}, v1, 1e-15, 0));
  const Vec same = ref::attention(q, Vec{0.5, 0.1, 0.5, 0.1, 0.5, 0.1}, v3, {1, 3, 3, 2, 2}, {.scale = 1});
  const Vec mean_v{(v3[0] + v3[2] + v3[4]) / 3, (v3[1] + v3[3] + v3[5]) / 3};
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(close({same[size_t(2 * i)], same[size_t(2 * i + 1)]}, mean_v, 1e-15, 1e-14));
  // causal: the first query sees only the first key, whatever the others hold
  const Vec k3 = uniform(6, -1, 1, 23);
  const Vec causal = ref::attention(q, k3, v3, {1, 3, 3, 2, 2}, {.scale = 1, .causal = true});
  EXPECT_TRUE(close({causal[0], causal[1]}, {v3[0], v3[1]}, 1e-15, 0));
  // a mask of -inf everywhere: zeros, and zero gradients
  const Vec hidden(9, -kInf);
  EXPECT_TRUE(close(ref::attention(q, k3, v3, {1, 3, 3, 2, 2}, {.scale = 1, .mask = hidden}), Vec(6, 0.0), 0, 0));
  const ref::AttentionGrads g =
      ref::attention_backward(q, k3, v3, Vec(6, 1.0), {1, 3, 3, 2, 2}, {.scale = 1, .mask = hidden});
  EXPECT_TRUE(close(g.dq, Vec(6, 0.0), 0, 0));
  EXPECT_TRUE(close(g.dk, Vec(6, 0.0), 0, 0));
  EXPECT_TRUE(close(g.dv, Vec(6, 0.0), 0, 0));
}

// ---- optimizers and the grad scaler ---------------------------------------------------------

TEST(Reference, AdamBiasCorrectionMakesAConstantGradientsStepLrSignG) {
  // With a constant gradient g, m = (1 - beta1^t) g and v = (1 - beta2^t) g^2: the
  // corrected mhat = g and vhat = g^2, so (eps 0) every step moves each parameter by
  // lr sign(g), from the first step on.
  const Vec g{0.5, -2e-3, 30};
  Vec p{1, 1, 1};
  ref::AdamState s;
  for (int t = 1; t <= 5; ++t) {
    ref::adam_step(p, g, s, {.lr = 0.1, .beta1 = 0.9, .beta2 = 0.999, .eps = 0});
    EXPECT_TRUE(close(p, {1 - 0.1 * t, 1 + 0.1 * t, 1 - 0.1 * t}, 1e-14, 1e-13)) << "step " << t;
  }
  EXPECT_EQ(s.step, 5);
  // AdamW with a zero gradient only decays: p (1 - lr wd)^t; Adam's L2 form instead feeds
  // wd p through the moments, a step of lr sign(p) at first
  Vec pw{2, -4}, pa{2, -4};
  ref::AdamState sw, sa;
  for (int t = 0; t < 3; ++t)
    ref::adam_step(pw, Vec{0, 0}, sw, {.lr = 0.1, .eps = 1e-8, .weight_decay = 0.5, .decoupled = true});
  EXPECT_TRUE(close(pw, {2 * std::pow(0.95, 3), -4 * std::pow(0.95, 3)}, 0, 1e-14));
  ref::adam_step(pa, Vec{0, 0}, sa, {.lr = 0.1, .eps = 0, .weight_decay = 0.5});
  EXPECT_TRUE(close(pa, {1.9, -3.9}, 0, 1e-14));
}

TEST(Reference, SgdMomentumIsARunningSum) {
  // momentum 1, no dampening: after t steps of g the buffer is t g, and p moved lr g t(t+1)/2
  Vec p{0};
  ref::SgdState s;
  for (int t = 1; t <= 4; ++t) ref::sgd_step(p, Vec{2}, s, {.lr = 0.5, .momentum = 1});
  EXPECT_EQ(s.buf[0], 8);
  EXPECT_EQ(p[0], -0.5 * 2 * 10);
  // nesterov looks ahead: g + momentum buf; weight decay adds wd p to g
  Vec q{1};
  ref::SgdState sq;
  ref::sgd_step(q, Vec{1}, sq, {.lr = 0.1, .momentum = 0.5, .weight_decay = 1, .nesterov = true});
  EXPECT_NEAR(q[0], 1 - 0.1 * (2 + 0.5 * 2), 1e-15);
}

TEST(Reference, GradScalerUnscalesAndFindsNonFiniteBeforeScaling) {
  Vec g{8, -4, 2};
  EXPECT_FALSE(ref::unscale_and_check(g, 4));
  EXPECT_EQ(g, (Vec{2, -1, 0.5}));
  for (double bad : {kInf, -kInf, double(NAN)}) {
    Vec h{1, bad, 1};
    EXPECT_TRUE(ref::unscale_and_check(h, 2)) << bad;
    EXPECT_EQ(h[0], 0.5);
  }
  Vec big{1e308};
  EXPECT_FALSE(ref::unscale_and_check(big, 1e-10));  // overflows only after the multiplication
  EXPECT_EQ(big[0], kInf);
}

TEST(Reference, GradScalerUpdateGrowsBacksOffAndRespectsItsBounds) {
  const ref::ScaleUpdateOptions o{.growth_factor = 2, .backoff_factor = 0.25, .growth_interval = 3};
  double s = 64;
  int64_t tracker = 0;
  // clean, clean: counting; the third clean iteration grows and restarts the count
  ref::update_scale(s, tracker, false, o);
  ref::update_scale(s, tracker, false, o);
  EXPECT_EQ(s, 64);
  EXPECT_EQ(tracker, 2);
  ref::update_scale(s, tracker, false, o);
  EXPECT_EQ(s, 128);
  EXPECT_EQ(tracker, 0);
  // an overflow backs off and restarts the count
  ref::update_scale(s, tracker, false, o);
  ref::update_scale(s, tracker, true, o);
  EXPECT_EQ(s, 32);
  EXPECT_EQ(tracker, 0);
  // floor and cap
  double lo = 4;
  int64_t t0 = 0;
  ref::update_scale(lo, t0, true, {.backoff_factor = 0.5, .min_scale = 3});
  EXPECT_EQ(lo, 3);
  double hi = 48;
  int64_t t1 = 0;
  ref::update_scale(hi, t1, false, {.growth_factor = 2, .growth_interval = 1, .max_scale = 64});
  EXPECT_EQ(hi, 64);
  // growth past the largest float32 is refused (the scale multiplies float32 values)
  double top = double(std::numeric_limits<float>::max()) / 1.5;
  const double before = top;
  int64_t t2 = 0;
  ref::update_scale(top, t2, false, {.growth_factor = 2, .growth_interval = 1});
  EXPECT_EQ(top, before);
  EXPECT_EQ(t2, 0);
}

// The vector math kernels (kernels/cpu/vmath.h) against the scalar functors of
// kernels/functors.h evaluated in float64 (the reference: the op's one definition, in a
// precision where its own rounding does not matter), for every instruction set this build
// has and this CPU runs, over a sweep of float32 bit patterns and the edges (zeros,
// denormals, FLT_MIN/FLT_MAX, the exp overflow and underflow thresholds, infinities, NaN).
// The bounds asserted here are the accuracy that docs/kernels.md states.
#include <gtest/gtest.h>

#include <ampgrad/ampgrad.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "cpu/vmath.h"
#include "functors.h"
#include "support/testing.h"

namespace {

namespace vm = ag::cpu::vmath;
using ag::BinaryOp;
using ag::UnaryOp;

// Distance in units in the last place between two floats (0 for two NaNs; "infinite" when
// exactly one is NaN, or an infinity meets a finite value).
double ulp_distance(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b) ? 0.0 : 1e30;
  if (std::isinf(a) || std::isinf(b)) return a == b ? 0.0 : 1e30;
  const auto ordered = [](float f) {
    const int64_t i = std::bit_cast<int32_t>(f);
    return i < 0 ? int64_t(std::numeric_limits<int32_t>::min()) - i : i;
  };
  return std::abs(double(ordered(a) - ordered(b)));
}

// Every 4099th float32 bit pattern (about a million values, both signs, all exponents) and
// the edges.
std::vector<float> sweep() {
  std::vector<float> xs;
  for (uint64_t b = 0; b <= 0xFFFFFFFFull; b += 4099) xs.push_back(std::bit_cast<float>(uint32_t(b)));
  const float inf = std::numeric_limits<float>::infinity();
  for (float e : {0.0f, std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(),
                  std::numeric_limits<float>::max(), inf, std::numeric_limits<float>::quiet_NaN(),
                  1e-8f, 1e-4f, 0.5f, 1.0f, 2.0f, 3.0f, 10.0f, 88.72f, 88.7228394f, 89.0f, 87.3365f, 103.9f,
                  104.0f, 1e30f, 1e38f}) {
    xs.push_back(e);
    xs.push_back(-e);
  }
  for (int i = -2000; i <= 2000; ++i) xs.push_back(float(i) / 200.0f);  // [-10, 10], dense
  return xs;
}

struct Worst {
  double ulp = 0;
  float at = 0, got = 0, want = 0;
};

// The instruction sets to test: each this build has kernels for, skipped (with the reason)
// where this CPU lacks it.
class Vmath : public ::testing::TestWithParam<vm::Isa> {
 protected:
  void SetUp() override {
    if (vm::best_isa() == vm::Isa::None) GTEST_SKIP() << "this build has no vector math kernels (AMPGRAD_SLEEF=OFF)";
    if (!vm::supported(GetParam())) GTEST_SKIP() << "this CPU lacks " << vm::isa_name(GetParam());
  }
};

// The largest distance, in float32 ulps, of fn(x) from the functor's float64 value, over
// the inputs x >= lo.
template <UnaryOp Op>
Worst unary_error(vm::Isa isa, double param = 0, float lo = -std::numeric_limits<float>::infinity()) {
  const std::vector<float> xs = sweep();
  std::vector<float> ys(xs.size());
  const ag::UnaryParams p{param, 0};
  vm::unary(vm::unary_fn(Op, p), xs.data(), ys.data(), int64_t(xs.size()), float(param), isa);
  const ag::kernels::UnaryFn<Op> ref{p};
  Worst w;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (xs[i] < lo) continue;
    const float want = float(ref(double(xs[i])));
    const double d = ulp_distance(ys[i], want);
    if (d > w.ulp) w = {d, xs[i], ys[i], want};
  }
  return w;
}

::testing::AssertionResult within(const Worst& w, double bound) {
  if (w.ulp <= bound) return ::testing::AssertionSuccess() << w.ulp;
  return ::testing::AssertionFailure() << w.ulp << " ulp at x = " << w.at << ": got " << w.got << ", want "
                                       << w.want << " (bound " << bound << ")";
}

TEST_P(Vmath, ElementaryFunctionsWithinOneUlp) {
  EXPECT_TRUE(within(unary_error<UnaryOp::Exp>(GetParam()), 1));
  EXPECT_TRUE(within(unary_error<UnaryOp::Log>(GetParam()), 1));
  EXPECT_TRUE(within(unary_error<UnaryOp::Log1p>(GetParam()), 1));
  EXPECT_TRUE(within(unary_error<UnaryOp::Tanh>(GetParam()), 1));
  EXPECT_TRUE(within(unary_error<UnaryOp::PowScalar>(GetParam(), 2.5), 1));
  EXPECT_TRUE(within(unary_error<UnaryOp::PowScalar>(GetParam(), -1.5), 1));
}

TEST_P(Vmath, SigmoidWithinTwoUlps) { EXPECT_TRUE(within(unary_error<UnaryOp::Sigmoid>(GetParam()), 2)); }

// GELU (both forms): erfc(-x/sqrt2) and e^(-2u) amplify the rounding of their argument by
// about x^2 in the negative tail, where the result is small (below 1e-4 in magnitude past -4).
TEST_P(Vmath, GeluWithinStatedUlps) {
  const vm::Isa isa = GetParam();
  for (float lo : {-1.0f, -4.0f, -std::numeric_limits<float>::infinity()}) {
    const double bound = lo == -1.0f ? 4 : lo == -4.0f ? 32 : 256;
    EXPECT_TRUE(within(unary_error<UnaryOp::GeluErf>(isa, 0, lo), bound)) << "erf form, x >= " << lo;
    EXPECT_TRUE(within(unary_error<UnaryOp::GeluTanh>(isa, 0, lo), bound)) << "tanh form, x >= " << lo;
  }
}

// SiLU: x e^x / (1 + e^x); below x = -87 the result is a denormal, computed from a
// denormal e^x, so it is within 64 denormal steps (1e-43) there.
TEST_P(Vmath, SiluWithinStatedUlps) {
  EXPECT_TRUE(within(unary_error<UnaryOp::Silu>(GetParam(), 0, -87), 3));
  EXPECT_TRUE(within(unary_error<UnaryOp::Silu>(GetParam()), 64));
}

// The gradients are bounded by about 1.13 times the incoming gradient g, and the error is
// stated relative to that: |got - want| <= 4 eps |g|. g takes several magnitudes and signs,
// which also checks that the kernels read a as g and b as x.
template <BinaryOp Op>
double gradient_error(vm::Isa isa) {
  const std::vector<float> xs = sweep();
  std::vector<float> gs(xs.size()), ys(xs.size());
  const float scales[] = {1.0f, -2.5f, 1e-3f, 1e3f};
  for (size_t i = 0; i < xs.size(); ++i) gs[i] = scales[i % 4];
  vm::binary(vm::binary_fn(Op), gs.data(), xs.data(), ys.data(), int64_t(xs.size()), isa);
  const ag::kernels::BinaryFn<Op> ref;
  double worst = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const double want = ref(double(gs[i]), double(xs[i]));
    if (std::isnan(want) || std::isnan(ys[i])) {
      if (std::isnan(want) != std::isnan(ys[i])) return 1e30;
      continue;
    }
    worst = std::max(worst, std::abs(double(ys[i]) - want) / (std::numeric_limits<float>::epsilon() * std::abs(gs[i])));
  }
  return worst;
}

TEST_P(Vmath, GradientsWithinFourEpsilonOfTheIncomingGradient) {
  EXPECT_LE(gradient_error<BinaryOp::GeluErfBackward>(GetParam()), 4);
  EXPECT_LE(gradient_error<BinaryOp::GeluTanhBackward>(GetParam()), 4);
  EXPECT_LE(gradient_error<BinaryOp::SiluBackward>(GetParam()), 4);
}

TEST_P(Vmath, PowOfTwoTensorsWithinOneUlp) {
  const std::vector<float> xs = sweep();
  const float exps[] = {2.5f, -1.5f, 3.0f, 0.5f, -2.0f, 0.0f};
  std::vector<float> es(xs.size()), ys(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) es[i] = exps[i % 6];
  vm::binary(vm::Fn::Pow, xs.data(), es.data(), ys.data(), int64_t(xs.size()), GetParam());
  const ag::kernels::BinaryFn<BinaryOp::Pow> ref;
  Worst w;
  for (size_t i = 0; i < xs.size(); ++i) {
    const float want = float(ref(double(xs[i]), double(es[i])));
    const double d = ulp_distance(ys[i], want);
    if (d > w.ulp) w = {d, xs[i], ys[i], want};
  }
  EXPECT_TRUE(within(w, 1));
}

// with_derivative, what a linear with GELU keeps on the CPU: the value bit for bit as unary
// computes it and the slope as the gradient function computes it for a gradient of 1, so
// the accuracy stated for those holds; the slope may overwrite the input.
TEST_P(Vmath, ValueWithDerivativeIsUnaryAndGradientBitForBit) {
  const std::vector<float> xs = sweep();
  const int64_t n = int64_t(xs.size());
  const std::vector<float> ones(xs.size(), 1.0f);
  const std::pair<vm::Fn, vm::Fn> fns[] = {{vm::Fn::GeluErf, vm::Fn::GeluErfBackward},
                                           {vm::Fn::GeluTanh, vm::Fn::GeluTanhBackward},
                                           {vm::Fn::Silu, vm::Fn::SiluBackward}};
  for (const auto& [fn, grad] : fns) {
    std::vector<float> y(xs.size()), d = xs, want_y(xs.size()), want_d(xs.size());
    vm::with_derivative(fn, d.data(), y.data(), d.data(), n, GetParam());  // in place, as linear_act runs it
    vm::unary(fn, xs.data(), want_y.data(), n, 0.0f, GetParam());
    vm::binary(grad, ones.data(), xs.data(), want_d.data(), n, GetParam());
    const auto same = [](float a, float b) {  // the same bits, or both NaN (payloads may differ)
      return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b) || (std::isnan(a) && std::isnan(b));
    };
    size_t bad_y = 0, bad_d = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      bad_y += !same(y[i], want_y[i]);
      bad_d += !same(d[i], want_d[i]);
    }
    EXPECT_EQ(bad_y, 0u) << "fn " << int(fn) << ": values that differ from unary's";
    EXPECT_EQ(bad_d, 0u) << "fn " << int(fn) << ": slopes that differ from the gradient's";
  }
}

// The ops reach the kernels: float32, bfloat16 and float16 tensors, contiguous and strided,
// against the functor on the same (rounded) inputs.
TEST(VmathOps, ElementwiseOpsUseTheVectorKernelsForEveryFloatLayout) {
  if (vm::active_isa() == vm::Isa::None) GTEST_SKIP() << "the vector math kernels are off in this build or process";
  ag::manual_seed(3);
  for (ag::DType dt : {ag::kFloat32, ag::kBFloat16, ag::kFloat16}) {
    const ag::Tensor base = (ag::randn({7, 301}) * 3.0).to(dt);
    for (const ag::Tensor& x : {base, base.transpose(0, 1), base.narrow(1, 1, 200)}) {
      const ag::Tensor got = ag::gelu(x).to(ag::kFloat64);
      // float64 runs the scalar functor: the reference.
      const ag::Tensor want = ag::gelu(x.to(ag::kFloat64)).to(dt).to(ag::kFloat64);
      EXPECT_TRUE(agt::allclose(got, want, {dt == ag::kFloat32 ? 1e-6 : 1e-2, 1e-6}))
          << ag::dtype_name(dt) << " " << x.sizes();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, Vmath, ::testing::Values(vm::Isa::Sse2, vm::Isa::Avx2, vm::Isa::Avx512),
                         [](const auto& info) { return std::string(vm::isa_name(info.param)); });

}  // namespace

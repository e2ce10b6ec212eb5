#include "support/testing.h"

#include <cmath>

using namespace ag;
using TL = std::vector<Tensor>;

namespace {

struct UnaryCase {
  const char* name;
  std::function<Tensor(const Tensor&)> op;
  std::function<double(double)> ref;
  double lo, hi;  // input range where the op is smooth
};

using agt::ref_gelu;
using agt::ref_gelu_tanh;

const std::vector<UnaryCase>& unary_cases() {
  static const std::vector<UnaryCase> cases = {
      {"neg", [](const Tensor& x) { return neg(x); }, [](double x) { return -x; }, -2, 2},
      {"abs", [](const Tensor& x) { return abs(x); }, [](double x) { return std::fabs(x); }, 0.1, 2},
      {"square", [](const Tensor& x) { return square(x); }, [](double x) { return x * x; }, -2, 2},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }, [](double x) { return std::sqrt(x); }, 0.2, 3},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }, [](double x) { return 1 / std::sqrt(x); }, 0.2, 3},
      {"reciprocal", [](const Tensor& x) { return reciprocal(x); }, [](double x) { return 1 / x; }, 0.5, 3},
      {"exp", [](const Tensor& x) { return exp(x); }, [](double x) { return std::exp(x); }, -2, 2},
      {"log", [](const Tensor& x) { return log(x); }, [](double x) { return std::log(x); }, 0.2, 3},
      {"log1p", [](const Tensor& x) { return log1p(x); }, [](double x) { return std::log1p(x); }, -0.5, 3},
      {"tanh", [](const Tensor& x) { return tanh(x); }, [](double x) { return std::tanh(x); }, -2, 2},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }, [](double x) { return 1 / (1 + std::exp(-x)); }, -3, 3},
      {"softplus", [](const Tensor& x) { return softplus(x); }, [](double x) { return std::log1p(std::exp(x)); }, -4, 4},
      {"relu", [](const Tensor& x) { return relu(x); }, [](double x) { return x > 0 ? x : 0; }, -2, 2},
      {"gelu", [](const Tensor& x) { return gelu(x); }, ref_gelu, -3, 3},
      {"gelu_tanh", [](const Tensor& x) { return gelu(x, "tanh"); }, ref_gelu_tanh, -3, 3},
      {"silu", [](const Tensor& x) { return silu(x); }, [](double x) { return x / (1 + std::exp(-x)); }, -3, 3},
      {"pow3", [](const Tensor& x) { return pow(x, 3.0); }, [](double x) { return x * x * x; }, -2, 2},
      {"pow_half", [](const Tensor& x) { return pow(x, 0.5); }, [](double x) { return std::sqrt(x); }, 0.2, 2},
      {"clamp", [](const Tensor& x) { return clamp(x, -0.5, 0.7); }, [](double x) { return std::min(std::max(x, -0.5), 0.7); }, -2, 2},
  };
  return cases;
}

// Keeps values away from kinks (relu at 0, abs at 0, clamp bounds) for finite differences.
Tensor smooth_input(const std::vector<int64_t>& shape, double lo, double hi) {
  Tensor x = agt::rand64(shape, lo, hi, false);
  Tensor away = where(lt(abs(x), 0.05), x + 0.2, x);
  away = where(lt(abs(away + (-0.7)), 0.05), away + 0.2, away);
  away = where(lt(abs(away + 0.5), 0.05), away + 0.2, away);
  return away.detach().requires_grad_();
}

}  // namespace

// softplus far from 0: no overflow where e^x does (x = 800, or 100 in float32), and the
// value e^x kept to full relative accuracy where 1 + e^x rounds to 1 (x = -30, -100, -700).
TEST(Elementwise, SoftplusNeitherOverflowsNorLosesSmallValues) {
  const std::vector<double> xs = {-700, -100, -30, 0, 30, 100, 800};
  const std::vector<double> y = softplus(from_vector<double>(xs, {7})).to_vector<double>();
  for (size_t i = 0; i < xs.size(); ++i) {
    const double x = xs[i], ref = x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
    EXPECT_NEAR(y[i], ref, 4e-16 * std::abs(ref)) << "x = " << x;
  }
  const std::vector<float> f = softplus(from_vector<double>({100, -30}, {2}).to(kFloat32)).to_vector<float>();
  EXPECT_EQ(f[0], 100.0f);
  EXPECT_NEAR(f[1], std::exp(-30.0), 2e-7 * std::exp(-30.0));
}

TEST(Elementwise, UnaryValuesMatchReference) {
  manual_seed(1);
  for (const auto& c : unary_cases()) {
    Tensor x = agt::rand64({64}, c.lo, c.hi, false);
    Tensor y = c.op(x);
    const auto xs = x.to_vector<double>();
    std::vector<double> ref;
    for (double v : xs) ref.push_back(c.ref(v));
    EXPECT_TRUE(agt::allclose(y, from_vector<double>(ref, {64}), 1e-12, 1e-12)) << c.name;
  }
}

TEST(Elementwise, UnaryGradcheck) {
  manual_seed(2);
  for (const auto& c : unary_cases()) {
    Tensor x = smooth_input({3, 4}, c.lo, c.hi);
    EXPECT_TRUE(agt::gradcheck([&](const TL& in) { return c.op(in[0]); }, {x})) << c.name;
    EXPECT_TRUE(agt::gradcheck([&](const TL& in) { return c.op(in[0]); }, {agt::non_contiguous(x)}))
        << c.name << " (non-contiguous)";
  }
}

TEST(Elementwise, HalfPrecisionWithinTolerance) {
  manual_seed(3);
  for (DType dt : {kFloat16, kBFloat16}) {
    for (const auto& c : unary_cases()) {
      Tensor x = agt::rand64({257}, c.lo, c.hi, false).to(dt);
      Tensor got = c.op(x);
      EXPECT_EQ(got.dtype(), dt) << c.name;
      Tensor ref = c.op(x.to(kFloat32));
      EXPECT_TRUE(agt::allclose(got, ref, agt::tol_for(dt))) << c.name << " " << dtype_name(dt);
    }
    Tensor a = agt::rand64({33, 9}, -2, 2, false).to(dt), b = agt::rand64({9}, 0.5, 2, false).to(dt);
    const auto fa = a.to(kFloat32), fb = b.to(kFloat32);
    EXPECT_TRUE(agt::allclose(a + b, fa + fb, agt::tol_for(dt)));
    EXPECT_TRUE(agt::allclose(a - b, fa - fb, agt::tol_for(dt)));
    EXPECT_TRUE(agt::allclose(a * b, fa * fb, agt::tol_for(dt)));
    EXPECT_TRUE(agt::allclose(a / b, fa / fb, agt::tol_for(dt)));
    EXPECT_TRUE(agt::allclose(maximum(a, b), maximum(fa, fb), agt::tol_for(dt)));
    EXPECT_TRUE(agt::allclose(pow(b, a), pow(fb, fa), agt::tol_for(dt)));
    // non-contiguous half inputs take the strided path
    EXPECT_TRUE(agt::allclose(agt::non_contiguous(a) * 3.0, fa * 3.0, agt::tol_for(dt)));
  }
}

TEST(Elementwise, BinaryValuesAndBroadcasting) {
  Tensor a = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = from_vector<float>({10, 20, 30}, {3});
  Tensor col = from_vector<float>({100, 200}, {2, 1});
  EXPECT_EQ((a + b).to_vector<float>(), (std::vector<float>{11, 22, 33, 14, 25, 36}));
  EXPECT_EQ((a - col).to_vector<float>(), (std::vector<float>{-99, -98, -97, -196, -195, -194}));
  EXPECT_EQ((b * col).sizes(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ((a / 2.0f).to_vector<float>(), (std::vector<float>{0.5, 1, 1.5, 2, 2.5, 3}));
  EXPECT_EQ((1.0f - a).to_vector<float>(), (std::vector<float>{0, -1, -2, -3, -4, -5}));
  EXPECT_EQ((6.0f / a).to_vector<float>(), (std::vector<float>{6, 3, 2, 1.5, 1.2f, 1}));
  EXPECT_EQ(add(a, b, 2).to_vector<float>(), (std::vector<float>{21, 42, 63, 24, 45, 66}));
  EXPECT_EQ(pow(a, 2.0).to_vector<float>(), (std::vector<float>{1, 4, 9, 16, 25, 36}));
  EXPECT_EQ(minimum(a, b * 0.1f).to_vector<float>(), (std::vector<float>{1, 2, 3, 1, 2, 3}));
  EXPECT_EQ((a > 3.0f).to_vector<bool>(), (std::vector<bool>{false, false, false, true, true, true}));
  EXPECT_EQ(eq(a, a).to_vector<bool>(), std::vector<bool>(6, true));
  EXPECT_EQ(ne(a, 2.0f).to_vector<bool>(), (std::vector<bool>{true, false, true, true, true, true}));
  EXPECT_EQ(le(a, 2.0f).to_vector<bool>(), (std::vector<bool>{true, true, false, false, false, false}));
  // integer arithmetic stays integral; division promotes to floating
  Tensor i = arange(1, 5);
  EXPECT_EQ((i * i).to_vector<int64_t>(), (std::vector<int64_t>{1, 4, 9, 16}));
  EXPECT_EQ((i / 2).dtype(), kFloat32);
  EXPECT_EQ(exp(i).dtype(), kFloat32);
  // NaN propagation like PyTorch
  Tensor n = from_vector<float>({NAN, 1}, {2});
  EXPECT_TRUE(std::isnan(maximum(n, zeros({2})).to_vector<float>()[0]));
  EXPECT_TRUE(std::isnan(relu(n).to_vector<float>()[0]));
  EXPECT_TRUE(std::isnan(clamp(n, 0.0, 1.0).to_vector<float>()[0]));
}

TEST(Elementwise, BinaryGradcheckWithBroadcastAndStrides) {
  manual_seed(4);
  auto a = agt::rand64({3, 4}, 0.5, 2), b = agt::rand64({4}, 0.5, 2), c = agt::rand64({3, 1}, 0.5, 2);
  auto an = agt::non_contiguous(agt::rand64({3, 4}, 0.5, 2));
  EXPECT_TRUE(agt::gradcheck([](const TL& t) { return t[0] + t[1]; }, {a, b}));
  EXPECT_TRUE(agt::gradcheck([](const TL& t) { return add(t[0], t[1], 2.5); }, {a, c}));
  EXPECT_TRUE(agt::gradcheck([](const TL& t) { return sub(t[0], t[1], 0.5); }, {an, b}));
  EXPECT_TRUE(agt::gradcheck([](const TL& t) { return t[0] * t[1]; }, {an, c}));
  EXPECT_TRUE(agt::gradcheck([](const TL& t) { return t[0] / t[1]; }, {a, c}));
  EXPECT_TRUE(agt::gradcheck([](const TL& t) { return pow(t[0], t[1]); }, {a, b}));
  EXPECT_TRUE(agt::gradcheck([](const TL& t) { return maximum(t[0], t[1]); }, {a, b}));
  EXPECT_TRUE(agt::gradcheck([](const TL& t) { return minimum(t[0], t[1]); }, {an, c}));
  EXPECT_TRUE(agt::gradcheck([](const TL& t) { return 3.0 - t[0] / 2.0 + 1.0 / t[1]; }, {a, b}));
  EXPECT_TRUE(agt::gradcheck([](const TL& t) { return where(gt(t[0], 1.0), t[0], t[1]); }, {a, c}));
  EXPECT_TRUE(agt::gradcheck([](const TL& t) { return t[0].masked_fill(gt(t[0], 1.0), 0.0); }, {an}));
  EXPECT_TRUE(agt::gradcheck([](const TL& t) { return t[0].to(kFloat32).to(kFloat64) * t[1]; }, {a, b}, 1e-3, 1e-3, 1e-3));
}

// A float32 result of a 16-bit operand (the float32 residual plus a bfloat16 branch under
// autocast): the CPU kernel widens it in the loop instead of casting first, and must give
// the cast-then-op result bit for bit, broadcast and strided operands included, with the
// gradient reaching each input in its own dtype.
TEST(Elementwise, WideningBinaryMatchesCastThenOpBitForBit) {
  manual_seed(8);
  EXPECT_TRUE(cpu_backend().binary_widens(BinaryOp::Add));
  EXPECT_FALSE(cpu_backend().binary_widens(BinaryOp::Pow));  // vector math: operands are cast first
  const Tensor f = randn({5, 300}) * 3.0, f_strided = randn({300, 5}).transpose(0, 1);
  for (DType low : {kBFloat16, kFloat16}) {
    SCOPED_TRACE(dtype_name(low));
    const Tensor h = (randn({5, 300}) * 3.0).to(low), row = randn({300}).to(low), other = randn({5, 300}).to(
        low == kBFloat16 ? kFloat16 : kBFloat16);
    const std::vector<std::pair<Tensor, Tensor>> pairs = {{f, h}, {h, f}, {f_strided, h}, {f, row}, {row, f}, {h, other}};
    for (const auto& [a, b] : pairs) {
      const Tensor ac = a.to(kFloat32), bc = b.to(kFloat32);
      for (int op = 0; op < 5; ++op) {
        SCOPED_TRACE("op " + std::to_string(op));
        const auto run = [op](const Tensor& x, const Tensor& y) {
          switch (op) {
            case 0: return x + y;
            case 1: return x - y;
            case 2: return x * y;
            case 3: return x / y;
            default: return pow(abs(x), y);  // not widened: the cast path, same answer
          }
        };
        const Tensor got = run(a, b), want = run(ac, bc);
        ASSERT_EQ(got.dtype(), kFloat32);
        EXPECT_EQ(got.to_vector<float>(), want.to_vector<float>());
      }
    }
    // autograd: each input's gradient in its own dtype
    const Tensor x = randn({4, 8}).requires_grad_(true), y = randn({4, 8}).to(low).requires_grad_(true);
    (x * y + x).sum().backward();
    ASSERT_TRUE(x.grad().defined() && y.grad().defined());
    EXPECT_EQ(x.grad().dtype(), kFloat32);
    EXPECT_EQ(y.grad().dtype(), low);
    EXPECT_EQ(y.grad().to_vector<float>(), x.detach().to(low).to_vector<float>());
  }
}

TEST(Elementwise, ErrorsNameOpAndShapes) {
  EXPECT_AG_ERROR(ones({2, 3}) + ones({4}), "[add] shapes [2, 3] and [4] cannot be broadcast together");
  EXPECT_AG_ERROR(ones({2}) * Tensor(), "[mul] other is an undefined tensor");
  EXPECT_AG_ERROR(gelu(ones({2}), "fast"), "[gelu] approximate must be 'none' or 'tanh', got 'fast'");
  EXPECT_AG_ERROR(clamp(ones({2}), std::nullopt, std::nullopt), "[clamp] at least one of min and max must be given");
  EXPECT_AG_ERROR(ones({2}, kBool) + ones({2}, kBool), "[add] not defined for bool tensors");
  Tensor i = arange(3);
  EXPECT_AG_ERROR(i.mul_(0.5), "[mul_] result dtype float32 cannot be cast to the int64 tensor modified in place");
  Tensor t = ones({2, 3});
  EXPECT_AG_ERROR(t.add_(ones({4, 2, 3})), "[add_] the result's shape [4, 2, 3] does not match the shape [2, 3]");
}

TEST(Elementwise, InPlaceOps) {
  Tensor t = from_vector<float>({1, 2, 3, 4}, {2, 2});
  Tensor view = t.t();
  const uint64_t v0 = t.version();
  view.add_(from_vector<float>({10, 20}, {2}));  // broadcasts along rows of the transposed view
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{11, 12, 23, 24}));
  t.mul_(0.5f).sub_(1.0f).div_(2.0f);
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{2.25, 2.5, 5.25, 5.5}));
  t.clamp_(2.4, 5.3);
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{2.4f, 2.5, 5.25, 5.3f}));
  t.masked_fill_(t > 5.0f, 0.0);
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{2.4f, 2.5, 0, 0}));
  t.copy_(from_vector<double>({7, 8}, {2}));
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{7, 8, 7, 8}));
  t.zero_();
  EXPECT_EQ(t.to_vector<float>(), std::vector<float>(4, 0));
  EXPECT_EQ(t.version(), v0 + 8);
  Tensor h = ones({3}, kBFloat16);
  h.add_(ones({3}, kFloat32), 0.5);  // promoted compute, stored back as bfloat16
  EXPECT_EQ(h.dtype(), kBFloat16);
  EXPECT_EQ(h.to_vector<float>(), std::vector<float>(3, 1.5f));
}

// ag::set_float32_matmul_precision / get_float32_matmul_precision: the default, the round
// trip of each accepted value, and the error for any other string (which leaves the
// setting unchanged). On the CPU, "high" leaves float32 products as they are; "medium"
// rounds their operands to bfloat16 where the CPU runs bfloat16 natively (oneDNN build),
// checked against a float64 product of operands rounded here, and changes nothing
// elsewhere.
#include "support/testing.h"

#include <cmath>
#include <cstring>

using namespace ag;

namespace {
// Restores the default however a test ends.
struct RestorePrecision {
  ~RestorePrecision() { set_float32_matmul_precision("highest"); }
};

// Whether "medium" computes float32 products in bfloat16 on this machine and build (the
// verdict is "emulated" in a build without oneDNN).
bool medium_rounds() { return hw::verdict(hw::query(), Device(kCPU), kBFloat16).support == hw::Support::Native; }

constexpr const char* kNoRounding =
    "\"medium\" leaves float32 products as they are here: no native bfloat16 on this CPU or build (oneDNN ISA: ";

// t (float32) with every element rounded to the nearest bfloat16 (ties to even), as float64.
// Written out here rather than through the library's conversion.
Tensor bf16_rounded(const Tensor& t) {
  std::vector<float> v = t.to_vector<float>();
  for (float& f : v) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    std::memcpy(&f, &u, 4);
  }
  return from_vector(v, t.sizes().vec()).to(kFloat64);
}

// The largest |got - ref| over the elements (got float32, ref float64).
double max_diff(const Tensor& got, const Tensor& ref) {
  const auto g = got.to_vector<double>(), r = ref.to_vector<double>();
  double m = 0;
  for (size_t i = 0; i < g.size(); ++i) m = std::max(m, std::abs(g[i] - r[i]));
  return m;
}

// float32 accumulation of K products of bfloat16-rounded N(0, 1) values: far below the
// bfloat16 rounding error itself (about 2^-9 relative per operand, 0.05 or more here).
constexpr double kAccumTol = 2e-4, kRoundingSeen = 1e-2;
}  // namespace

TEST(MatmulPrecision, DefaultIsHighest) {
  EXPECT_EQ(get_float32_matmul_precision(), "highest");
  EXPECT_EQ(float32_matmul_precision(), Float32MatmulPrecision::Highest);
}

TEST(MatmulPrecision, SetGetRoundTrip) {
  RestorePrecision restore;
  set_float32_matmul_precision("high");
  EXPECT_EQ(get_float32_matmul_precision(), "high");
  EXPECT_EQ(float32_matmul_precision(), Float32MatmulPrecision::High);
  set_float32_matmul_precision("medium");
  EXPECT_EQ(get_float32_matmul_precision(), "medium");
  EXPECT_EQ(float32_matmul_precision(), Float32MatmulPrecision::Medium);
  set_float32_matmul_precision("highest");
  EXPECT_EQ(get_float32_matmul_precision(), "highest");
}

TEST(MatmulPrecision, RejectsOtherStrings) {
  RestorePrecision restore;
  set_float32_matmul_precision("high");
  EXPECT_AG_ERROR(set_float32_matmul_precision("low"), "[set_float32_matmul_precision]");
  EXPECT_AG_ERROR(set_float32_matmul_precision("Highest"), "\"Highest\"");
  EXPECT_AG_ERROR(set_float32_matmul_precision(""), "\"\"");
  EXPECT_EQ(get_float32_matmul_precision(), "high");  // unchanged by the failed calls
}

TEST(MatmulPrecision, HighLeavesCpuProductsFloat32) {
  RestorePrecision restore;
  const Tensor a = randn({17, 33}), b = randn({33, 9});
  const Tensor ref = matmul(a, b);
  set_float32_matmul_precision("high");
  EXPECT_TRUE(agt::same_bits(matmul(a, b), ref));
}

TEST(MatmulPrecision, MediumIsHighestWithoutNativeBf16) {
  if (medium_rounds()) GTEST_SKIP() << "this CPU runs bfloat16 natively: \"medium\" rounds (the next tests)";
  RestorePrecision restore;
  const Tensor a = randn({17, 33}), b = randn({33, 9}), w = randn({9, 33}), bias = randn({9});
  const Tensor ref = matmul(a, b), ref_lin = linear(a, w, bias);
  set_float32_matmul_precision("medium");
  EXPECT_TRUE(agt::same_bits(matmul(a, b), ref));
  EXPECT_TRUE(agt::same_bits(linear(a, w, bias), ref_lin));
}

TEST(MatmulPrecision, MediumRoundsMatmulOperandsToBf16) {
  if (!medium_rounds()) GTEST_SKIP() << kNoRounding << hw::query().onednn_isa << ")";
  RestorePrecision restore;
  manual_seed(11);
  // plain, a transposed right operand, and a batch against a broadcast right operand
  const Tensor a = randn({33, 96}), b = randn({96, 17}), bt = randn({17, 96}).t();
  const Tensor a3 = randn({4, 8, 96});
  const Tensor highest = matmul(a, b);
  set_float32_matmul_precision("medium");
  const Tensor got = matmul(a, b), got_t = matmul(a, bt), got3 = matmul(a3, b);
  const Tensor ref = matmul(bf16_rounded(a), bf16_rounded(b));
  EXPECT_EQ(got.dtype(), kFloat32);
  EXPECT_LT(max_diff(got, ref), kAccumTol);
  EXPECT_LT(max_diff(got_t, matmul(bf16_rounded(a), bf16_rounded(bt))), kAccumTol);
  EXPECT_LT(max_diff(got3, matmul(bf16_rounded(a3), bf16_rounded(b))), kAccumTol);
  EXPECT_GT(max_diff(highest, ref), kRoundingSeen);  // the rounding is visible against float32
  set_float32_matmul_precision("highest");
  EXPECT_TRUE(agt::same_bits(matmul(a, b), highest));  // and back
}

TEST(MatmulPrecision, MediumRoundsLinearAndItsGradients) {
  if (!medium_rounds()) GTEST_SKIP() << kNoRounding << hw::query().onednn_isa << ")";
  RestorePrecision restore;
  manual_seed(12);
  // 600 rows: the weight gradient's inner dimension is long enough for its float32 path
  // (oneDNN's sgemm, which has no bfloat16 mode), so "medium" must take it elsewhere
  const Tensor x = randn({600, 64}).requires_grad_(true), w = randn({24, 64}).requires_grad_(true);
  const Tensor bias = randn({24}).requires_grad_(true), gy = randn({600, 24});
  set_float32_matmul_precision("medium");
  const Tensor y = linear(x, w, bias);
  y.backward(gy);
  const Tensor y_ref = matmul(bf16_rounded(x), bf16_rounded(w).t()) + bias.detach().to(kFloat64);
  EXPECT_LT(max_diff(y, y_ref), kAccumTol);
  EXPECT_LT(max_diff(x.grad(), matmul(bf16_rounded(gy), bf16_rounded(w))), kAccumTol);
  // the weight gradient sums 600 products: a looser bound, still far below the rounding
  EXPECT_LT(max_diff(w.grad(), matmul(bf16_rounded(gy).t(), bf16_rounded(x))), 4 * kAccumTol);
  EXPECT_GT(max_diff(w.grad(), matmul(gy.to(kFloat64).t(), x.detach().to(kFloat64))), kRoundingSeen);
  EXPECT_LT(max_diff(bias.grad(), sum(gy.to(kFloat64), {0})), 1e-3);  // not a product: float32
}

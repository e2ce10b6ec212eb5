// tile_gemm (kernels/cpu/gemm.h), the small products of the attention kernel, against a
// float64 reference: every transpose combination, sizes around the kernel's 4- and 8-row and
// 16-lane blocks, beta 0 (old contents ignored, NaN included), 1 and another value, and
// leading dimensions wider than the rows; at each instruction-set level this CPU runs
// (hw::set_kernel_isa), so that below avx512 the general path (Eigen, or oneDNN's sgemm)
// takes them all, and with the shapes the small kernel declines at any level.
// small_tile_gemm is checked directly at the level avx512 (it declines below, which is
// checked too), and tile_gemm_bf16 from avx512_bf16 (AMX tiles at amx).
#include "support/testing.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "cpu/gemm.h"

namespace {

struct Case {
  bool ta, tb;
  int64_t m, n, k;
  float alpha, beta;
};

// c = alpha op(a) op(b) + beta c in float64, from the same float inputs.
std::vector<double> reference(const Case& t, const std::vector<float>& a, int64_t lda, const std::vector<float>& b,
                              int64_t ldb, const std::vector<float>& c, int64_t ldc) {
  std::vector<double> out(c.begin(), c.end());
  for (int64_t i = 0; i < t.m; ++i)
    for (int64_t j = 0; j < t.n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < t.k; ++p) {
        const double av = t.ta ? a[size_t(p * lda + i)] : a[size_t(i * lda + p)];
        const double bv = t.tb ? b[size_t(j * ldb + p)] : b[size_t(p * ldb + j)];
        s += av * bv;
      }
      const double old = t.beta == 0 ? 0.0 : double(t.beta) * c[size_t(i * ldc + j)];
      out[size_t(i * ldc + j)] = double(t.alpha) * s + old;
    }
  return out;
}

// Runs `gemm` on random operands for case t and compares with the reference; returns false
// when gemm declined (small_tile_gemm's answer).
template <class Gemm>
bool check(const Case& t, Gemm gemm) {
  std::mt19937 rng(unsigned(t.m * 1000003 + t.n * 1009 + t.k * 7 + t.ta * 2 + t.tb));
  std::uniform_real_distribution<float> u(-1, 1);
  const int64_t pad = 3;  // leading dimensions wider than the rows
  const int64_t a_rows = t.ta ? t.k : t.m, a_cols = t.ta ? t.m : t.k;
  const int64_t b_rows = t.tb ? t.n : t.k, b_cols = t.tb ? t.k : t.n;
  const int64_t lda = a_cols + pad, ldb = b_cols + pad, ldc = t.n + pad;
  std::vector<float> a(size_t(a_rows * lda)), b(size_t(b_rows * ldb)), c(size_t(t.m * ldc));
  for (float& x : a) x = u(rng);
  for (float& x : b) x = u(rng);
  for (float& x : c) x = t.beta == 0 ? std::numeric_limits<float>::quiet_NaN() : u(rng);
  const std::vector<double> want = reference(t, a, lda, b, ldb, c, ldc);
  std::vector<float> got = c;
  if (!gemm(t.ta, t.tb, t.m, t.n, t.k, t.alpha, a.data(), lda, b.data(), ldb, t.beta, got.data(), ldc)) return false;
  for (int64_t i = 0; i < t.m; ++i)
    for (int64_t j = 0; j < ldc; ++j) {
      const size_t at = size_t(i * ldc + j);
      if (j >= t.n) {  // the padding between rows is left alone
        EXPECT_TRUE(std::isnan(got[at]) == std::isnan(c[at]) && (std::isnan(c[at]) || got[at] == c[at]))
            << "column " << j << " of row " << i << " was written";
        continue;
      }
      const double tol = 1e-5 * (double(t.k) + 1) * (std::abs(double(t.alpha)) + std::abs(double(t.beta)) + 1);
      EXPECT_NEAR(got[at], want[at], tol) << "ta " << t.ta << " tb " << t.tb << " m " << t.m << " n " << t.n
                                          << " k " << t.k << " beta " << t.beta << " at (" << i << ", " << j << ")";
    }
  return true;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (int64_t m : {1, 3, 4, 5, 8, 13, 64})
        for (int64_t n : {1, 15, 16, 17, 32, 33, 64, 65, 130})
          for (int64_t k : {1, 7, 32, 64})
            for (float beta : {0.0f, 1.0f, -0.5f}) out.push_back({ta, tb, m, n, k, 0.75f, beta});
  return out;
}

// tile_gemm itself, on whatever path it takes for each case.
bool run_tile_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                   const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  ampgrad::cpu::tile_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  return true;
}

// Whether small_tile_gemm takes case t (computing into scratch).
bool small_kernel_takes(const Case& t) {
  const int64_t rows = std::max({t.m, t.n, t.k}) + 1;
  std::vector<float> a(size_t(rows * rows), 1.0f), b(a), c(a);
  return ampgrad::cpu::small_tile_gemm(t.ta, t.tb, t.m, t.n, t.k, t.alpha, a.data(), rows, b.data(), rows, t.beta,
                                       c.data(), rows);
}

class TileGemmEachIsa : public agt::EachKernelIsa {};

}  // namespace

// Below avx512 the small kernel declines every case, so the general path computes them.
TEST_P(TileGemmEachIsa, MatchesTheReference) {
  const bool small = agt::kernel_isa_at_least("avx512");
  for (const Case& t : cases()) {
    check(t, run_tile_gemm);
    if (!small) ASSERT_FALSE(small_kernel_takes(t)) << "m " << t.m << " n " << t.n << " k " << t.k;
  }
}

// What the small kernel declines at every level (more than 64 rows, more than 256 columns
// or inner products, a transposed b of more than 64 x 256 values, an empty inner
// dimension, where c is only scaled by beta) goes to the general path.
TEST(TileGemm, ShapesTheSmallKernelDeclinesTakeTheGeneralPath) {
  std::vector<Case> big;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.0f, 1.0f, -0.5f})
        for (const Case& t : {Case{ta, tb, 65, 33, 17, 0.75f, beta}, Case{ta, tb, 7, 257, 20, 0.75f, beta},
                              Case{ta, tb, 9, 31, 300, 0.75f, beta}, Case{ta, tb, 5, 130, 130, 0.75f, beta},
                              Case{ta, tb, 6, 17, 0, 0.75f, beta}})
          if (t.tb || t.n != 130) big.push_back(t);  // 130 x 130 declines only as a transposed b
  for (const Case& t : big) {
    SCOPED_TRACE(::testing::Message() << "ta " << t.ta << " tb " << t.tb << " m " << t.m << " n " << t.n << " k " << t.k);
    ASSERT_FALSE(small_kernel_takes(t));
    check(t, run_tile_gemm);
  }
}

TEST(TileGemm, SmallKernelMatchesTheReference) {
  if (!agt::kernel_isa_at_least("avx512"))
    AGT_SKIP_HARDWARE() << "the kernels' level is " << ag::hw::kernel_isa() << ", below avx512: small_tile_gemm declines";
  for (const Case& t : cases()) EXPECT_TRUE(check(t, ampgrad::cpu::small_tile_gemm)) << t.m << " " << t.n << " " << t.k;
}

TEST(TileGemm, SmallKernelDeclinesWhatIsNotSmall) {
  std::vector<float> a(300 * 300, 1.0f), b(300 * 300, 1.0f), c(300 * 300, 0.0f);
  // more than 64 rows, more than 256 columns or inner products, an empty inner dimension
  EXPECT_FALSE(ampgrad::cpu::small_tile_gemm(false, false, 65, 8, 8, 1, a.data(), 300, b.data(), 300, 0, c.data(), 300));
  EXPECT_FALSE(ampgrad::cpu::small_tile_gemm(false, false, 8, 257, 8, 1, a.data(), 300, b.data(), 300, 0, c.data(), 300));
  EXPECT_FALSE(ampgrad::cpu::small_tile_gemm(false, false, 8, 8, 257, 1, a.data(), 300, b.data(), 300, 0, c.data(), 300));
  EXPECT_FALSE(ampgrad::cpu::small_tile_gemm(false, false, 8, 8, 0, 1, a.data(), 300, b.data(), 300, 0, c.data(), 300));
  if (!agt::kernel_isa_at_least("avx512"))
    EXPECT_FALSE(ampgrad::cpu::small_tile_gemm(false, false, 8, 8, 8, 1, a.data(), 300, b.data(), 300, 0, c.data(), 300));
}

// tile_gemm_bf16 against a float64 reference of the bfloat16-rounded operands (the products
// of bfloat16 values are exact, so only the float sums differ), over both layouts of a,
// sizes around the 4-row, 16-lane and pair blocks, odd k at b's end, row and column
// offsets into the packed b, and beta 0, 1 and another value. Twice: b's rows outside the
// product hold infinities (reading any of them would turn results into NaN; such a b is
// not finite, so AMX declines it and the AVX512-BF16 kernel runs), then finite values (the
// AMX tiles at the level amx, which read past the product and must not count it;
// VDPBF16PS at avx512_bf16).
TEST_P(TileGemmEachIsa, Bf16KernelMatchesTheRoundedReference) {
  if (!agt::kernel_isa_at_least("avx512_bf16"))
    GTEST_SKIP() << "below avx512_bf16 tile_gemm_bf16 declines every product (Bf16KernelDeclinesWhatItCannotDoExactly)";
  const auto bf = [](float x) { return double(float(ag::BFloat16(x))); };
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1, 1);
  const float inf = std::numeric_limits<float>::infinity();
  int checked = 0;
  for (bool poison : {true, false})
  for (bool ta : {false, true})
    for (int64_t m : {1, 3, 4, 5, 17, 64})
      for (int64_t n : {1, 15, 16, 17, 33, 64, 65, 130})
        for (int64_t k : {1, 2, 7, 32, 33, 64})
          for (int64_t p0 : {0, 2})
            for (float beta : {0.0f, 1.0f, -0.5f}) {
              const int64_t j0 = n % 2 == 0 ? 3 : 0, after = k % 2 == 0 ? 2 : 0;
              const int64_t K = p0 + k + after, N = j0 + n + 1, ldb = N + 2;
              std::vector<float> b(size_t(K * ldb));
              for (int64_t p = 0; p < K; ++p)
                for (int64_t j = 0; j < ldb; ++j) b[size_t(p * ldb + j)] = poison && (p < p0 || p >= p0 + k) ? inf : u(rng);
              ampgrad::cpu::Bf16Pairs packed;
              ASSERT_TRUE(packed.pack(b.data(), ldb, K, N));
              ASSERT_EQ(packed.finite, !poison || K == k);
              const int64_t lda = (ta ? m : k) + 3, ldc = n + 2;
              std::vector<float> a(size_t((ta ? k : m) * lda)), c(size_t(m * ldc));
              for (float& x : a) x = u(rng);
              for (float& x : c) x = beta == 0 ? std::numeric_limits<float>::quiet_NaN() : u(rng);
              std::vector<float> got = c;
              const float alpha = 0.75f;
              ASSERT_TRUE(ampgrad::cpu::tile_gemm_bf16(ta, m, n, k, alpha, a.data(), lda, packed, p0, j0, beta,
                                                       got.data(), ldc));
              for (int64_t i = 0; i < m; ++i)
                for (int64_t j = 0; j < ldc; ++j) {
                  const size_t at = size_t(i * ldc + j);
                  if (j >= n) {
                    EXPECT_TRUE(std::isnan(got[at]) == std::isnan(c[at]) && (std::isnan(c[at]) || got[at] == c[at]))
                        << "column " << j << " of row " << i << " was written";
                    continue;
                  }
                  double s = 0;
                  for (int64_t p = 0; p < k; ++p)
                    s += bf(ta ? a[size_t(p * lda + i)] : a[size_t(i * lda + p)]) * bf(b[size_t((p0 + p) * ldb + j0 + j)]);
                  const double want = double(alpha) * s + (beta == 0 ? 0.0 : double(beta) * c[at]);
                  ASSERT_NEAR(got[at], want, 1e-5 * (double(k) + 1) * 2.5)
                      << "poison " << poison << " ta " << ta << " m " << m << " n " << n << " k " << k << " p0 " << p0 << " beta " << beta
                      << " at (" << i << ", " << j << ")";
                }
              // From bfloat16 sources: b's rows and b as the transpose of m [N, K] pack to the
              // same words; a's rows in bfloat16 give the same result bit for bit.
              std::vector<ag::BFloat16> b16(b.size()), m16(size_t(N * (K + 2))), a16(a.size());
              for (size_t i = 0; i < b.size(); ++i) b16[i] = ag::BFloat16(b[i]);
              for (size_t i = 0; i < a.size(); ++i) a16[i] = ag::BFloat16(a[i]);
              for (int64_t p = 0; p < K; ++p)
                for (int64_t j = 0; j < N; ++j) m16[size_t(j * (K + 2) + p)] = b16[size_t(p * ldb + j)];
              ampgrad::cpu::Bf16Pairs from_rows, from_t;
              ASSERT_TRUE(from_rows.pack(b16.data(), ldb, K, N));
              ASSERT_TRUE(from_t.pack_transposed(m16.data(), K + 2, N, K));
              const size_t words = size_t((K + 1) / 2 * N);
              ASSERT_EQ(from_t.K, K);
              ASSERT_EQ(from_t.N, N);
              ASSERT_TRUE(std::equal(packed.data.begin(), packed.data.begin() + ptrdiff_t(words), from_rows.data.begin()));
              ASSERT_TRUE(std::equal(packed.data.begin(), packed.data.begin() + ptrdiff_t(words), from_t.data.begin()))
                  << "K " << K << " N " << N;
              ASSERT_EQ(from_rows.finite, packed.finite);
              ASSERT_EQ(from_t.finite, packed.finite);
              if (!ta) {
                std::vector<float> got16 = c;
                ASSERT_TRUE(ampgrad::cpu::tile_gemm_bf16(m, n, k, alpha, a16.data(), lda, from_t, p0, j0, beta,
                                                         got16.data(), ldc));
                for (size_t i = 0; i < got.size(); ++i)
                  ASSERT_TRUE(got16[i] == got[i] || (std::isnan(got16[i]) && std::isnan(got[i]))) << "element " << i;
              }
              ++checked;
            }
  EXPECT_EQ(checked, 2 * 2 * 6 * 8 * 6 * 2 * 3);
}

// Below avx512_bf16 (a CPU without AVX512-BF16, or hw::set_kernel_isa) nothing packs and
// every product declines; from it, the products it cannot do exactly.
TEST_P(TileGemmEachIsa, Bf16KernelDeclinesWhatItCannotDoExactly) {
  std::vector<float> a(300 * 300, 1.0f), b(300 * 300, 1.0f), c(300 * 300, 0.0f);
  ampgrad::cpu::Bf16Pairs packed;
  if (!agt::kernel_isa_at_least("avx512_bf16")) {
    EXPECT_FALSE(packed.pack(b.data(), 300, 300, 300));
    EXPECT_EQ(packed.K, 0);
    EXPECT_FALSE(ampgrad::cpu::tile_gemm_bf16(false, 8, 8, 8, 1, a.data(), 300, packed, 0, 0, 0, c.data(), 300));
    EXPECT_FALSE(ampgrad::cpu::tile_gemm_bf16_available());
    return;
  }
  ASSERT_TRUE(packed.pack(b.data(), 300, 300, 300));
  EXPECT_TRUE(ampgrad::cpu::tile_gemm_bf16_available());
  const auto run = [&](int64_t m, int64_t n, int64_t k, int64_t p0, int64_t j0) {
    return ampgrad::cpu::tile_gemm_bf16(false, m, n, k, 1, a.data(), 300, packed, p0, j0, 0, c.data(), 300);
  };
  EXPECT_TRUE(run(8, 8, 8, 0, 0));
  EXPECT_FALSE(run(65, 8, 8, 0, 0));    // more than 64 rows
  EXPECT_FALSE(run(8, 8, 257, 0, 0));   // an inner dimension over 256
  EXPECT_FALSE(run(8, 8, 0, 0, 0));     // an empty one
  EXPECT_FALSE(run(8, 8, 8, 1, 0));     // an odd first row of b
  EXPECT_FALSE(run(8, 8, 7, 0, 0));     // odd k ending before b's last row
  EXPECT_FALSE(run(8, 8, 7, 292, 0));
  ASSERT_TRUE(packed.pack(b.data(), 300, 299, 300));
  EXPECT_TRUE(run(8, 8, 7, 292, 0));    // odd k at b's end: its last pair takes the zero row
  EXPECT_FALSE(run(8, 8, 9, 292, 0));
  EXPECT_FALSE(run(8, 8, 8, 292, 0));   // rows past b
  EXPECT_FALSE(run(8, 8, 8, 0, 293));   // columns past b
}

AGT_EACH_KERNEL_ISA(TileGemmEachIsa);

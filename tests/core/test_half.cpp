// Tests for ampgrad/half.h and ampgrad/convert.h.
//
// The production conversions are integer bit tricks; they are checked against
// an independent reference written with double arithmetic (classify, frexp,
// ldexp, nearbyint in the default round-to-nearest mode). The *Exhaustive*
// tests cover all 2^32 fp32 bit patterns (chunked, OpenMP-parallel; about
// 2-11 s each at -O2 on 2 cores); --gtest_filter=-*Exhaustive* skips them for
// quick or sanitizer runs. All 2^16 16-bit patterns are always covered.
#include "support/testing.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "ampgrad/convert.h"
#include "ampgrad/half.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define AG_TEST_X86 1
#endif

namespace {

using namespace ampgrad;

// ---------------------------------------------------------------------------
// Reference implementation (double arithmetic, deliberately unlike half.h).

/// Exact powers of two 2^k for -256 <= k < 256 (a table because ldexp
/// dominated the exhaustive tests' run time; halving/doubling is exact here).
constexpr std::array<double, 512> kPow2Table = [] {
  std::array<double, 512> t{};
  t[256] = 1.0;
  for (int i = 257; i < 512; ++i) t[i] = t[i - 1] * 2.0;
  for (int i = 255; i >= 0; --i) t[i] = t[i + 1] / 2.0;
  return t;
}();
double pow2(int k) { return kPow2Table[static_cast<size_t>(k + 256)]; }

/// IEEE-style binary format with ExpBits exponent and ManBits fraction bits,
/// stored in the low 1 + ExpBits + ManBits bits of a uint16_t.
template <int ExpBits, int ManBits, bool DecodeQuietsNaN>
struct Format {
  static constexpr int kBias = (1 << (ExpBits - 1)) - 1;
  static constexpr int kEmin = 1 - kBias;  // exponent of the smallest normal
  static constexpr int kEmax = kBias;
  static constexpr uint16_t kSign = 1u << (ExpBits + ManBits);
  static constexpr uint16_t kInf = ((1u << ExpBits) - 1u) << ManBits;
  static constexpr uint16_t kQuiet = 1u << (ManBits - 1);
  static constexpr uint16_t kFracMask = (1u << ManBits) - 1u;

  // Halfway between the largest finite value and 2^(emax+1): ties go to the
  // even neighbour, which is infinity.
  static inline const double kOverflow = std::ldexp(2.0 - std::ldexp(1.0, -ManBits - 1), kEmax);

  /// fp32 bit pattern -> format bits, round to nearest, ties to even.
  static uint16_t round(uint32_t bits) {
    const float f = std::bit_cast<float>(bits);
    const uint16_t sign = (bits >> 31) ? kSign : 0;
    switch (std::fpclassify(f)) {
      case FP_NAN:  // quiet NaN keeping the top fraction bits
        return sign | kInf | kQuiet | static_cast<uint16_t>((bits & 0x7FFFFFu) >> (23 - ManBits));
      case FP_INFINITE: return sign | kInf;
      case FP_ZERO: return sign;
      default: break;
    }
    const double a = std::fabs(static_cast<double>(f));  // exact, also for fp32 subnormals
    if (a >= kOverflow) return sign | kInf;
    int e = 0;
    std::frexp(a, &e);                          // a in [2^(e-1), 2^e)
    const int binade = std::max(e - 1, kEmin);  // below kEmin the quantum stays fixed (subnormals)
    // Integer significand in units of the quantum 2^(binade - ManBits);
    // the scaling by a power of two is exact.
    const double q = std::nearbyint(a * pow2(ManBits - binade));
    const double implicit = pow2(ManBits);
    uint32_t biased, frac;
    if (q < implicit) {  // subnormal (or zero after rounding)
      biased = 0;
      frac = static_cast<uint32_t>(q);
    } else if (q < 2 * implicit) {
      biased = static_cast<uint32_t>(binade + kBias);
      frac = static_cast<uint32_t>(q - implicit);
    } else {  // rounded up into the next binade
      biased = static_cast<uint32_t>(binade + 1 + kBias);
      frac = 0;
    }
    return static_cast<uint16_t>(sign | (biased << ManBits) | frac);
  }

  /// Format bits -> fp32 bit pattern (exact).
  static uint32_t decode(uint16_t h) {
    const uint32_t sign = (h & kSign) ? 0x80000000u : 0u;
    const int biased = (h >> ManBits) & ((1 << ExpBits) - 1);
    const uint32_t frac = h & kFracMask;
    if (biased == (1 << ExpBits) - 1) {
      if (frac == 0) return sign | 0x7F800000u;
      return sign | 0x7F800000u | (DecodeQuietsNaN ? 0x00400000u : 0u) | (frac << (23 - ManBits));
    }
    const double mag = biased == 0 ? std::ldexp(static_cast<double>(frac), kEmin - ManBits)
                                   : std::ldexp(static_cast<double>(frac) + std::ldexp(1.0, ManBits),
                                                biased - kBias - ManBits);
    return std::bit_cast<uint32_t>(static_cast<float>(mag)) | sign;
  }
};

using HalfRef = Format<5, 10, /*DecodeQuietsNaN=*/true>;   // as VCVTPH2PS
using BF16Ref = Format<8, 7, /*DecodeQuietsNaN=*/false>;   // plain shift

template <class T>
using RefFor = std::conditional_t<std::is_same_v<T, Half>, HalfRef, BF16Ref>;

// ---------------------------------------------------------------------------
// Helpers.

uint32_t fbits(float f) { return std::bit_cast<uint32_t>(f); }
float bitsf(uint32_t u) { return std::bit_cast<float>(u); }

std::string hex(uint64_t v, int digits) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%0*llX", digits, static_cast<unsigned long long>(v));
  return buf;
}

struct Mismatches {
  uint64_t count = 0;
  uint64_t first = UINT64_MAX;  // lowest mismatching input pattern
  uint32_t got = 0, want = 0;
};

/// Runs `produce(const float* src, T* dst, size_t n)` over every fp32 bit
/// pattern in chunks and compares with `want(uint32_t bits) -> uint16_t`.
template <class T, class Produce, class Want>
Mismatches exhaustive_f32(Produce produce, Want want) {
  constexpr int64_t kChunk = int64_t{1} << 20;
  constexpr int64_t kChunks = (int64_t{1} << 32) / kChunk;
  Mismatches total;
#pragma omp parallel
  {
    std::vector<float> src(kChunk);
    std::vector<T> dst(kChunk);
    Mismatches local;
#pragma omp for schedule(dynamic, 8)
    for (int64_t c = 0; c < kChunks; ++c) {
      const uint64_t base = static_cast<uint64_t>(c) * kChunk;
      for (int64_t i = 0; i < kChunk; ++i) src[i] = bitsf(static_cast<uint32_t>(base + i));
      produce(src.data(), dst.data(), static_cast<size_t>(kChunk));
      for (int64_t i = 0; i < kChunk; ++i) {
        const uint32_t in = static_cast<uint32_t>(base + i);
        const uint16_t w = want(in);
        if (dst[i].bits() == w) continue;
        ++local.count;  // chunks may arrive out of order: keep the lowest input
        if (in < local.first) local.first = in, local.got = dst[i].bits(), local.want = w;
      }
    }
#pragma omp critical
    {
      total.count += local.count;
      if (local.count && local.first < total.first) {
        total.first = local.first;
        total.got = local.got;
        total.want = local.want;
      }
    }
  }
  return total;
}

void expect_no_mismatch(const Mismatches& m) {
  EXPECT_EQ(m.count, 0u) << "first mismatch: input " << hex(m.first, 8) << " got " << hex(m.got, 4)
                         << " want " << hex(m.want, 4);
}

#define AG_SKIP_UNLESS_VECTORIZED(bf16)                                                          \
  if (!vectorized_convert_available(bf16))                                                       \
  AGT_SKIP_HARDWARE() << "CPU lacks the " << ((bf16) ? "AVX512-BF16" : "F16C/AVX-512")                  \
               << " instructions for ConvertPath::Vectorized"

template <class T>
constexpr bool is_bf16 = std::is_same_v<T, BFloat16>;

// ---------------------------------------------------------------------------
// Typed tests shared by Half and BFloat16.

template <class T>
class Float16Test : public ::testing::Test {};
using Float16Types = ::testing::Types<Half, BFloat16>;
class TypeNames {
 public:
  template <class T>
  static std::string GetName(int) {
    return is_bf16<T> ? "BFloat16" : "Half";
  }
};
TYPED_TEST_SUITE(Float16Test, Float16Types, TypeNames);

TYPED_TEST(Float16Test, StorageProperties) {
  using T = TypeParam;
  static_assert(sizeof(T) == 2);
  static_assert(std::is_trivially_copyable_v<T>);
  static_assert(std::is_trivially_default_constructible_v<T>);
  constexpr T v = T::from_bits(0x3C00);
  static_assert(v.bits() == 0x3C00 && v.x == 0x3C00);
  const T one(1.0f);
  EXPECT_EQ(static_cast<float>(one), 1.0f);
  std::ostringstream os;
  os << T(-2.5f) << ' ' << T(0.0f);
  EXPECT_EQ(os.str(), "-2.5 0");
}

TYPED_TEST(Float16Test, ExhaustiveScalarMatchesReference) {
  using T = TypeParam;
  ASSERT_EQ(std::fegetround(), FE_TONEAREST) << "the reference relies on round-to-nearest";
  expect_no_mismatch(exhaustive_f32<T>(
      [](const float* s, T* d, size_t n) {
        for (size_t i = 0; i < n; ++i) d[i] = T(s[i]);
      },
      RefFor<T>::round));
}

TYPED_TEST(Float16Test, ExhaustiveBulkPortableMatchesReference) {
  using T = TypeParam;
  ASSERT_EQ(std::fegetround(), FE_TONEAREST) << "the reference relies on round-to-nearest";
  expect_no_mismatch(exhaustive_f32<T>(
      [](const float* s, T* d, size_t n) { convert(s, d, n, ConvertPath::Portable); }, RefFor<T>::round));
}

TYPED_TEST(Float16Test, ExhaustiveBulkVectorizedMatchesReference) {
  using T = TypeParam;
  AG_SKIP_UNLESS_VECTORIZED(is_bf16<T>);
  ASSERT_EQ(std::fegetround(), FE_TONEAREST) << "the reference relies on round-to-nearest";
  expect_no_mismatch(exhaustive_f32<T>(
      [](const float* s, T* d, size_t n) { convert(s, d, n, ConvertPath::Vectorized); }, RefFor<T>::round));
}

// All 2^16 patterns: decode equals the reference on every path, and
// encode(decode(h)) == h except that NaNs come back quiet.
TYPED_TEST(Float16Test, RoundTripAll16BitPatterns) {
  using T = TypeParam;
  constexpr uint32_t inf = is_bf16<T> ? 0x7F80u : 0x7C00u;
  constexpr uint32_t quiet = is_bf16<T> ? 0x0040u : 0x0200u;
  std::vector<T> all(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = T::from_bits(static_cast<uint16_t>(h));
  std::vector<float> portable(65536), vectorized(65536);
  convert(all.data(), portable.data(), all.size(), ConvertPath::Portable);
  const bool have_vec = vectorized_convert_available(is_bf16<T>);
  if (have_vec) convert(all.data(), vectorized.data(), all.size(), ConvertPath::Vectorized);

  int failures = 0;
  for (uint32_t h = 0; h < 65536 && failures < 10; ++h) {
    const uint32_t want = RefFor<T>::decode(static_cast<uint16_t>(h));
    const float f = static_cast<float>(all[h]);
    const uint32_t got_scalar = fbits(f);
    const uint16_t back = T(f).bits();
    const bool nan = (h & 0x7FFFu) > inf;
    const uint32_t want_back = nan ? (h | quiet) : h;
    const bool ok = got_scalar == want && fbits(portable[h]) == want &&
                    (!have_vec || fbits(vectorized[h]) == want) && back == want_back &&
                    (!nan || std::isnan(f));
    if (!ok) {
      ++failures;
      ADD_FAILURE() << "h=" << hex(h, 4) << " want " << hex(want, 8) << " scalar " << hex(got_scalar, 8)
                    << " portable " << hex(fbits(portable[h]), 8) << " vectorized "
                    << (have_vec ? hex(fbits(vectorized[h]), 8) : "n/a") << " back " << hex(back, 4);
    }
  }
}

// Tails and misalignment: Vectorized == Portable for every length 0..88 at
// element offsets 0..3, and nothing outside [0, n) is written.
TYPED_TEST(Float16Test, VectorizedTailsAndAlignment) {
  using T = TypeParam;
  AG_SKIP_UNLESS_VECTORIZED(is_bf16<T>);
  std::mt19937 rng(12345);
  std::vector<float> src(100);
  for (size_t i = 0; i < src.size(); ++i) {
    const uint32_t r = rng();
    // Mix random patterns (incl. NaN/inf) with fp32 subnormals and values near
    // the fp16 subnormal range, landing in every lane position.
    src[i] = bitsf(i % 3 == 0 ? (r & 0x807FFFFFu) : i % 3 == 1 ? r : (r & 0x83FFFFFFu) | 0x30000000u);
  }
  const T sentinel = T::from_bits(0xA5A5);
  for (size_t off = 0; off < 4; ++off) {
    for (size_t n = 0; n + off + 8 <= src.size(); ++n) {
      std::vector<T> a(n + 8, sentinel), b(n + 8, sentinel);
      convert(src.data() + off, a.data() + 4, n, ConvertPath::Portable);
      convert(src.data() + off, b.data() + 4, n, ConvertPath::Vectorized);
      for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i].bits(), b[i].bits()) << "n=" << n << " off=" << off << " i=" << i;
      std::vector<float> fa(n + 8, -7.0f), fb(n + 8, -7.0f);
      convert(a.data() + 4, fa.data() + 4, n, ConvertPath::Portable);
      convert(b.data() + 4, fb.data() + 4, n, ConvertPath::Vectorized);
      for (size_t i = 0; i < fa.size(); ++i) ASSERT_EQ(fbits(fa[i]), fbits(fb[i])) << "n=" << n << " off=" << off << " i=" << i;
      EXPECT_EQ(fbits(fa[3]), fbits(-7.0f));
      EXPECT_EQ(fbits(fa[n + 4]), fbits(-7.0f));
    }
  }
  convert(static_cast<const float*>(nullptr), static_cast<T*>(nullptr), 0, ConvertPath::Vectorized);
}

// convert_rows widens every row as convert does, on each available path, whatever the
// source rows' spacing (wider than a row, overlapping, or 0), and writes nothing else.
TYPED_TEST(Float16Test, ConvertRowsMatchesConvertPerRow) {
  using T = TypeParam;
  std::mt19937 rng(99);
  std::vector<T> src(600);
  for (auto& v : src) v = T::from_bits(uint16_t(rng()));
  std::vector<ConvertPath> paths{ConvertPath::Portable, ConvertPath::Auto};
  if (vectorized_convert_available(is_bf16<T>)) paths.push_back(ConvertPath::Vectorized);
  for (const ConvertPath path : paths)
    for (const size_t cols : {size_t(1), size_t(15), size_t(16), size_t(33), size_t(64)})
      for (const size_t ld : {size_t(0), cols / 2, cols, cols + 7, size_t(100)}) {
        const size_t rows = 5;
        std::vector<float> got(rows * cols + 2, -7.0f), want(rows * cols, 0.0f);
        convert_rows(src.data() + 3, ld, got.data() + 1, rows, cols, path);
        for (size_t r = 0; r < rows; ++r) convert(src.data() + 3 + r * ld, want.data() + r * cols, cols, ConvertPath::Portable);
        for (size_t i = 0; i < want.size(); ++i)
          ASSERT_EQ(fbits(got[i + 1]), fbits(want[i])) << "path " << int(path) << " cols " << cols << " ld " << ld << " i " << i;
        EXPECT_EQ(fbits(got.front()), fbits(-7.0f));
        EXPECT_EQ(fbits(got.back()), fbits(-7.0f));
      }
  convert_rows(static_cast<const T*>(nullptr), 0, nullptr, 0, 0);
}

TYPED_TEST(Float16Test, AutoEqualsPortable) {
  using T = TypeParam;
  std::vector<float> src(1000);
  std::mt19937 rng(7);
  for (auto& f : src) f = bitsf(rng());
  std::vector<T> a(src.size()), b(src.size());
  convert(src.data(), a.data(), src.size());
  convert(src.data(), b.data(), src.size(), ConvertPath::Portable);
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i].bits(), b[i].bits()) << i;
}

#if AG_TEST_X86
// MXCSR.FTZ/DAZ (set e.g. by -ffast-math startup code) must not change any
// conversion: checked on fp32 subnormals, the fp16 subnormal range and all
// 16-bit patterns.
class MxcsrGuard {
 public:
  explicit MxcsrGuard(unsigned bits) : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | bits); }
  ~MxcsrGuard() { _mm_setcsr(saved_); }

 private:
  unsigned saved_;
};

TYPED_TEST(Float16Test, FtzDazDoNotChangeResults) {
  using T = TypeParam;
  std::vector<float> src;
  for (uint32_t e : {0u, 1u, 100u, 101u, 102u, 103u, 110u, 111u, 112u, 113u, 114u})
    for (uint32_t m = 0; m < (1u << 23); m += 61)
      for (uint32_t s : {0u, 0x80000000u}) src.push_back(bitsf(s | (e << 23) | m));
  std::vector<uint16_t> want(src.size());  // computed before touching MXCSR: the reference uses the FPU
  for (size_t i = 0; i < src.size(); ++i) want[i] = RefFor<T>::round(fbits(src[i]));
  std::vector<T> all16(65536);
  for (uint32_t h = 0; h < 65536; ++h) all16[h] = T::from_bits(static_cast<uint16_t>(h));
  std::vector<uint32_t> want16(65536);
  for (uint32_t h = 0; h < 65536; ++h) want16[h] = RefFor<T>::decode(static_cast<uint16_t>(h));

  std::vector<ConvertPath> paths{ConvertPath::Portable};
  if (vectorized_convert_available(is_bf16<T>)) paths.push_back(ConvertPath::Vectorized);
  for (ConvertPath p : paths) {
    std::vector<T> out(src.size());
    std::vector<float> out16(65536);
    {
      MxcsrGuard guard(0x8040);  // FTZ | DAZ
      convert(src.data(), out.data(), src.size(), p);
      convert(all16.data(), out16.data(), all16.size(), p);
    }
    for (size_t i = 0; i < src.size(); ++i)
      ASSERT_EQ(out[i].bits(), want[i]) << "path " << int(p) << " input " << hex(fbits(src[i]), 8);
    for (uint32_t h = 0; h < 65536; ++h)
      ASSERT_EQ(fbits(out16[h]), want16[h]) << "path " << int(p) << " h=" << hex(h, 4);
  }
}
#endif

// ---------------------------------------------------------------------------
// Named edge cases.

TEST(HalfEdgeCases, FloatToHalf) {
  const struct {
    uint32_t in;
    uint16_t out;
    const char* what;
  } cases[] = {
      {fbits(0.0f), 0x0000, "+0"},
      {fbits(-0.0f), 0x8000, "-0"},
      {fbits(1.0f), 0x3C00, "1"},
      {fbits(-2.0f), 0xC000, "-2"},
      {fbits(65504.0f), 0x7BFF, "max finite"},
      {fbits(65519.99f), 0x7BFF, "just below overflow threshold"},
      {fbits(65520.0f), 0x7C00, "overflow threshold ties to inf"},
      {fbits(-65520.0f), 0xFC00, "negative overflow"},
      {fbits(1e10f), 0x7C00, "large"},
      {0x7F7FFFFF, 0x7C00, "FLT_MAX"},
      {0x7F800000, 0x7C00, "+inf"},
      {0xFF800000, 0xFC00, "-inf"},
      {fbits(0x1p-14f), 0x0400, "smallest normal"},
      {fbits(0x1p-24f), 0x0001, "smallest subnormal"},
      {fbits(0x1p-25f), 0x0000, "half the smallest subnormal ties to even (0)"},
      {fbits(0x1.000002p-25f), 0x0001, "just above 2^-25"},
      {fbits(0x1.8p-24f), 0x0002, "1.5 * 2^-24 ties to even (2)"},
      {fbits(0x1p-26f), 0x0000, "2^-26 underflows"},
      {fbits(0x1.ff8p-15f), 0x03FF, "largest subnormal"},
      {fbits(0x1.ffcp-15f), 0x0400, "tie above largest subnormal rounds up to smallest normal"},
      {fbits(-0x1p-24f), 0x8001, "negative subnormal"},
      {0x00000001, 0x0000, "fp32 denormal"},
      {0x807FFFFF, 0x8000, "negative fp32 denormal"},
      {fbits(1.0f + 0x1p-11f), 0x3C00, "1 + 2^-11 ties to even (down)"},
      {fbits(1.0f + 3 * 0x1p-11f), 0x3C02, "1 + 3*2^-11 ties to even (up)"},
      {fbits(1.0f + 0x1p-11f + 0x1p-23f), 0x3C01, "just above tie"},
      {0x7FC00000, 0x7E00, "quiet NaN"},
      {0x7F800001, 0x7E00, "signalling NaN becomes quiet"},
      {0x7F802000, 0x7E01, "signalling NaN keeps top payload"},
      {0xFFFFFFFF, 0xFFFF, "negative NaN all ones"},
      {0xFF800001, 0xFE00, "negative signalling NaN"},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(Half(bitsf(c.in)).bits(), c.out) << c.what << " in=" << hex(c.in, 8);
    EXPECT_EQ(HalfRef::round(c.in), c.out) << "reference: " << c.what;
    for (ConvertPath p : {ConvertPath::Portable, ConvertPath::Auto}) {
      Half h;
      const float f = bitsf(c.in);
      convert(&f, &h, 1, p);
      EXPECT_EQ(h.bits(), c.out) << c.what << " path " << int(p);
    }
  }
}

TEST(HalfEdgeCases, HalfToFloat) {
  EXPECT_EQ(static_cast<float>(Half::from_bits(0x0001)), 0x1p-24f);
  EXPECT_EQ(static_cast<float>(Half::from_bits(0x03FF)), 0x1.ff8p-15f);
  EXPECT_EQ(static_cast<float>(Half::from_bits(0x0400)), 0x1p-14f);
  EXPECT_EQ(static_cast<float>(Half::from_bits(0x7BFF)), 65504.0f);
  EXPECT_EQ(static_cast<float>(Half::from_bits(0xFC00)), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(fbits(Half::from_bits(0x8000)), 0x80000000u);
  EXPECT_EQ(fbits(Half::from_bits(0x7D00)), 0x7FE00000u) << "sNaN -> quiet fp32 NaN, payload kept";
  EXPECT_EQ(fbits(Half::from_bits(0xFE01)), 0xFFC02000u);
}

TEST(BFloat16EdgeCases, FloatToBFloat16) {
  const struct {
    uint32_t in;
    uint16_t out;
    const char* what;
  } cases[] = {
      {0x3F800000, 0x3F80, "1"},
      {0x3F808000, 0x3F80, "tie rounds to even (down)"},
      {0x3F818000, 0x3F82, "tie rounds to even (up)"},
      {0x3F808001, 0x3F81, "just above tie"},
      {0x3F807FFF, 0x3F80, "just below tie"},
      {0x80000000, 0x8000, "-0"},
      {0x7F7F7FFF, 0x7F7F, "largest value rounding to bf16 max"},
      {0x7F7F8000, 0x7F80, "tie above bf16 max rounds to inf"},
      {0x7F7FFFFF, 0x7F80, "FLT_MAX -> inf"},
      {0xFF7FFFFF, 0xFF80, "-FLT_MAX -> -inf"},
      {0x7F800000, 0x7F80, "+inf"},
      {0x00800000, 0x0080, "smallest fp32 normal"},
      {0x007FFFFF, 0x0080, "largest fp32 denormal rounds up to smallest normal"},
      {0x00008000, 0x0000, "fp32 denormal tie to even (0)"},
      {0x00018000, 0x0002, "fp32 denormal tie to even (2)"},
      {0x00008001, 0x0001, "fp32 denormal -> bf16 subnormal"},
      {0x80010000, 0x8001, "negative fp32 denormal exact"},
      {0x00000001, 0x0000, "tiniest denormal"},
      {0x7FC00000, 0x7FC0, "quiet NaN"},
      {0x7F800001, 0x7FC0, "signalling NaN becomes quiet"},
      {0x7F810000, 0x7FC1, "signalling NaN keeps payload"},
      {0x7FBFFFFF, 0x7FFF, "NaN payload truncated, not rounded"},
      {0xFF800001, 0xFFC0, "negative signalling NaN"},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(BFloat16(bitsf(c.in)).bits(), c.out) << c.what << " in=" << hex(c.in, 8);
    EXPECT_EQ(BF16Ref::round(c.in), c.out) << "reference: " << c.what;
    for (ConvertPath p : {ConvertPath::Portable, ConvertPath::Auto}) {
      BFloat16 b;
      const float f = bitsf(c.in);
      convert(&f, &b, 1, p);
      EXPECT_EQ(b.bits(), c.out) << c.what << " path " << int(p);
    }
  }
  EXPECT_EQ(fbits(BFloat16::from_bits(0x7F81)), 0x7F810000u) << "bf16 -> float keeps sNaN bits";
}

// ---------------------------------------------------------------------------
// ISA-specific fp16 kernels (the 256-bit F16C one is never picked on AVX-512
// machines, so it is exercised explicitly).

#define AG_SKIP_UNLESS_HALF_ISA(isa)                                                       \
  if (!detail::half_isa_available(isa))                                                    \
  AGT_SKIP_HARDWARE() << "CPU lacks " << ((isa) == detail::HalfIsa::Avx512 ? "AVX512-F/BW/VL" : "AVX and F16C") \
                      << " for this float16 kernel"

class HalfIsaTest : public ::testing::TestWithParam<detail::HalfIsa> {};

TEST_P(HalfIsaTest, ExhaustiveMatchesScalar) {
  const detail::HalfIsa isa = GetParam();
  AG_SKIP_UNLESS_HALF_ISA(isa);
  expect_no_mismatch(exhaustive_f32<Half>(
      [isa](const float* s, Half* d, size_t n) { detail::convert_half_isa(s, d, n, isa); },
      [](uint32_t in) { return detail::float_to_half_bits(bitsf(in)); }));
  std::vector<Half> all(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = Half::from_bits(static_cast<uint16_t>(h));
  for (size_t n : {size_t{65536}, size_t{65535}, size_t{7}, size_t{1}}) {  // also exercise tails
    std::vector<float> out(n + 1, -7.0f);
    detail::convert_half_isa(all.data() + (65536 - n), out.data(), n, isa);
    for (size_t i = 0; i < n; ++i)
      ASSERT_EQ(fbits(out[i]), HalfRef::decode(static_cast<uint16_t>(65536 - n + i))) << "i=" << i;
    EXPECT_EQ(out[n], -7.0f);
  }
}

TEST_P(HalfIsaTest, Tails) {
  const detail::HalfIsa isa = GetParam();
  AG_SKIP_UNLESS_HALF_ISA(isa);
  std::vector<float> src(40);
  for (size_t i = 0; i < src.size(); ++i) src[i] = 0.37f * static_cast<float>(i) - 3.0f;
  for (size_t n = 0; n <= 32; ++n) {
    std::vector<Half> out(n + 1, Half::from_bits(0xA5A5));
    detail::convert_half_isa(src.data() + 1, out.data(), n, isa);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i].bits(), Half(src[i + 1]).bits()) << n;
    ASSERT_EQ(out[n].bits(), 0xA5A5) << "wrote past the end, n=" << n;
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, HalfIsaTest,
                         ::testing::Values(detail::HalfIsa::F16C256, detail::HalfIsa::Avx512),
                         [](const auto& info) {
                           return info.param == detail::HalfIsa::Avx512 ? std::string("Avx512")
                                                                         : std::string("F16C256");
                         });

TEST(Convert, UnavailableIsaThrows) {
  float f = 1.0f;
  Half h;
  try {
    detail::convert_half_isa(&f, &h, 1, detail::HalfIsa::None);
    FAIL() << "expected std::runtime_error";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("[convert] ", 0), 0u) << e.what();
  }
  for (bool bf16 : {false, true}) {
    if (vectorized_convert_available(bf16)) continue;
    BFloat16 b;
    try {
      if (bf16) convert(&f, &b, 1, ConvertPath::Vectorized);
      else convert(&f, &h, 1, ConvertPath::Vectorized);
      ADD_FAILURE() << "expected std::runtime_error";
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()).rfind("[convert] ", 0), 0u) << e.what();
    }
  }
}

}  // namespace

// The emulated __half and __nv_bfloat16 round as the GPU does. Checked against an
// independent reference (the nearest entry of a table of every finite 16-bit value, ties to
// the even one, computed in __float128 where every operand and exact result fits) and
// against ampgrad's host conversions (ampgrad/half.h), which the emulator reuses: one
// definition, except for NaN, which the hardware turns into the canonical NaN.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "support/testing.h"

namespace {

using Wide = __float128;

enum class Format { Half, BFloat16 };

/// Every finite non-negative value of a 16-bit format, indexed by its bits.
struct Table {
  std::vector<Wide> value;
  Wide overflow;  // a magnitude from here on rounds to infinity (to nearest)
};

Wide pow2(int e) { return Wide(std::ldexp(1.0L, e)); }

Table make_table(Format f) {
  const int mbits = f == Format::Half ? 10 : 7, bias = f == Format::Half ? 15 : 127;
  const int count = f == Format::Half ? 0x7C00 : 0x7F80;
  Table t;
  for (int b = 0; b < count; ++b) {
    const int e = b >> mbits, m = b & ((1 << mbits) - 1);
    t.value.push_back(e == 0 ? Wide(m) * pow2(1 - bias - mbits) : Wide((1 << mbits) + m) * pow2(e - bias - mbits));
  }
  t.overflow = (t.value.back() + pow2((count >> mbits) - bias)) / 2;  // halfway to the next power of two
  return t;
}

const Table& table(Format f) {
  static const Table half = make_table(Format::Half), bf16 = make_table(Format::BFloat16);
  return f == Format::Half ? half : bf16;
}

enum class Dir { Nearest, TowardZero, Down, Up };

/// x rounded into the format: its bits (x must not be NaN).
uint16_t reference(Format f, Wide x, Dir dir = Dir::Nearest) {
  const Table& t = table(f);
  const bool neg = x < 0;
  const uint16_t sign = neg ? 0x8000 : 0, inf = uint16_t(t.value.size());
  const Wide a = neg ? -x : x;
  const bool away = dir == Dir::Up ? !neg : dir == Dir::Down ? neg : false;
  if (a == Wide(std::numeric_limits<float>::infinity())) return uint16_t(sign | inf);  // exact
  if (a > t.value.back()) {
    if (dir == Dir::Nearest) return uint16_t(sign | (a >= t.overflow ? inf : inf - 1));
    return uint16_t(sign | (away ? inf : inf - 1));
  }
  const size_t hi = size_t(std::lower_bound(t.value.begin(), t.value.end(), a) - t.value.begin());
  if (t.value[hi] == a) return uint16_t(sign | hi);
  const size_t lo = hi - 1;  // t.value[lo] < a < t.value[hi]
  if (dir != Dir::Nearest) return uint16_t(sign | (away ? hi : lo));
  const Wide dl = a - t.value[lo], dh = t.value[hi] - a;
  return uint16_t(sign | (dl < dh ? lo : dh < dl ? hi : (lo % 2 == 0 ? lo : hi)));
}

/// The exact value of a finite 16-bit pattern.
Wide exact(Format f, uint16_t b) {
  const Wide v = table(f).value[b & 0x7FFF];
  return (b & 0x8000) ? -v : v;
}

bool is_nan16(Format f, uint16_t b) {
  return f == Format::Half ? (b & 0x7C00) == 0x7C00 && (b & 0x3FF) : (b & 0x7F80) == 0x7F80 && (b & 0x7F);
}
bool is_finite16(Format f, uint16_t b) { return f == Format::Half ? (b & 0x7C00) != 0x7C00 : (b & 0x7F80) != 0x7F80; }

/// Floats to round: a sweep over all patterns by a prime stride, every value of the format,
/// every exact tie between neighbours and the floats next to it, and the edges.
std::vector<float> floats_to_round(Format f) {
  std::vector<float> v;
  for (uint64_t b = 0; b < (uint64_t(1) << 32); b += 4099) v.push_back(std::bit_cast<float>(uint32_t(b)));
  const Table& t = table(f);
  for (size_t i = 0; i + 1 < t.value.size(); ++i) {
    const float mid = float((t.value[i] + t.value[i + 1]) / 2);  // exact: 9 or 12 bits
    for (float x : {float(t.value[i]), mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e38f)}) {
      v.push_back(x);
      v.push_back(-x);
    }
  }
  for (float x : {float(t.overflow), std::nextafter(float(t.overflow), 0.0f), std::numeric_limits<float>::max(),
                  std::numeric_limits<float>::infinity(), std::numeric_limits<float>::denorm_min(), 0.0f}) {
    v.push_back(x);
    v.push_back(-x);
  }
  return v;
}

uint16_t bits(__half h) { return __half_as_ushort(h); }
uint16_t bits(__nv_bfloat16 h) { return __bfloat16_as_ushort(h); }

// ---- 16 bits to float ---------------------------------------------------------------------------------

TEST(CudaEmulatorHalf, ToFloatIsExactOnAll16BitPatterns) {
  for (uint32_t i = 0; i < 0x10000; ++i) {
    const uint16_t b = uint16_t(i);
    const float h = __half2float(__ushort_as_half(b));
    if (is_nan16(Format::Half, b)) {
      ASSERT_EQ(std::bit_cast<uint32_t>(h), 0x7FFFFFFFu) << "the canonical NaN, for " << std::hex << i;
      ASSERT_TRUE(std::isnan(float(ag::Half::from_bits(b))));
    } else {
      if (is_finite16(Format::Half, b)) ASSERT_TRUE(Wide(h) == exact(Format::Half, b)) << std::hex << i;
      ASSERT_EQ(std::bit_cast<uint32_t>(h), std::bit_cast<uint32_t>(float(ag::Half::from_bits(b)))) << std::hex << i;
    }
    // bfloat16 -> float moves the bits, a NaN's payload too (CUDA's __bfloat162float)
    const float bf = __bfloat162float(__ushort_as_bfloat16(b));
    ASSERT_EQ(std::bit_cast<uint32_t>(bf), i << 16) << std::hex << i;
    if (is_finite16(Format::BFloat16, b)) ASSERT_TRUE(Wide(bf) == exact(Format::BFloat16, b)) << std::hex << i;
    ASSERT_EQ(std::bit_cast<uint32_t>(bf), std::bit_cast<uint32_t>(float(ag::BFloat16::from_bits(b)))) << std::hex << i;
  }
}

// ---- float to 16 bits -----------------------------------------------------------------------------------

TEST(CudaEmulatorHalf, FloatToHalfRoundsToNearestEven) {
  for (float f : floats_to_round(Format::Half)) {
    const uint16_t got = bits(__float2half_rn(f));
    if (std::isnan(f)) {
      ASSERT_EQ(got, 0x7FFF) << "the canonical NaN";
      continue;
    }
    const uint16_t want = std::signbit(f) && f == 0 ? 0x8000 : reference(Format::Half, Wide(f));
    ASSERT_EQ(got, want) << f;
    ASSERT_EQ(got, ag::Half(f).bits()) << "the host's conversion, for " << f;
    ASSERT_EQ(bits(__half(f)), got) << "the conversion of __half(float)";
  }
}

TEST(CudaEmulatorHalf, FloatToBFloat16RoundsToNearestEven) {
  for (float f : floats_to_round(Format::BFloat16)) {
    const uint16_t got = bits(__float2bfloat16_rn(f));
    if (std::isnan(f)) {
      ASSERT_EQ(got, 0x7FFF) << "the canonical NaN";
      continue;
    }
    const uint16_t want = std::signbit(f) && f == 0 ? 0x8000 : reference(Format::BFloat16, Wide(f));
    ASSERT_EQ(got, want) << f;
    ASSERT_EQ(got, ag::BFloat16(f).bits()) << "the host's conversion, for " << f;
  }
}

TEST(CudaEmulatorHalf, DirectedRoundingsFromFloat) {
  std::mt19937 gen(3);
  std::vector<float> fs = floats_to_round(Format::Half);
  std::shuffle(fs.begin(), fs.end(), gen);
  fs.resize(200000);
  for (float f : fs) {
    if (std::isnan(f) || f == 0) continue;
    ASSERT_EQ(bits(__float2half_rz(f)), reference(Format::Half, Wide(f), Dir::TowardZero)) << f;
    ASSERT_EQ(bits(__float2half_rd(f)), reference(Format::Half, Wide(f), Dir::Down)) << f;
    ASSERT_EQ(bits(__float2half_ru(f)), reference(Format::Half, Wide(f), Dir::Up)) << f;
    ASSERT_EQ(bits(__float2bfloat16_rz(f)), reference(Format::BFloat16, Wide(f), Dir::TowardZero)) << f;
    ASSERT_EQ(bits(__float2bfloat16_rd(f)), reference(Format::BFloat16, Wide(f), Dir::Down)) << f;
    ASSERT_EQ(bits(__float2bfloat16_ru(f)), reference(Format::BFloat16, Wide(f), Dir::Up)) << f;
  }
}

// A double just above a tie rounds up: rounding it to float first would land on the tie
// and go to the even neighbour (double rounding).
TEST(CudaEmulatorHalf, DoubleRoundsOnce) {
  for (Format f : {Format::Half, Format::BFloat16}) {
    const Table& t = table(f);
    int checked = 0;
    for (size_t i = 1; i + 1 < t.value.size(); i += 3) {
      const double mid = double((t.value[i] + t.value[i + 1]) / 2);
      for (double d : {mid, std::nextafter(mid, 0.0), std::nextafter(mid, 1e300), -std::nextafter(mid, 1e300)}) {
        const uint16_t got = f == Format::Half ? bits(__double2half(d)) : bits(__double2bfloat16(d));
        ASSERT_EQ(got, reference(f, Wide(d))) << (f == Format::Half ? "half " : "bfloat16 ") << d;
        ++checked;
      }
    }
    EXPECT_GT(checked, 10000);
  }
  EXPECT_EQ(bits(__double2half(1e300)), 0x7C00);
  EXPECT_EQ(bits(__double2bfloat16(-1e300)), 0xFF80);
  EXPECT_EQ(bits(__double2half(std::nan(""))), 0x7FFF);
}

// ---- arithmetic -------------------------------------------------------------------------------------------

// Random finite values spread over the format's exponents.
std::vector<uint16_t> random_values(Format f, int n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> pick(0, 0xFFFF);
  std::vector<uint16_t> v;
  while (int(v.size()) < n) {
    const uint16_t b = uint16_t(pick(gen));
    // bfloat16: exponents within 2^+-30, so that every exact result fits a __float128
    if (!is_finite16(f, b)) continue;
    if (f == Format::BFloat16 && (((b >> 7) & 0xFF) < 97 || ((b >> 7) & 0xFF) > 157)) continue;
    v.push_back(b);
  }
  return v;
}

template <class H>
void check_arithmetic(Format f, H (*from_bits)(unsigned short)) {
  const std::vector<uint16_t> a = random_values(f, 20000, 4), b = random_values(f, 20000, 5),
                              c = random_values(f, 20000, 6);
  for (size_t i = 0; i < a.size(); ++i) {
    const H x = from_bits(a[i]), y = from_bits(b[i]), z = from_bits(c[i]);
    const Wide ex = exact(f, a[i]), ey = exact(f, b[i]), ez = exact(f, c[i]);
    auto check = [&](H got, Wide want, const char* op) {
      if (want == 0) return;  // the sign of an exact zero is IEEE's, not the table's
      ASSERT_EQ(bits(got), reference(f, want)) << op << " " << std::hex << a[i] << " " << b[i] << " " << c[i];
    };
    check(__hadd(x, y), ex + ey, "add");
    check(__hsub(x, y), ex - ey, "sub");
    check(__hmul(x, y), ex * ey, "mul");
    check(__hfma(x, y, z), ex * ey + ez, "fma");
    check(x + y, ex + ey, "operator+");
    check(x * y, ex * ey, "operator*");
  }
}

TEST(CudaEmulatorHalf, ArithmeticRoundsOnce) {
  check_arithmetic<__half>(Format::Half, __ushort_as_half);
  check_arithmetic<__nv_bfloat16>(Format::BFloat16, __ushort_as_bfloat16);
}

TEST(CudaEmulatorHalf, IntegerConversions) {
  const __half h = __float2half(-2.75f);
  EXPECT_EQ(__half2int_rz(h), -2);
  EXPECT_EQ(__half2int_rd(h), -3);
  EXPECT_EQ(__half2int_ru(h), -2);
  EXPECT_EQ(__half2int_rn(h), -3);
  EXPECT_EQ(__half2int_rz(__ushort_as_half(0x7E00)), 0) << "NaN gives 0";
  EXPECT_EQ(__half2short_rz(__float2half(65504.0f)), 32767) << "saturates";
  EXPECT_EQ(__half2ushort_rz(__float2half(-1.0f)), 0) << "saturates";
  EXPECT_EQ(bits(__int2half_rn(65519)), 0x7BFF);
  EXPECT_EQ(bits(__int2half_rn(65520)), 0x7C00) << "the tie goes to the even infinity";
  EXPECT_EQ(bits(__ll2half_rn(-(1LL << 40))), 0xFC00);
  EXPECT_EQ(bits(__int2bfloat16_rn(257)), 0x4380) << "257 ties between 256 and 258: the even 256";
  EXPECT_EQ(bits(__int2bfloat16_rn(259)), 0x4382) << "259 ties between 258 and 260: the even 260";
  EXPECT_EQ(bits(__ll2bfloat16_rn((1LL << 62) + (1LL << 54))), 0x5E80) << "a tie below, to the even 2^62";
  EXPECT_EQ(bits(__ll2bfloat16_rn((1LL << 62) + (1LL << 54) + 1)), 0x5E81) << "just above the tie";
  EXPECT_EQ(__bfloat162int_rz(__float2bfloat16(3e38f)), std::numeric_limits<int>::max());
}

}  // namespace

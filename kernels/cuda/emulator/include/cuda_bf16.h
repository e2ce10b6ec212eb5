// The emulated cuda_bf16.h: __nv_bfloat16 and __nv_bfloat162 with CUDA's names,
// conversions and arithmetic, rounded as the GPU rounds (emu/fp16.h: ampgrad's own bfloat16
// conversion, the hardware's canonical NaN from float, one rounding for every wider
// operation; bfloat16 -> float moves the bits, as CUDA's __bfloat162float does).
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>

#include "emu/fp16.h"
#include "emu/types.h"

struct __nv_bfloat16_raw {
  unsigned short x;
};

/// bfloat16 (the upper half of a float32), stored as its bits in `__x` (as CUDA's). Converts implicitly to and from
/// float (round to nearest even) and from the integer types; arithmetic rounds once.
struct __nv_bfloat16 {
  __nv_bfloat16() = default;
  constexpr __nv_bfloat16(const __nv_bfloat16_raw& r) : __x(r.x) {}
  __nv_bfloat16(float v) : __x(::ampgrad::emu::fp::from_float_rn(kFormat, v)) {}
  __nv_bfloat16(double v) : __x(::ampgrad::emu::fp::from_double_rn(kFormat, v)) {}
  __nv_bfloat16(short v) : __x(::ampgrad::emu::fp::from_int64_rn(kFormat, v)) {}
  __nv_bfloat16(unsigned short v) : __x(::ampgrad::emu::fp::from_int64_rn(kFormat, v)) {}
  __nv_bfloat16(int v) : __x(::ampgrad::emu::fp::from_int64_rn(kFormat, v)) {}
  __nv_bfloat16(unsigned int v) : __x(::ampgrad::emu::fp::from_int64_rn(kFormat, v)) {}
  __nv_bfloat16(long v) : __x(::ampgrad::emu::fp::from_int64_rn(kFormat, v)) {}
  __nv_bfloat16(unsigned long v) : __x(::ampgrad::emu::fp::from_uint64_rn(kFormat, v)) {}
  __nv_bfloat16(long long v) : __x(::ampgrad::emu::fp::from_int64_rn(kFormat, v)) {}
  __nv_bfloat16(unsigned long long v) : __x(::ampgrad::emu::fp::from_uint64_rn(kFormat, v)) {}
  __nv_bfloat16& operator=(const __nv_bfloat16_raw& r) {
    __x = r.x;
    return *this;
  }
  constexpr operator __nv_bfloat16_raw() const { return __nv_bfloat16_raw{__x}; }
  operator float() const { return ::ampgrad::emu::fp::to_float(kFormat, __x); }

  static constexpr ::ampgrad::emu::fp::Format kFormat = ::ampgrad::emu::fp::Format::BFloat16;
  unsigned short __x;
};

struct alignas(4) __nv_bfloat162 {
  __nv_bfloat16 x, y;
};

namespace ampgrad::emu::fp {
inline __nv_bfloat16 make_bf16(uint16_t b) { return __nv_bfloat16(__nv_bfloat16_raw{b}); }
inline double wide(__nv_bfloat16 h) { return double(float(h)); }
}  // namespace ampgrad::emu::fp

// ---- conversions ---------------------------------------------------------------------------------
inline __nv_bfloat16 __float2bfloat16(float a) { return __nv_bfloat16(a); }
inline __nv_bfloat16 __float2bfloat16_rn(float a) { return __nv_bfloat16(a); }
inline __nv_bfloat16 __float2bfloat16_rz(float a) {
  using namespace ampgrad::emu::fp;
  return make_bf16(from_float(Format::BFloat16, a, Rounding::TowardZero));
}
inline __nv_bfloat16 __float2bfloat16_rd(float a) {
  using namespace ampgrad::emu::fp;
  return make_bf16(from_float(Format::BFloat16, a, Rounding::Down));
}
inline __nv_bfloat16 __float2bfloat16_ru(float a) {
  using namespace ampgrad::emu::fp;
  return make_bf16(from_float(Format::BFloat16, a, Rounding::Up));
}
inline float __bfloat162float(__nv_bfloat16 a) { return float(a); }
inline __nv_bfloat16 __double2bfloat16(double a) { return __nv_bfloat16(a); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short b) { return ampgrad::emu::fp::make_bf16(b); }
inline short __bfloat16_as_short(__nv_bfloat16 h) { return short(h.__x); }
inline __nv_bfloat16 __short_as_bfloat16(short b) { return ampgrad::emu::fp::make_bf16(uint16_t(b)); }

#define AMPGRAD_EMU_BF16_INT(NAME, I)                                                                              \
  inline __nv_bfloat16 __##NAME##2bfloat16_rn(I v) { return __nv_bfloat16(v); }                                    \
  inline I __bfloat162##NAME##_rn(__nv_bfloat16 h) {                                                               \
    return ampgrad::emu::fp::to_integer<I>(__nv_bfloat16::kFormat, h.__x, ampgrad::emu::fp::Rounding::Nearest);    \
  }                                                                                                                \
  inline I __bfloat162##NAME##_rz(__nv_bfloat16 h) {                                                               \
    return ampgrad::emu::fp::to_integer<I>(__nv_bfloat16::kFormat, h.__x, ampgrad::emu::fp::Rounding::TowardZero); \
  }                                                                                                                \
  inline I __bfloat162##NAME##_rd(__nv_bfloat16 h) {                                                               \
    return ampgrad::emu::fp::to_integer<I>(__nv_bfloat16::kFormat, h.__x, ampgrad::emu::fp::Rounding::Down);       \
  }                                                                                                                \
  inline I __bfloat162##NAME##_ru(__nv_bfloat16 h) {                                                               \
    return ampgrad::emu::fp::to_integer<I>(__nv_bfloat16::kFormat, h.__x, ampgrad::emu::fp::Rounding::Up);         \
  }
AMPGRAD_EMU_BF16_INT(short, short)
AMPGRAD_EMU_BF16_INT(ushort, unsigned short)
AMPGRAD_EMU_BF16_INT(int, int)
AMPGRAD_EMU_BF16_INT(uint, unsigned int)
AMPGRAD_EMU_BF16_INT(ll, long long)
AMPGRAD_EMU_BF16_INT(ull, unsigned long long)
#undef AMPGRAD_EMU_BF16_INT

// ---- arithmetic and comparisons (each rounds once) ---------------------------------------------------
inline __nv_bfloat16 __hadd(__nv_bfloat16 a, __nv_bfloat16 b) {
  using namespace ampgrad::emu::fp;
  double e;
  const double s = two_sum(wide(a), wide(b), e);
  return make_bf16(from_double_rn(Format::BFloat16, s, e));
}
inline __nv_bfloat16 __hsub(__nv_bfloat16 a, __nv_bfloat16 b) {
  using namespace ampgrad::emu::fp;
  double e;
  const double s = two_sum(wide(a), -wide(b), e);
  return make_bf16(from_double_rn(Format::BFloat16, s, e));
}
/// Products of two 8-bit significands are exact in a double.
inline __nv_bfloat16 __hmul(__nv_bfloat16 a, __nv_bfloat16 b) {
  using namespace ampgrad::emu::fp;
  return make_bf16(from_double_rn(Format::BFloat16, wide(a) * wide(b)));
}
/// A quotient of 8-bit significands never rounds onto a bfloat16 midpoint in a double.
inline __nv_bfloat16 __hdiv(__nv_bfloat16 a, __nv_bfloat16 b) {
  using namespace ampgrad::emu::fp;
  return make_bf16(from_double_rn(Format::BFloat16, wide(a) / wide(b)));
}
inline __nv_bfloat16 __hfma(__nv_bfloat16 a, __nv_bfloat16 b, __nv_bfloat16 c) {
  using namespace ampgrad::emu::fp;
  double e;
  const double s = two_sum(wide(a) * wide(b), wide(c), e);
  return make_bf16(from_double_rn(Format::BFloat16, s, e));
}
inline __nv_bfloat16 __hneg(__nv_bfloat16 a) { return ampgrad::emu::fp::make_bf16(uint16_t(a.__x ^ 0x8000u)); }
inline __nv_bfloat16 __habs(__nv_bfloat16 a) { return ampgrad::emu::fp::make_bf16(uint16_t(a.__x & 0x7FFFu)); }
inline bool __hisnan(__nv_bfloat16 a) { return ampgrad::emu::fp::is_nan(__nv_bfloat16::kFormat, a.__x); }
inline int __hisinf(__nv_bfloat16 a) { return (a.__x & 0x7FFFu) == 0x7F80u ? ((a.__x & 0x8000u) ? -1 : 1) : 0; }
inline bool __heq(__nv_bfloat16 a, __nv_bfloat16 b) { return float(a) == float(b); }
inline bool __hne(__nv_bfloat16 a, __nv_bfloat16 b) { return float(a) < float(b) || float(a) > float(b); }
inline bool __hlt(__nv_bfloat16 a, __nv_bfloat16 b) { return float(a) < float(b); }
inline bool __hle(__nv_bfloat16 a, __nv_bfloat16 b) { return float(a) <= float(b); }
inline bool __hgt(__nv_bfloat16 a, __nv_bfloat16 b) { return float(a) > float(b); }
inline bool __hge(__nv_bfloat16 a, __nv_bfloat16 b) { return float(a) >= float(b); }
inline bool __hequ(__nv_bfloat16 a, __nv_bfloat16 b) { return !(float(a) < float(b) || float(a) > float(b)); }
inline bool __hneu(__nv_bfloat16 a, __nv_bfloat16 b) { return float(a) != float(b); }
inline bool __hltu(__nv_bfloat16 a, __nv_bfloat16 b) { return !(float(a) >= float(b)); }
inline bool __hleu(__nv_bfloat16 a, __nv_bfloat16 b) { return !(float(a) > float(b)); }
inline bool __hgtu(__nv_bfloat16 a, __nv_bfloat16 b) { return !(float(a) <= float(b)); }
inline bool __hgeu(__nv_bfloat16 a, __nv_bfloat16 b) { return !(float(a) < float(b)); }
/// The larger (smaller) value; one NaN operand gives the other, two give the canonical NaN.
inline __nv_bfloat16 __hmax(__nv_bfloat16 a, __nv_bfloat16 b) {
  if (__hisnan(a) && __hisnan(b)) return ampgrad::emu::fp::make_bf16(ampgrad::emu::fp::kCanonicalNaN16);
  return __hisnan(a) ? b : __hisnan(b) ? a : (float(b) > float(a) ? b : a);
}
inline __nv_bfloat16 __hmin(__nv_bfloat16 a, __nv_bfloat16 b) {
  if (__hisnan(a) && __hisnan(b)) return ampgrad::emu::fp::make_bf16(ampgrad::emu::fp::kCanonicalNaN16);
  return __hisnan(a) ? b : __hisnan(b) ? a : (float(b) < float(a) ? b : a);
}
/// max / min that propagate NaN (the canonical NaN).
inline __nv_bfloat16 __hmax_nan(__nv_bfloat16 a, __nv_bfloat16 b) {
  return (__hisnan(a) || __hisnan(b)) ? ampgrad::emu::fp::make_bf16(ampgrad::emu::fp::kCanonicalNaN16) : __hmax(a, b);
}
inline __nv_bfloat16 __hmin_nan(__nv_bfloat16 a, __nv_bfloat16 b) {
  return (__hisnan(a) || __hisnan(b)) ? ampgrad::emu::fp::make_bf16(ampgrad::emu::fp::kCanonicalNaN16) : __hmin(a, b);
}
inline __nv_bfloat16 hsqrt(__nv_bfloat16 a) {
  return ampgrad::emu::fp::make_bf16(
      ampgrad::emu::fp::from_double_rn(__nv_bfloat16::kFormat, std::sqrt(ampgrad::emu::fp::wide(a))));
}
inline __nv_bfloat16 hrcp(__nv_bfloat16 a) { return __hdiv(__nv_bfloat16(1.0f), a); }
inline __nv_bfloat16 hexp(__nv_bfloat16 a) { return __nv_bfloat16(std::exp(float(a))); }
inline __nv_bfloat16 hlog(__nv_bfloat16 a) { return __nv_bfloat16(std::log(float(a))); }

inline __nv_bfloat16 operator+(const __nv_bfloat16& a, const __nv_bfloat16& b) { return __hadd(a, b); }
inline __nv_bfloat16 operator-(const __nv_bfloat16& a, const __nv_bfloat16& b) { return __hsub(a, b); }
inline __nv_bfloat16 operator*(const __nv_bfloat16& a, const __nv_bfloat16& b) { return __hmul(a, b); }
inline __nv_bfloat16 operator/(const __nv_bfloat16& a, const __nv_bfloat16& b) { return __hdiv(a, b); }
inline __nv_bfloat16& operator+=(__nv_bfloat16& a, const __nv_bfloat16& b) { return a = __hadd(a, b); }
inline __nv_bfloat16& operator-=(__nv_bfloat16& a, const __nv_bfloat16& b) { return a = __hsub(a, b); }
inline __nv_bfloat16& operator*=(__nv_bfloat16& a, const __nv_bfloat16& b) { return a = __hmul(a, b); }
inline __nv_bfloat16& operator/=(__nv_bfloat16& a, const __nv_bfloat16& b) { return a = __hdiv(a, b); }
inline __nv_bfloat16 operator-(const __nv_bfloat16& a) { return __hneg(a); }
inline __nv_bfloat16 operator+(const __nv_bfloat16& a) { return a; }
inline bool operator==(const __nv_bfloat16& a, const __nv_bfloat16& b) { return __heq(a, b); }
inline bool operator!=(const __nv_bfloat16& a, const __nv_bfloat16& b) { return __hneu(a, b); }
inline bool operator<(const __nv_bfloat16& a, const __nv_bfloat16& b) { return __hlt(a, b); }
inline bool operator<=(const __nv_bfloat16& a, const __nv_bfloat16& b) { return __hle(a, b); }
inline bool operator>(const __nv_bfloat16& a, const __nv_bfloat16& b) { return __hgt(a, b); }
inline bool operator>=(const __nv_bfloat16& a, const __nv_bfloat16& b) { return __hge(a, b); }

// ---- __nv_bfloat162 -------------------------------------------------------------------------------------
inline __nv_bfloat162 __halves2bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) { return {a, b}; }
inline __nv_bfloat162 __bfloat162bfloat162(__nv_bfloat16 a) { return {a, a}; }
inline __nv_bfloat162 __float2bfloat162_rn(float a) { return {__nv_bfloat16(a), __nv_bfloat16(a)}; }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {__nv_bfloat16(a), __nv_bfloat16(b)}; }
inline float2 __bfloat1622float2(__nv_bfloat162 a) { return {float(a.x), float(a.y)}; }
inline __nv_bfloat162 __float22bfloat162_rn(float2 a) { return {__nv_bfloat16(a.x), __nv_bfloat16(a.y)}; }
inline __nv_bfloat16 __low2bfloat16(__nv_bfloat162 a) { return a.x; }
inline __nv_bfloat16 __high2bfloat16(__nv_bfloat162 a) { return a.y; }
inline float __low2float(__nv_bfloat162 a) { return float(a.x); }
inline float __high2float(__nv_bfloat162 a) { return float(a.y); }
inline __nv_bfloat162 __lows2bfloat162(__nv_bfloat162 a, __nv_bfloat162 b) { return {a.x, b.x}; }
inline __nv_bfloat162 __highs2bfloat162(__nv_bfloat162 a, __nv_bfloat162 b) { return {a.y, b.y}; }
inline __nv_bfloat162 __hadd2(__nv_bfloat162 a, __nv_bfloat162 b) { return {__hadd(a.x, b.x), __hadd(a.y, b.y)}; }
inline __nv_bfloat162 __hsub2(__nv_bfloat162 a, __nv_bfloat162 b) { return {__hsub(a.x, b.x), __hsub(a.y, b.y)}; }
inline __nv_bfloat162 __hmul2(__nv_bfloat162 a, __nv_bfloat162 b) { return {__hmul(a.x, b.x), __hmul(a.y, b.y)}; }
inline __nv_bfloat162 __h2div(__nv_bfloat162 a, __nv_bfloat162 b) { return {__hdiv(a.x, b.x), __hdiv(a.y, b.y)}; }
inline __nv_bfloat162 __hfma2(__nv_bfloat162 a, __nv_bfloat162 b, __nv_bfloat162 c) {
  return {__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y)};
}
inline __nv_bfloat162 __hneg2(__nv_bfloat162 a) { return {__hneg(a.x), __hneg(a.y)}; }
inline __nv_bfloat162 __habs2(__nv_bfloat162 a) { return {__habs(a.x), __habs(a.y)}; }
inline __nv_bfloat162 __hmax2(__nv_bfloat162 a, __nv_bfloat162 b) { return {__hmax(a.x, b.x), __hmax(a.y, b.y)}; }
inline __nv_bfloat162 __hmin2(__nv_bfloat162 a, __nv_bfloat162 b) { return {__hmin(a.x, b.x), __hmin(a.y, b.y)}; }

/// atomicAdd on a bfloat16 (sm_80 and later): the sum rounded once, by compare and swap.
inline __nv_bfloat16 atomicAdd(__nv_bfloat16* p, __nv_bfloat16 v) {
  std::atomic_ref<unsigned short> a(p->__x);
  unsigned short old = a.load();
  while (!a.compare_exchange_weak(old, __hadd(__ushort_as_bfloat16(old), v).__x)) {
  }
  return __ushort_as_bfloat16(old);
}
